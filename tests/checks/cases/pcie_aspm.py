"""pcie.aspm: L1 on GPU links and uplinks, suspending ports, the policy, firmware's ASPM."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.classes import PcieBoxSpec, base, dgx_h100, kvm_guest, pcie_box
from tests.support.sysroot import Sysroot

CHECK = "pcie.aspm"

CLEAN = PcieBoxSpec(aspm=False)


def firmware_aspm(root: Sysroot) -> None:
    """pcie_aspm=off with firmware's L1 left on the GPU links: no link/ attributes."""
    text = root.read("/proc/cmdline").strip()
    root.write("/proc/cmdline", text + " pcie_aspm=off\n")
    for path in root.path("/sys/devices").rglob("link"):
        for item in path.iterdir():
            item.unlink()
        path.rmdir()


CASES = [
    Case("8-GPU box: L1 on the GPU links and an uplink, two ports suspending", Status.WARN,
         base=base(pcie_box, "pcie-box"), fixed=True),
    Case("8-GPU box: ASPM off, ports awake", Status.PASS, base=base(lambda: pcie_box(CLEAN),
                                                                    "pcie-box-clean")),
    Case("powersave policy", Status.WARN,
         base=base(lambda: pcie_box(PcieBoxSpec(aspm=False, aspm_policy="powersave")),
                   "pcie-box-powersave"), fixed=True, after=Status.WARN),
    Case("pcie_aspm=off leaves firmware's L1 on", Status.WARN, firmware_aspm,
         base=base(pcie_box, "pcie-box"), fixed=True),
    Case("DGX H100", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("KVM guest", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
]
