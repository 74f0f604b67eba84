"""numa.balancing: single node, on at runtime, off now but not at boot, no knob."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.plant import add_node, plant_numa
from tests.support.sysroot import Sysroot

CHECK = "numa.balancing"


def off_now_not_at_boot(root: Sysroot) -> None:
    add_node(root, 1)
    root.write("/proc/sys/kernel/numa_balancing", "0\n")


def off_now_and_at_boot(root: Sysroot) -> None:
    off_now_not_at_boot(root)
    root.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")


def no_knob(root: Sysroot) -> None:
    root.remove("/proc/sys/kernel/numa_balancing")


CASES = [
    Case("one node: nothing to migrate", Status.PASS),
    Case("two nodes, off now and in sysctl.d", Status.PASS, off_now_and_at_boot),
    Case("two nodes, on, a sysctl.d file sets 1", Status.FAIL, plant_numa, fixed=True),
    Case("two nodes, off now, nothing keeps it off at boot", Status.WARN,
         off_now_not_at_boot, fixed=True),
    Case("kernel without NUMA balancing", Status.SKIP, no_knob, base=capture("virtio")),
]
