"""boot.cmdline: the lint, and every other check's boot-time fix shown as pending a reboot."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.boot_cmdline import BootCmdline, lint
from auditor.checks.cpu_cstates import CpuCstates
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.policy import load_policy
from auditor.runner import audit
from tests.support.fixkit import copy_tree, needs_root, run, write_scripts
from tests.support.hostgen import HostSpec, build_host
from tests.support.hostgen.nvidia import DriverSpec, build_driver_host


def findings(root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in BootCmdline().evaluate(DirectoryHost(str(root)))}


@pytest.mark.parametrize(("tokens", "line", "found"), [
    (["quiet", "iommu=pt"], "vanilla", []),
    (["amd_iommu=pt"], "vanilla", [("amd_iommu=pt", ("iommu=pt",))]),
    (["iommu=pt", "amd_iommu=pt"], "vanilla", [("amd_iommu=pt", ())]),
    (["pcie_acs_override=downstream,multifunction"], "ubuntu-generic",
     [("pcie_acs_override=downstream,multifunction", ())]),
    (["pcie_acs_override=downstream"], "pve", []),
    (["console=ttyS0,115200n8spectre_v2=off"], "vanilla",
     [("console=ttyS0,115200n8spectre_v2=off", ("console=ttyS0,115200n8", "spectre_v2=off"))]),
    (["pci=noaer,disable_acs_redir=0000:40:01.1", "pci=disable_acs_redir=0000:c0:01.1"],
     "vanilla",
     [("pci=noaer,disable_acs_redir=0000:40:01.1", ("pci=noaer",)),
      ("pci=disable_acs_redir=0000:c0:01.1",
       ("pci=disable_acs_redir=0000:40:01.1;0000:c0:01.1",))]),
    (["pci=noaer", "pci=realloc", "root=UUID=a-b", "rd.lvm.lv=rl/root"], "vanilla", []),
    (["iommu=off", "intel_iommu=on"], "vanilla", [("iommu=off", None)]),
])
def test_lint(tokens: list[str], line: str, found: list[tuple[str, object]]) -> None:
    assert [(p.token, p.replacement) for p in lint(tokens, line)] == found


@needs_root
def test_a_c_state_fix_is_pending_a_reboot_not_fixed(tmp_path: Path) -> None:
    """cpu.cstates writes processor.max_cstate=1 to /etc/kernel/cmdline: boot.cmdline says
    it waits for a reboot, naming the file, until /proc/cmdline has it."""
    spec = HostSpec(cpus=8, bad_governor=False, numa_balancing=False, old_kernel=False,
                    low_mrrs=False, stale_lxc_major=False)
    root = build_host(spec).write_dir(tmp_path / "root")
    assert {f.status for f in findings(root).values()} == {Status.PASS}
    host = DirectoryHost(str(root))
    checks = [CpuCstates]
    report = audit(host, checks, load_policy(checks))
    plan = build_fix(host, report, checks, load_policy(checks))
    assert plan.reboot
    fix, _ = write_scripts(plan, tmp_path)
    copy = copy_tree(root, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    after = findings(copy)
    pending = after["cmdline"]
    assert pending.status is Status.WARN
    assert pending.message.startswith("reboot pending")
    assert "processor.max_cstate=1 (/etc/kernel/cmdline:1)" in pending.message
    assert dict(pending.evidence)["regenerate"] == "proxmox-boot-tool refresh"
    # Booted with it: nothing pending.
    (copy / "proc/cmdline").write_text((copy / "proc/cmdline").read_text().strip()
                                       + " processor.max_cstate=1\n")
    assert findings(copy)["cmdline"].status is Status.PASS


@needs_root
def test_the_glued_token_fix_splits_it_and_asks_for_update_grub(tmp_path: Path) -> None:
    spec = DriverSpec(configured=("quiet", "console=ttyS0,115200n8spectre_v2=off"))
    root = build_driver_host(spec).write_dir(tmp_path / "root")
    before = findings(root)
    assert before["tokens"].status is Status.WARN and before["cmdline"].status is Status.PASS
    host = DirectoryHost(str(root))
    report = audit(host, [BootCmdline], load_policy([BootCmdline]))
    plan = build_fix(host, report, [BootCmdline], load_policy([BootCmdline]))
    fix, _ = write_scripts(plan, tmp_path)
    assert "then, on the booted system, run update-grub" in fix.read_text()
    copy = copy_tree(root, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet console=ttyS0,115200n8 spectre_v2=off"' in (
        copy / "etc/default/grub").read_text()
    after = findings(copy)
    assert after["tokens"].status is Status.PASS
    assert after["cmdline"].status is Status.WARN
    assert "spectre_v2=off (/etc/default/grub:5)" in after["cmdline"].message
    assert "grub.cfg was not regenerated" in after["cmdline"].message


def test_a_hostile_configuration_is_read_not_run(tmp_path: Path) -> None:
    spec = DriverSpec(grub_d={"99-evil.cfg": 'GRUB_CMDLINE_LINUX="$(touch /tmp/pwned-grub)"\n'
                              'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} '
                              '`id` x=$(id)"\n' + "A=" + "$" * 10000 + "\n"})
    root = build_driver_host(spec).write_dir(tmp_path / "root")
    found = findings(root)
    assert not Path("/tmp/pwned-grub").exists()
    assert found["cmdline"].status is Status.PASS
    assert "/etc/default/grub.d/99-evil.cfg:1" in dict(found["cmdline"].evidence)["unexpanded"]
