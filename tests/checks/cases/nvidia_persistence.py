"""nvidia.persistence: the daemon running with persistence on, in no-persistence mode, stopped,
absent, not started at boot; judged from its command line or its unit."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "nvidia.persistence"
UNIT = "/lib/systemd/system/nvidia-persistenced.service"


def no_cmdline(root: Sysroot) -> None:
    root.remove("/proc/2417/cmdline")


def enableable_without_udev(root: Sysroot) -> None:
    root.remove("/lib/udev/rules.d/71-nvidia.rules")
    root.write(UNIT, root.read(UNIT) + "\n[Install]\nWantedBy=multi-user.target\n")


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "podman\n")


CASES = [
    Case("running with persistence on, started by the driver's udev rule", Status.PASS,
         base=driver_host()),
    Case("running, its command line not collected: the unit tells", Status.PASS, no_cmdline,
         base=driver_host()),
    Case("running with --no-persistence-mode: a drop-in, pending a restart", Status.WARN,
         base=driver_host(DriverSpec(persistenced="no-persistence")), fixed=True,
         after=Status.WARN),
    Case("--no-persistence-mode from the unit, command line not collected", Status.WARN,
         no_cmdline, base=driver_host(DriverSpec(persistenced="no-persistence")), fixed=True,
         after=Status.PASS),
    Case("installed but not running", Status.WARN,
         base=driver_host(DriverSpec(persistenced="stopped"))),
    Case("stopped, its package held at another driver version: the cause is named",
         Status.WARN, base=driver_host(DriverSpec(persistenced="stopped", held=True,
                                                  persistenced_version="580.82.07"))),
    Case("stopped, its package at the driver's version", Status.WARN,
         base=driver_host(DriverSpec(persistenced="stopped", persistenced_version="580.95.05"))),
    Case("running, its package at the driver's version", Status.PASS,
         base=driver_host(DriverSpec(persistenced_version="580.95.05"))),
    Case("not installed", Status.WARN, base=driver_host(DriverSpec(persistenced="absent"))),
    Case("running, but nothing starts it at boot: the unit is enabled", Status.WARN,
         enableable_without_udev, base=driver_host(), fixed=True),
    Case("inside a container: persistence is the host's", Status.SKIP, container,
         base=driver_host()),
]
