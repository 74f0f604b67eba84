"""pcie.acs: redirect on the ports above GPUs and NICs, covered or not by the command line."""

from auditor.model import Status
from tests.support.cases import Case, built, capture
from tests.support.hostgen.classes import (
    PcieBoxSpec,
    base,
    dgx_h100,
    grace_hopper,
    kvm_guest,
    mi300x,
    pcie_box,
)
from tests.support.hostgen.pcie import single_peer_ports
from tests.support.hostgen.platforms import NextBootSpec, build_next_boot
from tests.support.hostgen.serving import dgx_class
from tests.support.sysroot import Sysroot

CHECK = "pcie.acs"

CLEAN_BOX = base(lambda: pcie_box(PcieBoxSpec(acs=False, translated=False)), "pcie-box-clean")


def unprivileged(root: Sysroot) -> None:
    """Config files as a user reads them: 64 bytes."""
    for path in root.path("/sys/devices").rglob("config"):
        path.write_bytes(path.read_bytes()[:64])


def acs_override(root: Sysroot) -> None:
    text = root.read("/proc/cmdline").strip()
    root.write("/proc/cmdline", text + " pcie_acs_override=downstream,multifunction\n")


def geforce(root: Sysroot) -> None:
    """Every GPU a GeForce board: the driver refuses them P2P and GPUDirect RDMA (rule 9)."""
    for path in root.path("/proc/driver/nvidia/gpus").glob("*/information"):
        text = path.read_text()
        model = text.split("Model:", 1)[1].split("\n", 1)[0].strip()
        path.write_text(text.replace(model, "NVIDIA GeForce RTX 5090"))


CASES = [
    # The runtime fix clears the bits; the boot line is not booted yet, so the re-audit says
    # they were cleared at runtime only.
    Case("8-GPU box: kernel-enabled redirect on every port", Status.FAIL,
         base=base(pcie_box, "pcie-box"), fixed=True, after=Status.WARN),
    Case("8-GPU box: pci=disable_acs_redir= covers every port", Status.PASS, base=CLEAN_BOX),
    Case("pcie_acs_override on the command line", Status.WARN, acs_override, base=CLEAN_BOX),
    Case("ACS in extended config space needs root", Status.SKIP, unprivileged,
         base=base(pcie_box, "pcie-box")),
    Case("DGX H100: ACS off, IOMMU off", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("DGX H100: BIOS left ACS on the switch ports", Status.FAIL,
         base=base(lambda: dgx_h100(acs_on=True), "dgx-h100-acs"), fixed=True,
         after=Status.PASS),
    Case("8x MI300X: redirect covered by the command line", Status.PASS,
         base=base(mi300x, "mi300x")),
    Case("8x MI300X: redirect on the switch ports", Status.FAIL,
         base=base(lambda: mi300x(acs_covered=False), "mi300x-acs"), fixed=True,
         after=Status.WARN),
    Case("GH200", Status.SKIP, base=base(grace_hopper, "gh200")),
    Case("KVM guest", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
    Case("H200 VM capture", Status.SKIP, base=capture("h200")),
    # Rule 4: the next boot's pci=disable_acs_redir= (a grub.d drop-in) covers every port:
    # the bits are set now, the parameter pending a reboot; the fix clears the bits now and
    # writes no second token, and the re-audit finds them cleared at runtime, still pending.
    Case("redirect on every port, the next boot's line covers them", Status.FAIL,
         base=built(lambda: build_next_boot(NextBootSpec(boot="grub")), "next-boot-grub"),
         fixed=True, after=Status.WARN),
    # Rule 9: devices that cannot talk peer to peer over these ports.
    Case("8 GeForce boards and two RDMA NICs", Status.SKIP, geforce,
         base=base(pcie_box, "pcie-box")),
    Case("NVLink fabric, no RDMA NIC", Status.SKIP,
         base=base(lambda: dgx_class(rdma_nics=0), "dgx-nvlink-no-nic")),
    Case("redirecting ports above single GPUs only", Status.PASS,
         base=base(lambda: single_peer_ports(paired=False), "single-peers")),
    Case("two GPUs below one switch beside single-GPU ports", Status.FAIL,
         base=base(single_peer_ports, "single-and-paired-peers")),
]
