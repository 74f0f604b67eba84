"""nvidia.driver: module against userspace (mid-upgrade, GPU Operator), unattended upgrades,
a reboot pending for NVIDIA packages, nouveau."""

from collections.abc import Callable

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "nvidia.driver"
NEW = "580.105.08"


def blacklisted(root: Sysroot) -> None:
    root.write("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\n")


def _status(text: str) -> Callable[[Sysroot], None]:
    def plant(root: Sysroot) -> None:
        root.write("/host-auditor/nvidia-smi.status", text)
    return plant


CASES = [
    Case("GPUs bound to nvidia, the driver says there is no userspace", Status.FAIL,
         _status("exit 127\nnvidia-smi: command not found\n"), base=driver_host()),
    Case("the driver reports a version mismatch the files do not show", Status.FAIL,
         _status("exit 18\nFailed to initialize NVML: Driver/library version mismatch\n"),
         base=driver_host()),
    Case("module and userspace both 580.95.05", Status.PASS, base=driver_host()),
    Case("userspace upgraded to 580.105.08 under the running module, DKMS built it", Status.FAIL,
         base=driver_host(DriverSpec(userspace=NEW, dkms_version={"6.8.0-45-generic": NEW}))),
    Case("the GPU Operator's userspace differs from the loaded module", Status.FAIL,
         base=driver_host(DriverSpec(operator=True, userspace="570.172.08"))),
    Case("userspace installed, no module loaded", Status.FAIL,
         base=driver_host(DriverSpec(module_loaded=False))),
    Case("unattended-upgrades on and the driver packages not kept back", Status.WARN,
         base=driver_host(DriverSpec(unattended=True)), fixed=True),
    Case("unattended-upgrades on, the driver packages held", Status.PASS,
         base=driver_host(DriverSpec(unattended=True, held=True))),
    Case("a reboot is pending for NVIDIA packages", Status.WARN,
         base=driver_host(DriverSpec(reboot_required=("libnvidia-compute-580-server",
                                                      "linux-image-6.8.0-50-generic")))),
    Case("nouveau holds the GPUs: blacklisted, pending a reboot", Status.FAIL,
         base=driver_host(DriverSpec(nouveau=True)), fixed=True, after=Status.WARN),
    Case("nouveau still bound although blacklisted", Status.WARN, blacklisted,
         base=driver_host(DriverSpec(nouveau=True))),
    Case("no NVIDIA GPU or driver", Status.SKIP,
         base=driver_host(DriverSpec(gpus=0, userspace="", uvm_disable_hmm=None))),
]
