"""The host the project exists for: an 8-GPU Proxmox node with all six problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.cli import main
from tests.support.fixkit import needs_root, run, tree_hash
from tests.support.hostgen import FIXED_BY_SCRIPT, HostSpec, build_host

GPUS = [f"0000:{0x18 + i * 0x10:02x}:00.0" for i in range(8)]
NICS = [f"0000:{0x1a + i * 0x20:02x}:00.0" for i in range(4)]


def audit_json(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["local", "--root", str(root), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def by_status(data: dict[str, object], check: str, status: str) -> list[dict[str, str]]:
    findings = data["findings"]
    assert isinstance(findings, list)
    return [f for f in findings if f["check"] == check and f["status"] == status]


@pytest.mark.parametrize("form", ["directory", "tar"])
def test_every_problem_is_found_on_the_right_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    tree = build_host()
    root = tree.write_dir(tmp_path / "root") if form == "directory" else tree.write_tar(
        tmp_path / "host.tar.gz")
    code, data = audit_json(root, capsys)
    assert code == 1
    assert data["host"] == "pve-gpu-01"

    [governor] = by_status(data, "cpu.governor", "fail")
    assert governor["subject"] == "0-127"
    assert "powersave" in governor["observed"]

    [cstate] = by_status(data, "cpu.cstates", "fail")
    assert cstate["subject"] == "C2"
    assert "0-127" in cstate["message"]

    [numa] = by_status(data, "numa.balancing", "fail")
    assert numa["observed"] == "1"

    kernel = by_status(data, "kernel.version", "fail")
    assert [f["subject"] for f in kernel] == ["kernel"]
    assert "6.8.12-4-pve" in kernel[0]["observed"]
    assert "reboot into" in kernel[0]["message"] and "6.14.8-2-pve" in kernel[0]["message"]

    mrrs = by_status(data, "pcie.mrrs", "fail")
    assert sorted(f["subject"] for f in mrrs) == GPUS
    assert all(f["observed"].startswith("512") for f in mrrs)
    findings = data["findings"]
    assert isinstance(findings, list)
    judged = {f["subject"] for f in findings if f["check"] == "pcie.mrrs"}
    assert set(NICS) <= judged
    assert not any(s.endswith(":01.0") for s in judged), "root ports are not judged"

    lxc = by_status(data, "lxc.device_majors", "fail")
    assert {f["subject"] for f in lxc} == {"101"}
    devices = {f["evidence"]["device"] for f in lxc}  # type: ignore[index]
    assert "/dev/nvidia-uvm" in devices
    for finding in lxc:
        assert finding["evidence"]["allowed_major"] == "509"  # type: ignore[index]
        assert finding["evidence"]["current_major"] == "511"  # type: ignore[index]


def test_the_tuned_host_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = HostSpec(bad_governor=False, deep_cstates=False, numa_balancing=False,
                    old_kernel=False, low_mrrs=False, stale_lxc_major=False)
    code, data = audit_json(build_host(spec).write_dir(tmp_path / "root"), capsys)
    findings = data["findings"]
    assert isinstance(findings, list)
    problems = [f for f in findings if f["status"] in ("fail", "error")]
    assert problems == []
    assert code == 0



@needs_root
@pytest.mark.parametrize("spec", [
    HostSpec(),
    HostSpec(hostname="gpu-intel-07", vendor="intel", boot="grub", cgroup1=True, cpus=96),
    HostSpec(hostname="gpu-flat-03", flat_sysfs=True, cpus=64),
], ids=["amd-systemd-boot", "intel-grub-cgroup1", "flat-sysfs"])
def test_fix_script_repairs_the_host_and_its_rollback_restores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: HostSpec
) -> None:
    """As a user would: write the fix, run it with bash, audit again, run it twice, undo it."""
    root = build_host(spec).write_dir(tmp_path / "root")
    fix = tmp_path / "fix.sh"
    code = main(["local", "--root", str(root), "--fix-script", str(fix)])
    capsys.readouterr()
    assert code == 1
    before = tree_hash(root)
    result = run(fix)
    assert result.returncode == 0, result.stdout + result.stderr
    code, data = audit_json(root, capsys)
    every = data["findings"]
    assert isinstance(every, list)
    for check in FIXED_BY_SCRIPT:
        findings = [f for f in every if f["check"] == check]
        assert findings and {f["status"] for f in findings} == {"pass"}, (check, findings)
    [kernel] = by_status(data, "kernel.version", "fail")
    assert "6.8.12-4-pve" in kernel["observed"]
    # The boot parameters land where this host's boot loader reads them.
    loader = "etc/kernel/cmdline" if spec.boot == "systemd-boot" else "etc/default/grub"
    # The idle driver's own cap: intel_idle keeps C1 and C1E; acpi_idle keeps C1.
    cap = "intel_idle.max_cstate=2" if spec.vendor == "intel" else "processor.max_cstate=1"
    assert cap in (root / loader).read_text()
    if spec.boot == "systemd-boot":
        assert "max_cstate" not in (root / "etc/default/grub").read_text()
    boot = next(f for f in every if f["check"] == "numa.balancing")["evidence"]
    assert boot["boot_value"] == "0"
    fixed = tree_hash(root)
    again = run(fix)
    assert again.returncode == 0, again.stderr
    assert tree_hash(root) == fixed
    rollback = tmp_path / "fix.rollback.sh"
    undone = run(rollback)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(root) == before
