"""gpu.clocks: clocks-event reasons (counters on R580, the instant bits before), power limit and
application clocks against their defaults."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.smi import H200_NVML, SmiGpu, a100, plant_nvml, plant_smi, v100

CHECK = "gpu.clocks"
ZERO = {"sw_power_cap": 0, "sync_boost": 0, "sw_therm_slowdown": 0, "hw_therm_slowdown": 0,
        "hw_power_brake": 0}

CASES = [
    Case("the lent H200, idle", Status.PASS, plant_smi("580")),
    Case("NVML's state of the lent H200", Status.PASS, plant_nvml(H200_NVML)),
    Case("SW power cap under load (691 W of 700 W): normal", Status.PASS, plant_smi(
        "580", [SmiGpu(reasons_active=("sw_power_cap",), util=100,
                       counters={**ZERO, "sw_power_cap": 91_403_239})])),
    Case("HW thermal slowdown counted since the driver loaded", Status.WARN, plant_smi(
        "580", [SmiGpu(counters={**ZERO, "hw_therm_slowdown": 12_500_000})])),
    Case("HW power brake counted", Status.WARN, plant_smi(
        "580", [SmiGpu(counters={**ZERO, "hw_power_brake": 800_000})])),
    Case("HW slowdown active now, no counters (R535)", Status.WARN,
         plant_smi("535", [a100(reasons_active=("hw_slowdown",))])),
    Case("power limit 550 W of a 700 W default", Status.WARN,
         plant_smi("580", [SmiGpu(power=(550.0, 700.0))])),
    Case("application clocks below the default (R470)", Status.WARN,
         plant_smi("470", [v100(app_clocks=(1005, 1290))])),
]
