"""pcie.aer: uncorrectable errors on the path, a correctable storm, no AER statistics."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.classes import PcieBoxSpec, base, kvm_guest, mi300x, pcie_box
from tests.support.sysroot import Sysroot

CHECK = "pcie.aer"

CLEAN = base(lambda: pcie_box(PcieBoxSpec(aer=False)), "pcie-box-clean")
GPU = "/sys/bus/pci/devices/0000:44:00.0"


def bad_tlp_storm(root: Sysroot) -> None:
    """Correctable errors only: 250 Bad TLP on one GPU in a day."""
    text = root.read(f"{GPU}/aer_dev_correctable")
    root.write(f"{GPU}/aer_dev_correctable", text.replace("BadTLP 0", "BadTLP 250")
               .replace("TOTAL_ERR_COR 0", "TOTAL_ERR_COR 250"))


def boot_time_rx_errors(root: Sysroot) -> None:
    """A few Receiver Errors at link training, on a host up for five minutes."""
    root.write("/proc/uptime", "300.00 2400.00\n")
    text = root.read(f"{GPU}/aer_dev_correctable")
    root.write(f"{GPU}/aer_dev_correctable", text.replace("RxErr 0", "RxErr 12")
               .replace("TOTAL_ERR_COR 0", "TOTAL_ERR_COR 12"))


CASES = [
    Case("8-GPU box: Surprise Down above a GPU, completion timeouts", Status.FAIL,
         base=base(pcie_box, "pcie-box")),
    Case("Bad TLP storm on one GPU", Status.WARN, bad_tlp_storm, base=CLEAN),
    Case("Receiver Errors at link training are not a rate", Status.PASS, boot_time_rx_errors,
         base=CLEAN),
    Case("no errors", Status.PASS, base=CLEAN),
    Case("no AER statistics (kernel without PCIe AER)", Status.SKIP,
         base=base(lambda: pcie_box(PcieBoxSpec(aer_files=False)), "pcie-box-ffs")),
    Case("8x MI300X", Status.PASS, base=base(mi300x, "mi300x")),
    Case("KVM guest", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
]
