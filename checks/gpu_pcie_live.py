"""gpu.pcie_live: the PCIe link as the driver trained it, against what the GPU and slot allow.

- A width below the maximum (NVML ``nvmlDeviceGetMaxPcieLinkWidth``: the device and the
  system together) fails at any time: a GPU lowers its link speed when idle, never its
  width. The maximum is the platform's, not 16: an instance given fewer lanes by design is
  not failed (DCGM's x16 default does, aws/aws-k8s-tester PR #806).
- The generation is judged only under load (GPU utilisation at or above ``busy_percent``):
  an idle GPU trains down to save power.
- A slot, riser or BIOS that caps the link below what the GPU supports (nvidia-smi's "Max"
  below "Device Max") warns.
- The replay counter is shown; a rate needs two samples (the probe's run).

Sources: NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp, nvvs/diag-skus.yaml.in; the
H200's Gen5 x16 at idle, during copies and under matmul (next-wave-device.json).
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


class GpuPcieLiveOptions(CheckOptions):
    """Options of ``gpu.pcie_live``."""

    busy_percent: int = option(50, minimum=1, maximum=100,
                               help="GPU utilisation at which the link generation is judged")


class GpuPcieLive(Check[GpuPcieLiveOptions]):
    """The GPU's PCIe link must run at its full width, and at full speed under load."""

    id: ClassVar[str] = "gpu.pcie_live"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (*gpufiles.READS, *pci.DEVICE_READS,
                                        *ENVIRONMENT_READS)
    rationale: ClassVar[str] = (
        "A GPU link trained at x8 halves host-to-device bandwidth for every model load and "
        "KV-cache transfer; a slot or riser that caps the generation does the same. The "
        "driver reports the link it trained; files show only what the port advertises."
    )
    remedy: ClassVar[str] = (
        "Reseat the GPU, check the riser and the slot's BIOS link settings; no software fix "
        "(ASPM and MaxReadReq are pcie.aspm's and pcie.mrrs')."
    )
    options_type: ClassVar[type[CheckOptions]] = GpuPcieLiveOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.PCI})

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
        ev = {"gen": f"{gpu.pcie_gen_current}/{gpu.pcie_gen_max}/{gpu.pcie_gen_device_max}",
              "width": f"{gpu.pcie_width_current}/{gpu.pcie_width_max}",
              "replay_counter": str(gpu.pcie_replay), "gpu_util": str(gpu.gpu_util)}
        if gpu.pcie_width_current is None and gpu.pcie_gen_current is None:
            return self.skipped(subject, f"{name} {subject}: the driver reports no PCIe link "
                                "(not supported here)", evidence=ev)
        fails: list[str] = []
        warns: list[str] = []
        notes: list[str] = []
        if gpu.pcie_width_current is not None and gpu.pcie_width_max \
                and gpu.pcie_width_current < gpu.pcie_width_max:
            fails.append(f"link width x{gpu.pcie_width_current}, below its maximum "
                         f"x{gpu.pcie_width_max}")
        busy = gpu.gpu_util is not None and gpu.gpu_util >= self.options.busy_percent
        if gpu.pcie_gen_current is not None and gpu.pcie_gen_max \
                and gpu.pcie_gen_current < gpu.pcie_gen_max:
            if busy:
                fails.append(f"link at Gen{gpu.pcie_gen_current} under load ({gpu.gpu_util}% "
                             f"busy), below Gen{gpu.pcie_gen_max}")
            else:
                notes.append(f"Gen{gpu.pcie_gen_current} now (idle GPUs lower the link speed; "
                             "judged under load only)")
        if gpu.pcie_gen_max and gpu.pcie_gen_device_max \
                and gpu.pcie_gen_max < gpu.pcie_gen_device_max:
            warns.append(f"the slot, riser or BIOS caps the link at Gen{gpu.pcie_gen_max}; the "
                         f"GPU supports Gen{gpu.pcie_gen_device_max}")
        fix = "reseat the GPU; check the riser and the BIOS link speed and width"
        if fails:
            return self.failed(subject, f"{name} {subject}: " + "; ".join(fails + warns + notes),
                               observed="; ".join(fails)[:300], expected="full link",
                               evidence=ev, fix=fix)
        if warns:
            return self.warned(subject, f"{name} {subject}: " + "; ".join(warns + notes),
                               observed="; ".join(warns)[:300], expected="full link",
                               evidence=ev, fix=fix)
        said = (f"Gen{gpu.pcie_gen_current} x{gpu.pcie_width_current} of "
                f"Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max}")
        return self.passed(subject, f"{name} {subject}: link {said}"
                           + (f"; {'; '.join(notes)}" if notes else "")
                           + (f"; {gpu.pcie_replay} replays" if gpu.pcie_replay else ""),
                           observed=said, evidence=ev)
