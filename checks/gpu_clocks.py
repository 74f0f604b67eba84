"""gpu.clocks: what holds the GPU's clocks back: hardware slowdown, thermal, caps set by hand.

Judged on the driver's clocks-event reasons (NVML ``nvmlClocksEventReasons``, nvidia-smi's
"Clocks Event Reasons", "Clocks Throttle Reasons" before R535):

- the cumulative counters where the driver has them (nvidia-smi's "Clocks Event Reasons
  Counters", NVML fields 269-271, time since the driver loaded): time spent in HW
  slowdown, HW power brake or HW thermal slowdown warns, with the seconds, and so does SW
  thermal slowdown; without counters, a hardware reason active at the sample warns;
- SW power cap is never judged: under load it is the normal state of a fully loaded GPU
  (the H200 read 0x4 at 691 W of 700 W during a bf16 matmul, next-wave-device.json), and a
  bitmask is never compared whole (AzNHC's azure_gpu_clock_throttling.nhc warns on
  idle + power cap, 0x5);
- a power limit below 95% of the default, or application clocks below their default: warn
  (someone capped the GPU; a deliberate cap is waived by policy).

Sources: https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html;
leptonai/gpud components/accelerator/nvidia/hw-slowdown; Azure/azurehpc-health-checks
customTests/azure_gpu_clock_throttling.nhc, azure_gpu_app_clocks.nhc.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import nvidia, pci
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts import gpufiles
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

if TYPE_CHECKING:
    from auditor.checks.lib import gpustate

HW_COUNTERS = {"hw_thermal_slowdown": "HW thermal slowdown",
               "hw_power_brake": "HW power brake (the PSU or chassis asserted it)"}
HW_BITS = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
           "hw_power_brake_slowdown": "HW power brake slowdown"}


class GpuClocksOptions(CheckOptions):
    """Options of ``gpu.clocks``."""

    power_limit_ratio: float = option(0.95, minimum=0.1, maximum=1.0,
                                      help="the lowest power limit, as a share of the default, "
                                      "that passes")


class GpuClocks(Check[GpuClocksOptions]):
    """GPU clocks must not be held back by hardware slowdown, thermals or a cap set by hand."""

    id: ClassVar[str] = "gpu.clocks"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (*gpufiles.READS, *pci.DEVICE_READS,
                                        *ENVIRONMENT_READS)
    rationale: ClassVar[str] = (
        "A GPU slowed by its hardware (thermal, power brake) or capped below its default "
        "power limit or application clocks serves fewer tokens per second, and no file shows "
        "it: only the driver's clocks-event reasons and limits do."
    )
    remedy: ClassVar[str] = (
        "Power limit: nvidia-smi -i BUS -pl DEFAULT; application clocks: nvidia-smi -i BUS "
        "-rac. Hardware slowdown has no software fix: check cooling, airflow and the power "
        "supply."
    )
    options_type: ClassVar[type[CheckOptions]] = GpuClocksOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        from auditor.checks.lib import gpustate

        current = gpustate.state(host)
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        problem = gpustate.unavailable(host, current, environment(host).in_container, len(gpus))
        if problem is not None or current is None:
            yield self.skipped("gpu-state", gpustate.skip_reason(problem)
                               if problem else "no GPU state")
            return
        for gpu in current.gpus:
            yield self._judge(gpu)

    def _judge(self, gpu: gpustate.Gpu) -> Finding:
        subject = gpu.label
        name = gpu.name or "GPU"
        if gpu.error is not None:
            return self.skipped(subject, f"{name} {subject}: {gpu.error[0]} (gpu.memory)")
        counters = gpu.counters()
        ev = {"reasons_active": ",".join(gpu.reasons_active or ()),
              "power_limit_w": str(gpu.power_limit_w), "power_default_w": str(gpu.power_default_w),
              "app_clock_graphics": str(gpu.app_clock_graphics),
              "app_clock_default_graphics": str(gpu.app_clock_default_graphics),
              **{f"counter.{k}_us": str(v) for k, v in counters.items()}}
        problems: list[str] = []
        fixes: list[str] = []
        if counters:
            for key, words in HW_COUNTERS.items():
                if counters.get(key, 0) > 0:
                    problems.append(f"{words} for {counters[key] / 1e6:.1f} s since the driver "
                                    "loaded")
            if counters.get("sw_thermal_slowdown", 0) > 0:
                problems.append(f"SW thermal slowdown for "
                                f"{counters['sw_thermal_slowdown'] / 1e6:.1f} s since the "
                                "driver loaded (above its max operating temperature)")
            if problems:
                fixes.append("check cooling, airflow and the power supply")
        active = set(gpu.reasons_active or ())
        now = [words for bit, words in HW_BITS.items() if bit in active]
        if now:
            problems.append(f"{', '.join(now)} active now")
            fixes.append("check cooling, airflow and the power supply")
        limit = gpu.power_enforced_w or gpu.power_limit_w
        if limit is not None and gpu.power_default_w and \
                limit < gpu.power_default_w * self.options.power_limit_ratio:
            problems.append(f"power limit {limit:g} W, below the default "
                            f"{gpu.power_default_w:g} W")
            fixes.append(f"nvidia-smi -i {subject} -pl {gpu.power_default_w:g}")
        if gpu.app_clock_graphics is not None and gpu.app_clock_default_graphics is not None \
                and gpu.app_clock_graphics < gpu.app_clock_default_graphics:
            problems.append(f"application clocks {gpu.app_clock_graphics} MHz, below the "
                            f"default {gpu.app_clock_default_graphics} MHz")
            fixes.append(f"nvidia-smi -i {subject} -rac")
        if problems:
            return self.warned(subject, f"{name} {subject}: " + "; ".join(problems),
                               observed="; ".join(problems)[:300], expected="full clocks",
                               evidence=ev, fix="; ".join(dict.fromkeys(fixes)))
        said = ("no hardware slowdown since the driver loaded" if counters else
                "no hardware slowdown now (the driver keeps no counters)")
        if "sw_power_cap" in active:
            said += "; SW power cap active (normal under load)"
        if limit is not None and gpu.power_default_w:
            said += f"; power limit {limit:g} W of {gpu.power_default_w:g} W default"
        return self.passed(subject, f"{name} {subject}: {said}", observed="full clocks",
                           evidence=ev)
