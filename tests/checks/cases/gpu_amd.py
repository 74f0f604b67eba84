"""gpu.amd: amdgpu's RAS counters, bad pages and partition modes, from sysfs."""

from collections.abc import Callable

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "gpu.amd"
GPU = "/sys/bus/pci/devices/0000:1f:00.0"
AMD = driver_host(DriverSpec(gpus=0, amd_gpus=1))


def ras(umc: str = "ue: 0\nce: 3\n", pages: str = "", compute: str = "SPX"
        ) -> Callable[[Sysroot], None]:
    def plant(root: Sysroot) -> None:
        root.write(f"{GPU}/ras/umc_err_count", umc)
        root.write(f"{GPU}/ras/gfx_err_count", "ue: 0\nce: 0\n")
        root.write(f"{GPU}/ras/gpu_vram_bad_pages", pages)
        root.write(f"{GPU}/current_compute_partition", compute + "\n")
        root.write(f"{GPU}/current_memory_partition", "NPS1\n")
    return plant


CASES = [
    Case("MI300X, correctable errors only", Status.PASS, ras(), base=AMD),
    Case("uncorrectable UMC errors", Status.FAIL, ras(umc="ue: 2\nce: 9\n"), base=AMD),
    Case("a bad page that could not be retired", Status.FAIL,
         ras(pages="0x00000001 : 0x00001000 : R\n0x00000002 : 0x00001000 : F\n"), base=AMD),
    Case("a bad page pending retirement", Status.WARN,
         ras(pages="0x00000003 : 0x00001000 : P\n"), base=AMD),
    Case("CPX where the policy wants SPX", Status.WARN, ras(compute="CPX"), base=AMD,
         options=(("compute_partition", "SPX"),)),
    Case("no RAS exposed", Status.SKIP, base=AMD),
    Case("no AMD GPU", Status.SKIP),
]
