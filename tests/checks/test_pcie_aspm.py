"""pcie.aspm on generated hosts: links, uplinks, suspending ports, the policy, firmware's ASPM
under pcie_aspm=off, and the fix with real setpci."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.pcie_aspm import UDEV_RULE, PcieAspm
from auditor.fix import build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.policy import load_policy
from auditor.remedy import FixContext, Remedy, SetPciBits, SetValue, WriteFile
from auditor.runner import audit
from tests.support.fixkit import copy_tree, run, write_scripts
from tests.support.hostgen.classes import PCIE_BOX_GPUS, PcieBoxSpec, kvm_guest, pcie_box
from tests.support.pciutils import lspci, needs_pciutils


def evaluate(root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in PcieAspm().evaluate(DirectoryHost(str(root)))}


def plan(root: Path) -> list[Remedy]:
    host = DirectoryHost(str(root))
    problems = [f for f in PcieAspm().evaluate(host) if f.status is Status.WARN]
    return PcieAspm().remediate(host, problems, FixContext(sysroot=True))


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return pcie_box().write_dir(tmp_path / "box")


def firmware_owned(root: Path) -> None:
    (root / "proc/cmdline").write_text((root / "proc/cmdline").read_text().strip()
                                       + " pcie_aspm=off\n")
    for link in (root / "sys/devices").rglob("link"):
        for item in link.iterdir():
            item.unlink()
        link.rmdir()


@needs_pciutils
def test_l1_on_every_gpu_link_and_one_uplink_as_lspci_shows(box: Path) -> None:
    found = evaluate(box)
    warned = sorted(s for s, f in found.items() if f.status is Status.WARN)
    assert warned == sorted([*PCIE_BOX_GPUS, "0000:41:00.0", "0000:60:01.1", "0000:c2:01.0"])
    decoded = lspci(box)
    for address in PCIE_BOX_GPUS:
        assert decoded[address].aspm == "ASPM L1 Enabled"
        assert dict(found[address].evidence)["enabled"] == "l1_aspm"
    uplink = found["0000:41:00.0"]
    assert "uplink 0000:41:00.0 - 0000:40:01.1" in uplink.message
    assert dict(uplink.evidence)["devices_below"] == "0000:43:00.0 0000:44:00.0 0000:45:00.0"
    assert found["0000:45:00.0"].status is Status.PASS  # the NIC's link has L1 off
    port = found["0000:60:01.1"]
    assert "runtime-suspends" in port.message and "123456 ms" in port.message
    assert "ACS is set again on resume" in port.message


def test_the_fix_turns_links_off_keeps_ports_on_and_sets_the_policy_at_boot(box: Path) -> None:
    remedies = plan(box)
    writes = [s for r in remedies for s in r.runtime if isinstance(s, SetValue)]
    assert {s.path for s in writes} == {
        *(f"/sys/bus/pci/devices/{a}/link/l1_aspm" for a in (*PCIE_BOX_GPUS, "0000:41:00.0")),
        "/sys/bus/pci/devices/0000:60:01.1/power/control",
        "/sys/bus/pci/devices/0000:c2:01.0/power/control"}
    [rule] = [s for r in remedies for s in r.persistent if isinstance(s, WriteFile)]
    assert rule.path == UDEV_RULE
    assert 'KERNEL=="0000:60:01.1", ATTR{power/control}="on"' in rule.content
    assert 'KERNEL=="0000:c2:01.0", ATTR{power/control}="on"' in rule.content
    assert [p for r in remedies for p in r.boot_params] == ["pcie_aspm.policy=performance"]


def test_a_powersave_policy_and_port_pm_off(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(aspm=False, aspm_policy="powersave")).write_dir(tmp_path / "b")
    found = evaluate(root)
    assert found["pcie_aspm"].status is Status.WARN
    assert found["pcie_aspm"].observed == "powersave"
    assert {f.status for s, f in found.items() if s != "pcie_aspm"} == {Status.PASS}
    box = pcie_box().write_dir(tmp_path / "box")
    (box / "proc/cmdline").write_text((box / "proc/cmdline").read_text().strip()
                                      + " pcie_port_pm=off\n")
    found = evaluate(box)
    assert "0000:60:01.1" not in found and "(pcie_port_pm=off)" in found["ports"].message


@needs_pciutils
def test_firmware_aspm_under_pcie_aspm_off_is_read_from_link_control(box: Path,
                                                                     tmp_path: Path) -> None:
    firmware_owned(box)
    found = evaluate(box)
    gpu = found["0000:43:00.0"]
    assert gpu.status is Status.WARN
    assert "pcie_aspm=off" in gpu.message and "0000:43:00.0:L1" in gpu.message
    [steps] = [r.runtime for r in plan(box) if r.subject == "0000:43:00.0"]
    assert {(s.address, s.register, s.value, s.mask) for s in steps
            if isinstance(s, SetPciBits)} == {("0000:43:00.0", "CAP_EXP+10.w", "0000", "0003"),
                                              ("0000:42:00.0", "CAP_EXP+10.w", "0000", "0003")}
    policy = load_policy([PcieAspm])
    report = audit(DirectoryHost(str(box)), [PcieAspm], policy)
    fix, _ = write_scripts(build_fix(DirectoryHost(str(box)), report, [PcieAspm], policy),
                           tmp_path)
    copy = copy_tree(box, tmp_path / "copy")
    assert run(fix, copy).returncode == 0
    decoded = lspci(copy)
    assert decoded["0000:43:00.0"].aspm == decoded["0000:42:00.0"].aspm == "ASPM Disabled"
    assert evaluate(copy)["0000:43:00.0"].status is Status.PASS
    # Without root only 64 bytes of config space: firmware's setting cannot be read.
    for config in (box / "sys/devices").rglob("config"):
        config.write_bytes(config.read_bytes()[:64])
    assert "needs root" in evaluate(box)["0000:43:00.0"].message


def test_guests_and_containers_skip(tmp_path: Path, box: Path) -> None:
    [guest] = evaluate(kvm_guest().write_dir(tmp_path / "vm")).values()
    assert guest.status is Status.SKIP and "VM (qemu)" in guest.message
    (box / "run/systemd").mkdir(parents=True)
    (box / "run/systemd/container").write_text("lxc\n")
    [inside] = evaluate(box).values()
    assert inside.status is Status.SKIP and "inside a container (lxc)" in inside.message
