"""pcie.bar1: a 256 MiB BAR1 with peer traffic, a BAR left below what it offers, full BARs."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.hostgen.classes import (
    GIB,
    PcieBoxSpec,
    base,
    dgx_h100,
    kvm_guest,
    mi300x,
    pcie_box,
)
from tests.support.sysroot import Sysroot

CHECK = "pcie.bar1"

CLEAN_BOX = base(lambda: pcie_box(PcieBoxSpec(small_bar=False)), "pcie-box-full-bar")


def sixteen_gib(root: Sysroot) -> None:
    """BAR1 of the first GPU at 16 GiB although it offers 128 GiB."""
    path = "/sys/bus/pci/devices/0000:43:00.0/resource"
    lines = root.read(path).splitlines()
    start = int(lines[1].split()[0], 16)
    lines[1] = f"0x{start:016x} 0x{start + 16 * GIB - 1:016x} 0x000000000014220c"
    root.write(path, "\n".join(lines) + "\n")


CASES = [
    # The fix writes the driver option; BAR1 stays small until the BIOS and a reboot agree.
    Case("8-GPU box: 256 MiB BAR1 on 8 GPUs with peer traffic", Status.FAIL,
         base=base(pcie_box, "pcie-box"), fixed=True, after=Status.FAIL),
    Case("8-GPU box: BAR1 resized to 128 GiB", Status.PASS, base=CLEAN_BOX),
    Case("one GPU left at 16 GiB of 128 GiB", Status.WARN, sixteen_gib, base=CLEAN_BOX),
    Case("DGX H100: 128 GiB BAR1", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("8x MI300X: 256 GiB BAR0", Status.PASS, base=base(mi300x, "mi300x")),
    Case("KVM guest", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
    Case("H200 VM capture", Status.SKIP, base=capture("h200")),
]
