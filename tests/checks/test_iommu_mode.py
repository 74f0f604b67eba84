"""iommu.mode on generated hosts: group types, the command line's lint, VFIO, pre-5.11
inference, arm-smmu-v3 before 6.11, and the remedy."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.iommu_mode import IommuMode
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from auditor.remedy import FixContext, Remedy
from tests.support.hostgen.classes import (
    PCIE_BOX_GPUS,
    PCIE_BOX_NICS,
    PcieBoxSpec,
    grace_hopper,
    pcie_box,
)


def evaluate(root: Path) -> list[Finding]:
    return list(IommuMode().evaluate(DirectoryHost(str(root))))


def remedy(root: Path) -> Remedy:
    host = DirectoryHost(str(root))
    problems = [f for f in IommuMode().evaluate(host) if f.status in (Status.WARN, Status.FAIL)]
    [found] = IommuMode().remediate(host, problems, FixContext(sysroot=True))
    return found


def set_cmdline(root: Path, tokens: str) -> None:
    (root / "proc/cmdline").write_text(f"BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro {tokens}\n")


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return pcie_box().write_dir(tmp_path / "box")


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    return pcie_box(PcieBoxSpec(translated=False)).write_dir(tmp_path / "clean")


def test_translated_gpus_and_nics_warn_with_their_group(box: Path) -> None:
    found = evaluate(box)
    by_subject = {f.subject: f for f in found if f.subject != "cmdline"}
    assert sorted(by_subject) == sorted([*PCIE_BOX_GPUS, *PCIE_BOX_NICS])
    gpu = by_subject["0000:43:00.0"]
    assert gpu.status is Status.WARN and gpu.observed == "DMA-FQ"
    evidence = dict(gpu.evidence)
    assert evidence["group"] == "11" and evidence["type"] == "DMA-FQ"
    assert evidence["group_devices"] == "0000:43:00.0"
    assert evidence["iommu_units"] == "ivhd0 ivhd1 ivhd2 ivhd3"
    [lint] = [f for f in found if f.subject == "cmdline"]
    assert "amd_iommu=pt is not a valid value" in lint.message
    assert "AMD-Vi: Unknown option - 'pt'" in lint.message


def test_the_remedy_is_passthrough_on_the_boot_line_and_a_manual_procedure(box: Path) -> None:
    found = remedy(box)
    assert found.boot_params == ("iommu.passthrough=1",) and found.reboot
    assert not found.runtime and not found.persistent
    assert any("remove amd_iommu=pt" in n for n in found.notes)
    assert any("SEV-SNP" in n for n in found.notes)
    [advice] = found.advice
    assert "echo identity > /sys/kernel/iommu_groups/N/type" in advice.text
    assert "11 12 13 15" in advice.text


def test_passthrough_passes(clean: Path) -> None:
    found = evaluate(clean)
    assert {f.status for f in found} == {Status.PASS}
    assert all(f.observed == "identity" for f in found)


@pytest.mark.parametrize(("tokens", "phrase"), [
    ("intel_iommu=pt", "intel_iommu=pt is not a valid value"),
    ("intel_iommu=on iommu=off", "iommu=off contradicts"),
    ("amd_iommu=on", "the AMD IOMMU is on by default"),
    ("amd_iommu=force_isolation,bogus", "amd_iommu=bogus is not a valid value"),
])
def test_command_line_lint(clean: Path, tokens: str, phrase: str) -> None:
    set_cmdline(clean, f"iommu=pt {tokens}")
    [lint] = [f for f in evaluate(clean) if f.subject == "cmdline"]
    assert lint.status is Status.WARN and phrase in lint.message
    # A lint without translated groups plans advice, not a boot edit.
    found = remedy(clean)
    assert not found.boot_params and found.advice


def test_passthrough_asked_for_but_groups_still_translated(box: Path) -> None:
    set_cmdline(box, "iommu=pt")
    [lint] = [f for f in evaluate(box) if f.subject == "cmdline"]
    assert "asks for passthrough but 10 GPU/NIC group(s) are still translated" in lint.message


def test_vfio_hosts_need_the_iommu(box: Path) -> None:
    for address in (*PCIE_BOX_GPUS, *PCIE_BOX_NICS):
        link = box / f"sys/bus/pci/devices/{address}/driver"
        target = str(link.readlink())
        link.unlink()
        link.symlink_to(target.rsplit("/", 1)[0] + "/vfio-pci")
    [finding] = [f for f in evaluate(box) if f.subject == "iommu"]
    assert finding.status is Status.SKIP and "bound to vfio-pci" in finding.message


def test_one_gpu_is_no_peer_dma(box: Path) -> None:
    for address in (*PCIE_BOX_GPUS[1:], *PCIE_BOX_NICS):
        (box / f"sys/bus/pci/devices/{address}").unlink()
    [finding] = [f for f in evaluate(box) if f.subject == "iommu"]
    assert finding.status is Status.SKIP and "no peer DMA (1 GPU and 0 RDMA NICs)" in \
        finding.message


@pytest.mark.parametrize(("tokens", "config", "kind", "source"), [
    ("", "CONFIG_IOMMU_DEFAULT_PASSTHROUGH=y\n", "identity", "/boot/config-5.10.0-30-amd64"),
    ("", "# CONFIG_IOMMU_DEFAULT_PASSTHROUGH is not set\n", "DMA", "/boot/config-5.10"),
    ("iommu=pt", "# CONFIG_IOMMU_DEFAULT_PASSTHROUGH is not set\n", "identity", "command line"),
    ("iommu=pt iommu.passthrough=0", "", "DMA", "command line"),
])
def test_kernels_before_5_11_are_inferred_and_say_so(clean: Path, tokens: str, config: str,
                                                     kind: str, source: str) -> None:
    for path in (clean / "sys/kernel/iommu_groups").glob("*/type"):
        path.unlink()
    set_cmdline(clean, tokens)
    (clean / "proc/sys/kernel/osrelease").write_text("5.10.0-30-amd64\n")
    (clean / "boot/config-5.10.0-30-amd64").write_text(config)
    gpu = next(f for f in evaluate(clean) if f.subject == PCIE_BOX_GPUS[0])
    evidence = dict(gpu.evidence)
    assert evidence["type"] == kind
    assert source in evidence["inferred"] and "no type file" in gpu.message


def test_arm_smmu_v3_before_6_11_keeps_translation_and_warns_on_identity(tmp_path: Path) -> None:
    root = grace_hopper().write_dir(tmp_path / "gh")
    found = {f.subject: f for f in evaluate(root)}
    assert found["0009:01:00.0"].status is Status.PASS
    assert "passthrough breaks ATS/SVA" in found["0009:01:00.0"].message
    # The NIC stays translated too: passthrough is one switch for the whole host.
    assert found["0000:01:00.0"].status is Status.PASS
    for path in (root / "sys/kernel/iommu_groups").glob("*/type"):
        path.write_text("identity\n")
    found = {f.subject: f for f in evaluate(root)}
    assert found["0009:01:00.0"].status is Status.WARN
    assert "no CUDA context can be created" in found["0009:01:00.0"].message
    assert remedy(root).boot_params == ("iommu.passthrough=0",)
    # From 6.11 identity is right, and translation is judged as anywhere else.
    (root / "proc/sys/kernel/osrelease").write_text("6.11.0-1005-nvidia-64k\n")
    assert {f.status for f in evaluate(root)} == {Status.PASS}
    for path in (root / "sys/kernel/iommu_groups").glob("*/type"):
        path.write_text("DMA\n")
    gpu = {f.subject: f for f in evaluate(root)}["0009:01:00.0"]
    assert gpu.status is Status.WARN and "NVLink-C2C" in gpu.message


def test_iommu_pt_is_an_x86_parameter(tmp_path: Path) -> None:
    root = grace_hopper().write_dir(tmp_path / "gh")
    set_cmdline(root, "iommu=pt")
    [lint] = [f for f in evaluate(root) if f.subject == "cmdline"]
    assert "arm64 kernels ignore it" in lint.message


def test_containers_are_told_to_audit_the_host(box: Path) -> None:
    (box / "run/systemd").mkdir(parents=True)
    (box / "run/systemd/container").write_text("docker\n")
    [finding] = evaluate(box)
    assert finding.status is Status.SKIP and "container (docker)" in finding.message
