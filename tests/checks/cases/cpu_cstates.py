"""cpu.cstates: no cpuidle in a VM, haltpoll, intel_idle with C6 enabled."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.plant import plant_cstates
from tests.support.sysroot import Sysroot

CHECK = "cpu.cstates"


def c6_disabled(root: Sysroot) -> None:
    plant_cstates(root)
    for cpu in range(16):
        root.write(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state3/disable", "1\n")


CASES = [
    Case("cpuidle driver none (a VM)", Status.SKIP),
    Case("haltpoll guest driver", Status.PASS, base=capture("virtio")),
    Case("intel_idle with C6 enabled", Status.FAIL, plant_cstates, fixed=True),
    Case("intel_idle with C6 disabled", Status.PASS, c6_disabled),
    Case("latency profile: C1E too deep", Status.FAIL, c6_disabled,
         options=(("max_exit_latency_us", 2),)),
]
