"""rdma.peermem: GPUs and RDMA NICs with DMA-BUF (open module, kernel 5.12+), with
nvidia_peermem loaded (at boot or not), or with neither."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "rdma.peermem"


def at_boot(root: Sysroot) -> None:
    root.write("/etc/modules-load.d/peermem.conf", "nvidia_peermem\n")


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "docker\n")


CASES = [
    Case("no RDMA NIC", Status.SKIP, base=driver_host()),
    Case("open module on 6.8: DMA-BUF", Status.PASS,
         base=driver_host(DriverSpec(rdma_nics=8))),
    Case("proprietary module, no nvidia_peermem: loaded at boot from now on", Status.WARN,
         base=driver_host(DriverSpec(rdma_nics=8, flavour="proprietary")), fixed=True,
         after=Status.WARN),
    Case("proprietary module, nvidia_peermem loaded and loaded at boot", Status.PASS, at_boot,
         base=driver_host(DriverSpec(rdma_nics=8, flavour="proprietary", peermem=True))),
    Case("nvidia_peermem loaded now, not at boot", Status.WARN,
         base=driver_host(DriverSpec(rdma_nics=8, flavour="proprietary", peermem=True)),
         fixed=True),
    Case("inside a container", Status.SKIP, container,
         base=driver_host(DriverSpec(rdma_nics=8, flavour="proprietary"))),
]
