"""BARs are found by their register, not by their index (issue 27, rule 6): a 64-bit BAR
takes two registers, so on a Grace-attached GPU (64-bit BAR0) the peer aperture is
resource 2, on a discrete NVIDIA GPU resource 1, on AMD Instinct resource 0. On generated
Grace-Blackwell, DGX-class and MI300X hosts."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.lib import pci
from auditor.checks.pcie_bar1 import PcieBar1, aperture_bar
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.hostgen.classes import mi300x
from tests.support.hostgen.serving import grace_blackwell
from tests.support.sysroot import Sysroot

GIB = 1 << 30
MEM, PREFETCH, MEM_64 = 0x200, 0x2000, 0x100000
EMPTY = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def _line(start: int, size: int, flags: int) -> str:
    return f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}"


def grace_resource(aperture: int) -> str:
    """BAR0: 64-bit registers (two slots); BAR2: the 64-bit prefetchable aperture."""
    lines = [_line(0x650000000000, 16 << 20, MEM | MEM_64), EMPTY,
             _line(0x660000000000, aperture, MEM | PREFETCH | MEM_64), EMPTY, EMPTY, EMPTY,
             EMPTY]
    return "\n".join(lines) + "\n"


def test_aperture_index_from_flags() -> None:
    grace = [pci.Resource(*(int(x, 16) for x in line.split()))
             for line in grace_resource(256 << 20).splitlines()]
    assert aperture_bar(grace, pci.NVIDIA) == 2
    discrete = [pci.Resource(0xA0000000, 0xA0FFFFFF, MEM),
                pci.Resource(0x38000000000, 0x38000000000 + 128 * GIB - 1, MEM | PREFETCH | MEM_64),
                pci.Resource(0, 0, 0),
                pci.Resource(0x3a000000000, 0x3a001ffffff, MEM | PREFETCH | MEM_64)]
    assert aperture_bar(discrete, pci.NVIDIA) == 1
    unflagged = [pci.Resource(1, 0x1000, 0), pci.Resource(0x2000, 0x3000, 0)]
    assert aperture_bar(unflagged, pci.NVIDIA) == 1  # hand-made: the vendor's usual index


def _grace(tmp_path: Path, aperture: int) -> Sysroot:
    tree = grace_blackwell(gpus=2, rdma_nics=2)
    for path in [p for p in tree.files if (p.endswith("/resource") and "/0000:19:00.0" in p)
                 or (p.endswith("/resource") and "/0000:29:00.0" in p)]:
        tree.put(path, grace_resource(aperture))
    for address in ("0000:19:00.0", "0000:29:00.0"):
        info = f"/proc/driver/nvidia/gpus/{address}/information"
        tree.put(info, tree.files[info].decode().replace("NVIDIA GPU", "NVIDIA GB200 186 GB"))
    return Sysroot(tree.write_dir(tmp_path / "root"))


def test_grace_blackwell_aperture_is_resource_2(tmp_path: Path) -> None:
    small = list(PcieBar1().evaluate(DirectoryHost(str(_grace(tmp_path / "a", 256 << 20).root))))
    gpu = [f for f in small if f.subject == "0000:19:00.0"]
    assert gpu and gpu[0].status is Status.FAIL  # judged at resource 2, not skipped at 1
    assert dict(gpu[0].evidence)["bar"] == "BAR2"
    full = list(PcieBar1().evaluate(DirectoryHost(str(_grace(tmp_path / "b", 256 * GIB).root))))
    assert [f.status for f in full if f.subject == "0000:19:00.0"] == [Status.PASS]


def test_amd_instinct_aperture_is_resource_0(tmp_path: Path) -> None:
    root = mi300x().write_dir(tmp_path / "root")
    findings = list(PcieBar1().evaluate(DirectoryHost(str(root))))
    judged = [f for f in findings if f.status is not Status.SKIP]
    assert judged and all(dict(f.evidence)["bar"] == "BAR0" for f in judged)
