"""kernel.version: current kernel and open driver, an old kernel, a pending reboot."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.plant import plant_old_kernel
from tests.support.sysroot import Sysroot

CHECK = "kernel.version"


def reboot_pending(root: Sysroot) -> None:
    root.write("/boot/vmlinuz-6.19.2", "")
    root.write("/lib/modules/6.19.2/modules.dep", "")


CASES = [
    Case("6.18 with the open 580 driver", Status.PASS),
    Case("Debian 12's 6.1 kernel", Status.FAIL, plant_old_kernel),
    Case("a newer kernel waits for a reboot", Status.WARN, reboot_pending),
]
