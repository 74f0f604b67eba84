"""lxc.device_majors: no containers, a stale uvm major, a container allowed as it is now."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.plant import LXC_CONFIG, plant_lxc
from tests.support.sysroot import Sysroot

CHECK = "lxc.device_majors"


def current(root: Sysroot) -> None:
    root.write("/etc/pve/lxc/101.conf", LXC_CONFIG.replace("c 509:* rwm", "c 238:* rwm"))


CASES = [
    Case("no containers", Status.SKIP),
    Case("Proxmox container allows the old nvidia-uvm major", Status.FAIL, plant_lxc,
         fixed=True),
    Case("Proxmox container allows the current major", Status.PASS, current),
]
