"""cpu.governor: a VM without cpufreq, ramping governors, performance everywhere."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.plant import CPUFREQ, plant_cpufreq
from tests.support.sysroot import Sysroot

CHECK = "cpu.governor"


def performance(root: Sysroot) -> None:
    plant_cpufreq(root)
    for cpu in range(16):
        root.write(f"{CPUFREQ}/policy{cpu}/scaling_governor", "performance\n")


def epp_driver(root: Sysroot) -> None:
    plant_cpufreq(root, driver="amd-pstate-epp", epp=True)


def boost_off(root: Sysroot) -> None:
    performance(root)
    root.write(f"{CPUFREQ}/boost", "0\n")


CASES = [
    Case("no cpufreq (a VM)", Status.SKIP),
    Case("performance on every policy", Status.PASS, performance),
    Case("acpi-cpufreq powersave and ondemand", Status.FAIL, plant_cpufreq, fixed=True),
    Case("amd-pstate-epp powersave with a power-leaning EPP", Status.FAIL, epp_driver,
         fixed=True),
    Case("boost off", Status.WARN, boost_off, fixed=True),
]
