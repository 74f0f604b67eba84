"""iommu.mode: translated and passthrough hosts, invalid tokens, guests, arm-smmu-v3, pre-5.11."""

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
from tests.support.hostgen.platforms import NextBootSpec, build_next_boot
from tests.support.sysroot import Sysroot

CHECK = "iommu.mode"

BOX = base(pcie_box, "pcie-box")
CLEAN_BOX = base(lambda: pcie_box(PcieBoxSpec(translated=False)), "pcie-box-passthrough")
GH200 = base(grace_hopper, "gh200")


def passthrough_dropped(root: Sysroot) -> None:
    """Booted with iommu=pt, but /etc/default/grub no longer has it (rule 4)."""
    root.write("/etc/default/grub", root.read("/etc/default/grub").replace("iommu=pt ", ""))


def geforce(root: Sysroot) -> None:
    """Every GPU a GeForce board: the driver refuses them P2P and GPUDirect RDMA (rule 9);
    the IOMMU translates (no amd_iommu=pt to lint)."""
    root.write("/proc/cmdline", root.read("/proc/cmdline").replace(" amd_iommu=pt", ""))
    for path in root.path("/proc/driver/nvidia/gpus").glob("*/information"):
        text = path.read_text()
        model = text.split("Model:", 1)[1].split("\n", 1)[0].strip()
        path.write_text(text.replace(model, "NVIDIA GeForce RTX 5090"))


def identity_groups(root: Sysroot) -> None:
    """Every IOMMU group of the GH200 in passthrough (iommu.passthrough=1 on a 6.8 kernel)."""
    for path in root.path("/sys/kernel/iommu_groups").glob("*/type"):
        path.write_text("identity\n")


def before_5_11(root: Sysroot) -> None:
    """A 5.10 kernel: no type files, nothing on the command line, the build default DMA."""
    for path in root.path("/sys/kernel/iommu_groups").glob("*/type"):
        path.unlink()
    root.write("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-5.10.0-30-amd64 root=/dev/sda1 ro\n")
    root.write("/proc/sys/kernel/osrelease", "5.10.0-30-amd64\n")
    root.write("/boot/config-5.10.0-30-amd64", "CONFIG_IOMMU_SUPPORT=y\n"
               "# CONFIG_IOMMU_DEFAULT_PASSTHROUGH is not set\n")
    passthrough_dropped(root)  # nor in the configured line (else passthrough is pending)


PENDING_BLS = built(lambda: build_next_boot(NextBootSpec(boot="bls")), "next-boot-bls")

CASES = [
    Case("8-GPU box: translated groups and amd_iommu=pt", Status.WARN, base=BOX, fixed=True,
         after=Status.WARN),
    Case("8-GPU box: latency profile fails translation", Status.FAIL, base=BOX,
         options=(("translated", "fail"),)),
    Case("8-GPU box in passthrough", Status.PASS, base=CLEAN_BOX),
    Case("kernel before 5.11: translation inferred", Status.WARN, before_5_11, base=CLEAN_BOX,
         fixed=True, after=Status.WARN),
    Case("DGX H100 with the IOMMU off", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("8x MI300X in passthrough", Status.PASS, base=base(mi300x, "mi300x")),
    Case("GH200 kept translated on arm-smmu-v3 before 6.11", Status.PASS, base=GH200),
    Case("GH200 in passthrough before 6.11", Status.WARN, identity_groups, base=GH200,
         fixed=True, after=Status.WARN),
    Case("KVM guest", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
    Case("H200 VM capture", Status.SKIP, base=capture("h200")),
    # Rule 4: passthrough configured for the next boot is pending a reboot, never a failure
    # nor a second token; passthrough the next boot drops is a finding now.
    Case("passthrough in the next kernel's BLS entry: pending a reboot", Status.WARN,
         base=PENDING_BLS),
    Case("passthrough pending a reboot is no failure under the latency profile", Status.WARN,
         base=PENDING_BLS, options=(("translated", "fail"),)),
    Case("passthrough booted but no longer configured", Status.WARN, passthrough_dropped,
         base=CLEAN_BOX, fixed=True),
    # Rule 9: GeForce boards give no peer DMA to translate.
    Case("8 GeForce boards and two RDMA NICs", Status.SKIP, geforce, base=BOX),
]
