"""pcie.bar1 on generated hosts: the size from resource, what the device offers from
resourceN_resize or its Resizable BAR capability, and the driver option the fix writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.pcie_bar1 import MODPROBE_FILE, PcieBar1
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.remedy import FixContext, RunCommand, WriteFile
from tests.support.hostgen.classes import PCIE_BOX_GPUS, PcieBoxSpec, mi300x, pcie_box
from tests.support.pciutils import lspci, needs_pciutils

GPU = PCIE_BOX_GPUS[0]


def evaluate(root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in PcieBar1().evaluate(DirectoryHost(str(root)))}


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return pcie_box().write_dir(tmp_path / "box")


@needs_pciutils
def test_a_256_mib_bar1_on_gpus_with_peer_traffic_fails_as_lspci_shows(box: Path) -> None:
    found = evaluate(box)
    assert {f.status for f in found.values()} == {Status.FAIL}
    gpu = found[GPU]
    assert "BAR1 is 256 MiB" in gpu.message and "offers up to 128 GiB" in gpu.message
    evidence = dict(gpu.evidence)
    assert evidence["supported_from"] == "resource1_resize"
    assert evidence["EnableResizableBar"] == "0"
    current, supported = lspci(box, GPU)[GPU].rebar[1]
    assert current == "256MB" and supported[-1] == "128GB"


def test_without_resize_files_the_capability_says_what_is_offered(box: Path) -> None:
    for path in (box / "sys/devices").rglob("resource1_resize"):
        path.unlink()
    evidence = dict(evaluate(box)[GPU].evidence)
    assert evidence["supported_from"] == "Resizable BAR capability"
    assert evidence["supported"].endswith("64 GiB 128 GiB")


def test_the_fix_writes_the_driver_option_and_names_the_bios(box: Path) -> None:
    host = DirectoryHost(str(box))
    problems = list(PcieBar1().evaluate(host))
    os_release = {"ID": "ubuntu", "ID_LIKE": "debian"}
    [remedy] = PcieBar1().remediate(host, problems, FixContext(True, os_release))
    write, initramfs = remedy.persistent
    assert isinstance(write, WriteFile) and write.path == MODPROBE_FILE
    assert "options nvidia NVreg_EnableResizableBar=1" in write.content
    assert isinstance(initramfs, RunCommand) and initramfs.argv[0] == "update-initramfs"
    assert "Above 4G Decoding" in remedy.advice[0].text
    (box / "proc/driver/nvidia/params").write_text("EnableResizableBar: 1\n")
    [remedy] = PcieBar1().remediate(host, problems, FixContext(True, os_release))
    assert not remedy.persistent and any("already 1" in n for n in remedy.notes)


def test_a_lone_gpu_with_a_small_bar_is_a_warning_when_it_could_grow(box: Path) -> None:
    for address in (*PCIE_BOX_GPUS[1:], "0000:45:00.0", "0000:c5:00.0"):
        (box / f"sys/bus/pci/devices/{address}").unlink()
    gpu = evaluate(box)[GPU]
    assert gpu.status is Status.WARN and "not applied" in gpu.message


def test_amd_instinct_is_judged_on_bar0(tmp_path: Path) -> None:
    found = evaluate(mi300x().write_dir(tmp_path / "mi"))
    gpu = found["0000:07:00.0"]
    assert gpu.status is Status.PASS
    assert "BAR0 is 256 GiB (the largest size it offers)" in gpu.message
    assert dict(gpu.evidence)["memory_gib"] == "192"


def test_the_policy_minimum(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(small_bar=False)).write_dir(tmp_path / "box")
    check = PcieBar1.configured(min_bar_gib=256)
    found = list(check.evaluate(DirectoryHost(str(root))))
    assert {f.status for f in found} == {Status.WARN}
    assert "below the policy's 256 GiB" in found[0].message
