"""nvidia.fabricmanager: NVSwitch nodes with fabric manager running at the driver's version,
stopped, missing, mismatched, not enabled; nodes without NVSwitch."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "nvidia.fabricmanager"
WANTS = "/etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"


def not_enabled(root: Sysroot) -> None:
    root.remove(WANTS)


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "lxc\n")


def hgx(**kw: object) -> DriverSpec:
    return DriverSpec(nvswitches=4, **kw)  # type: ignore[arg-type]


CASES = [
    Case("no NVSwitch", Status.SKIP, base=driver_host()),
    Case("HGX: fabric manager 580.95.05 runs with driver 580.95.05", Status.PASS,
         base=driver_host(hgx(fabricmanager="running"))),
    Case("HGX: fabric manager installed, not running", Status.FAIL,
         base=driver_host(hgx(fabricmanager="stopped"))),
    Case("HGX: fabric manager not installed", Status.FAIL, base=driver_host(hgx())),
    Case("HGX: fabric manager 570 against driver 580", Status.FAIL,
         base=driver_host(hgx(fabricmanager="running", fabricmanager_version="570.172.08"))),
    Case("HGX: running but not enabled at boot", Status.WARN, not_enabled,
         base=driver_host(hgx(fabricmanager="running")), fixed=True),
    Case("inside a container", Status.SKIP, container,
         base=driver_host(hgx(fabricmanager="running"))),
]
