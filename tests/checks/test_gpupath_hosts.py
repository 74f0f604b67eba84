"""The checks of the GPU-to-GPU path on every generated class of host: what an expert expects
of each, and the same findings from a collection of the declared reads alone (as over SSH or
in a snapshot)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.check import CheckClass
from auditor.checks.iommu_mode import IommuMode
from auditor.checks.numa_placement import NumaPlacement
from auditor.checks.pcie_acs import PcieAcs
from auditor.checks.pcie_aer import PcieAer
from auditor.checks.pcie_aspm import PcieAspm
from auditor.checks.pcie_bar1 import PcieBar1
from auditor.checks.pcie_mrrs import PcieMrrs
from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.collect import collect_tar
from auditor.model import Status, worst
from auditor.registry import collected_paths
from tests.support.hostgen.base import Tree
from tests.support.hostgen.classes import (
    PcieBoxSpec,
    dgx_h100,
    grace_hopper,
    kvm_guest,
    mi300x,
    pcie_box,
)

CHECKS: list[CheckClass] = [IommuMode, PcieAcs, PcieBar1, PcieAspm, PcieAer, NumaPlacement,
                            PcieMrrs]
P, S, W, F = Status.PASS, Status.SKIP, Status.WARN, Status.FAIL

#: Per class of host, the verdict of each check an expert expects.
EXPECTED: dict[str, tuple[Callable[[], Tree], dict[str, Status]]] = {
    "pcie-box": (pcie_box, {"iommu.mode": W, "pcie.acs": F, "pcie.bar1": F, "pcie.aspm": W,
                            "pcie.aer": F, "numa.placement": W, "pcie.mrrs": W}),
    "pcie-box-tuned": (lambda: pcie_box(PcieBoxSpec(
        acs=False, translated=False, small_bar=False, aspm=False, aer=False, numa=False,
        degraded_uplink=False)),
        {"iommu.mode": P, "pcie.acs": P, "pcie.bar1": P, "pcie.aspm": P, "pcie.aer": P,
         "numa.placement": P, "pcie.mrrs": P}),
    "dgx-h100": (dgx_h100, {"iommu.mode": P, "pcie.acs": P, "pcie.bar1": P, "pcie.aspm": P,
                            "pcie.aer": P, "numa.placement": P, "pcie.mrrs": P}),
    "mi300x": (mi300x, {"iommu.mode": P, "pcie.acs": P, "pcie.bar1": P, "pcie.aspm": P,
                        "pcie.aer": P, "numa.placement": P, "pcie.mrrs": P}),
    "gh200": (grace_hopper, {"iommu.mode": P, "pcie.acs": S, "pcie.bar1": P, "pcie.aspm": P,
                             "pcie.aer": P, "numa.placement": S, "pcie.mrrs": S}),
    # A guest: every check of the host's path says so; only the passed-through GPUs' own
    # MaxReadReq is judged.
    "kvm-guest": (kvm_guest, {"iommu.mode": S, "pcie.acs": S, "pcie.bar1": S, "pcie.aspm": S,
                              "pcie.aer": S, "numa.placement": S, "pcie.mrrs": P}),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[str, Path]:
    name = request.param
    return name, EXPECTED[name][0]().write_dir(tmp_path_factory.mktemp(name))


def test_each_check_gives_the_verdict_an_expert_expects(host: tuple[str, Path]) -> None:
    name, root = host
    source = DirectoryHost(str(root))
    verdicts = {c.id: worst(f.status for f in c().evaluate(source)) for c in CHECKS}
    assert verdicts == EXPECTED[name][1]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.id)
def test_a_collection_of_the_declared_reads_replays_the_same_findings(
    host: tuple[str, Path], check: CheckClass
) -> None:
    _, root = host
    whole = [(f.status, f.subject, f.message, f.evidence)
             for f in check().evaluate(DirectoryHost(str(root)))]
    narrowed = ArchiveHost(collect_tar(collected_paths([check]), root=str(root)), "narrowed")
    assert [(f.status, f.subject, f.message, f.evidence)
            for f in check().evaluate(narrowed)] == whole


def test_hostile_bytes_in_every_file_never_crash(tmp_path: Path) -> None:
    """Noise, huge numbers, loops and shell in every file these checks read: skips, not errors."""
    import random

    root = pcie_box().write_dir(tmp_path / "box")
    noise = random.Random(7)
    for path in sorted((root / "sys").rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        choice = noise.randrange(4)
        if choice == 0:
            path.write_bytes(bytes(noise.randrange(256) for _ in range(noise.randrange(600))))
        elif choice == 1:
            path.write_text("9" * 40 + "\n$(touch pwned)\n-1\n")
        elif choice == 2 and path.name == "config":
            data = bytearray(path.read_bytes())
            data[0x100:0x104] = (0x100 << 20 | 0x000D).to_bytes(4, "little")  # loops
            path.write_bytes(bytes(data))
    (root / "proc/cmdline").write_text("pci=" + ";".join(["zz"] * 5000) + " amd_iommu=" +
                                       "," * 3000 + " iommu=pt,nopt,off intel_iommu=\n")
    (root / "sys/kernel/iommu_groups/11/type").write_text("DMA\x00\x1b[31m" * 100)
    (root / "sys/class/iommu/$(reboot)").mkdir()
    (root / "sys/bus/pci/devices/0000:ff:1f.7").symlink_to("0000:ff:1f.7")
    source = DirectoryHost(str(root))
    for check in CHECKS:
        found = list(check().evaluate(source))
        assert found and all(f.status in (P, S, W, F) for f in found), check.id
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
