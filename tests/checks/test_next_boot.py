"""One view of the next boot (issue 27, rule 4): the command line and the sysctls the next boot
applies are computed once (checks/lib/bootloader.py ``next_boot``, checks/lib/sysctl.py) and
every check that judges them agrees with boot.cmdline about what is pending a reboot; no fix
writes a token or a sysctl already pending.

On the generated PCIe box whose loader is configured with tokens the running kernel was not
booted with (hostgen/platforms.py ``build_next_boot``): GRUB with a grub.d drop-in, a Rocky 9
host whose newer kernel's BLS entry carries them (a per-kernel line: the running kernel's
entry and the stale /etc/default/grub say otherwise), and proxmox-boot-tool's
/etc/kernel/cmdline beside a GRUB file left from before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.check import CheckClass
from auditor.checks.boot_cmdline import BootCmdline
from auditor.checks.cpu_cstates import CpuCstates
from auditor.checks.cpu_isolation import CpuIsolation
from auditor.checks.iommu_mode import IommuMode
from auditor.checks.lib import bootloader, sysctl
from auditor.checks.numa_balancing import NumaBalancing
from auditor.checks.pcie_acs import PcieAcs
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.policy import load_policy
from auditor.remediations.boot import boot_remedy
from auditor.remedy import AppendLine, FixContext, ReplaceLine, SetValue, WriteFile
from auditor.runner import audit
from tests.support.hostgen.platforms import (
    BOOTED_TOKENS,
    PENDING_TOKENS,
    NextBootSpec,
    build_next_boot,
)

CHECKS: tuple[CheckClass, ...] = (BootCmdline, IommuMode, PcieAcs, CpuCstates, CpuIsolation,
                                  NumaBalancing)
LOADERS = {"grub": "grub", "bls": "bls", "systemd-boot": "proxmox-boot-tool"}


def _host(tmp_path: Path, spec: NextBootSpec) -> DirectoryHost:
    return DirectoryHost(str(build_next_boot(spec).write_dir(tmp_path / spec.boot)))


def _findings(host: DirectoryHost) -> dict[str, list[Finding]]:
    return {c.id: list(c().evaluate(host)) for c in CHECKS}


@pytest.mark.parametrize("boot", sorted(LOADERS))
def test_every_check_reads_the_same_next_boot_and_agrees_with_boot_cmdline(
        tmp_path: Path, boot: str) -> None:
    host = _host(tmp_path, NextBootSpec(boot=boot))
    found = _findings(host)
    [line] = [f for f in found["boot.cmdline"] if f.subject == "cmdline"]
    ev = dict(line.evidence)
    pending, dropped = ev["pending"].split(), ev["dropped"].split()
    assert set(PENDING_TOKENS) <= set(pending)
    assert {"numa_balancing=disable", "amd_iommu=pt"} <= set(dropped)
    release, loader = ev["next_boot_release"], ev["next_boot_loader"]
    assert loader == LOADERS[boot]
    # One view: every finding that consulted the next boot names the same kernel and loader.
    consulted = [dict(f.evidence) for fs in found.values() for f in fs
                 if "next_boot_release" in dict(f.evidence)]
    assert {c.id for c in CHECKS} <= {
        cid for cid, fs in found.items() if any("next_boot_release" in dict(f.evidence)
                                                for f in fs)}
    assert {(e["next_boot_release"], e["next_boot_loader"]) for e in consulted} == {
        (release, loader)}
    # iommu.mode: passthrough is pending, not a fix to write again.
    translated = [f for f in found["iommu.mode"] if f.subject.startswith("0000:")]
    assert translated and all(f.status is Status.WARN for f in translated)
    assert all(dict(f.evidence)["problem"] == "translated-pending" for f in translated)
    assert all("pending a reboot" in f.message for f in translated)
    # pcie.acs: the configured pci=disable_acs_redir= covers every redirecting port; the bits
    # are set now (setpci clears them), the boot parameter is pending.
    redirecting = [f for f in found["pcie.acs"] if dict(f.evidence).get("problem") == "redirect"]
    assert redirecting and all("pending a reboot" in f.message for f in redirecting)
    assert all(dict(f.evidence)["next_boot_cover"] == "pci=disable_acs_redir="
               for f in redirecting)
    # cpu.cstates: C2 is enabled now (a runtime problem) and the configured cap drops it.
    [c2] = [f for f in found["cpu.cstates"] if f.subject == "C2"]
    assert c2.status is Status.FAIL and "pending a reboot" in c2.message
    assert dict(c2.evidence)["next_boot_cap"] == "processor.max_cstate=1"
    # cpu.isolation: the next kernel's line isolates CPU0 (on BLS: not the running one's).
    [iso] = [f for f in found["cpu.isolation"] if f.subject == "isolcpus"]
    assert iso.status is Status.FAIL and "at the next boot" in iso.message
    # numa.balancing: the running line's numa_balancing=disable is dropped at the next boot.
    [numa] = found["numa.balancing"]
    assert numa.status is Status.WARN
    assert dict(numa.evidence)["boot_mechanism"] == "default"
    assert "numa_balancing=disable" not in numa.message


@pytest.mark.parametrize("boot", sorted(LOADERS))
def test_no_fix_writes_a_token_already_pending(tmp_path: Path, boot: str) -> None:
    host = _host(tmp_path, NextBootSpec(boot=boot))
    policy = load_policy(list(CHECKS))
    report = audit(host, list(CHECKS), policy)
    plan = build_fix(host, report, list(CHECKS), policy)
    remedies = {(s.remedy.check, s.remedy.subject): s for s in plan.sections}
    # The checks whose setting is pending ask for no boot parameter.
    for section in plan.sections:
        if section.remedy.check in ("iommu.mode", "pcie.acs", "cpu.cstates"):
            assert section.remedy.boot_params == (), section.remedy
    assert any("pending" in a.text for a in remedies[("iommu.mode", "iommu")].remedy.advice
               ) or any("pending" in n for n in remedies[("iommu.mode", "iommu")].remedy.notes)
    # The one boot edit left is cpu.isolation's (CPU0 back to housekeeping): it keeps every
    # pending token once and adds none of them again.
    boot_section = remedies[("boot", "cmdline")]
    written = [a.step for a in boot_section.actions
               if isinstance(a.step, (ReplaceLine, AppendLine, WriteFile))]
    assert written, boot_section
    text = " ".join(_text(s) for s in written)
    assert "isolcpus=1-3" in text and "isolcpus=0-3" not in text
    for token in ("iommu=pt", "processor.max_cstate=1", "disable_acs_redir="):
        assert text.count(token) <= 1, text  # kept where configured, never a second one
    assert "iommu.passthrough=1" not in text


def _text(step: ReplaceLine | AppendLine | WriteFile) -> str:
    if isinstance(step, ReplaceLine):
        return step.new
    return step.text if isinstance(step, AppendLine) else step.content


def test_a_parameter_already_configured_is_not_written_again(tmp_path: Path) -> None:
    host = _host(tmp_path, NextBootSpec(boot="grub"))
    remedy = boot_remedy(host, ["iommu=pt", "processor.max_cstate=1"], {"ID": "ubuntu"})
    assert remedy.persistent == ()
    assert any("iommu=pt is already configured for the next boot (/etc/default/grub:3): "
               "pending a reboot" in n for n in remedy.notes)
    assert remedy.reboot
    mixed = boot_remedy(host, ["iommu=pt", "nosmt"], {"ID": "ubuntu"})
    [edit] = [s for s in mixed.persistent if isinstance(s, ReplaceLine)]
    assert edit.new.count("iommu=pt") == 0 and "nosmt" in edit.new


def test_the_next_boot_is_computed_once_per_host(tmp_path: Path) -> None:
    host = _host(tmp_path, NextBootSpec(boot="bls"))
    first = bootloader.next_boot(host)
    assert bootloader.next_boot(host) is first
    assert first.release == "5.14.0-570.23.1.el9_6.x86_64" and first.running != first.release
    # The BLS entry's two options lines are combined in order (Boot Loader Specification).
    assert first.tokens[:3] == ("root=/dev/mapper/vg-root", "ro", "quiet")
    assert all(first.pending(t) for t in PENDING_TOKENS)
    assert not first.pending("quiet") and set(BOOTED_TOKENS) - {"quiet"} <= set(first.live)


# -- sysctl: systemd-sysctl's order --------------------------------------------------------


def _numa(host: DirectoryHost) -> Finding:
    [finding] = NumaBalancing().evaluate(host)
    return finding


def test_systemd_sysctl_order_decides_the_boot_value(tmp_path: Path) -> None:
    """sysctl.d(5): /etc masks /run and /usr/lib by file name; files apply sorted by name
    across the directories, so a later name wins per key."""
    host = _host(tmp_path, NextBootSpec(boot="grub", sysctl={
        "/usr/lib/sysctl.d/50-numa.conf": "kernel.numa_balancing = 1\n",
        "/etc/sysctl.d/50-numa.conf": "kernel.numa_balancing = 0\n",
        "/run/sysctl.d/90-late.conf": "kernel.numa_balancing = 1\n",
    }))
    assert [s.where for s in sysctl.settings(host, "kernel.numa_balancing")] == [
        "/etc/sysctl.d/50-numa.conf:1", "/run/sysctl.d/90-late.conf:1"]
    finding = _numa(host)
    assert finding.status is Status.FAIL
    assert dict(finding.evidence)["boot_source"] == "/run/sysctl.d/90-late.conf:1"
    assert "/usr/lib/sysctl.d/50-numa.conf" not in finding.message


def test_a_boot_value_already_0_is_not_written_again(tmp_path: Path) -> None:
    host = _host(tmp_path, NextBootSpec(boot="grub", balancing="1", sysctl={
        "/etc/sysctl.d/10-numa.conf": "kernel.numa_balancing = 1\n",
        "/etc/sysctl.d/95-numa.conf": "kernel.numa_balancing = 0\n",
    }))
    finding = _numa(host)
    assert finding.status is Status.FAIL  # on now
    assert dict(finding.evidence)["boot_source"] == "/etc/sysctl.d/95-numa.conf:1"
    [remedy] = NumaBalancing().remediate(host, [finding], _context())
    assert remedy.persistent == ()  # neither 10-numa.conf rewritten nor a drop-in
    [runtime] = remedy.runtime
    assert isinstance(runtime, SetValue) and runtime.path == "/proc/sys/kernel/numa_balancing"
    assert any("sets 0 already" in n for n in remedy.notes)


def test_sysctl_on_the_configured_command_line_counts(tmp_path: Path) -> None:
    host = _host(tmp_path, NextBootSpec(
        boot="systemd-boot", pending=("sysctl.kernel.numa_balancing=0",)))
    finding = _numa(host)
    assert finding.status is Status.PASS
    assert dict(finding.evidence)["boot_source"] == "/etc/kernel/cmdline:1"


def _context() -> FixContext:
    return FixContext(sysroot=True)
