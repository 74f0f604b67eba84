"""gpu.memory: ECC and its pending changes, row remapping, retired pages, the recovery action.

Judged on what the driver reports (auditor.checks.lib.gpustate): NVML where the
``host-auditor[nvml]`` extra is installed, else ``nvidia-smi -q -x``, or a capture's copy of
either. This check also owns the GPU state's failures: a collector that hung or died, a
driver that does not answer, a GPU that is lost; the other ``gpu.*`` checks skip and point
here.

Rules (NVIDIA's memory error management, DCGM's limits):

- the driver's recovery action (NVML field 230, nvidia-smi's "GPU Recovery Action", R575+)
  other than None: fail, the driver says what to do (DCGM ``checkGpuRecoveryState``);
- row remapping failure: fail, an RMA candidate; more than 512 uncorrectable remapped rows
  (DCGM ``DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE``): fail;
- volatile uncorrectable ECC errors (since the driver loaded): fail. Aggregate counts alone
  never fail: they survive RMA and refurbishment;
- a row remapping pending: warn, reset when drained ("unaffected applications can continue
  running ... and new workloads can be launched", NVIDIA's error-recovery page; AzNHC fails
  here, which drains healthy GPUs);
- ECC or MIG mode pending a change (current differs from pending): warn, a reset applies it;
- retired pages (pre-Ampere): fail at the driver's limit (DCGM's 63), warn while a
  retirement is pending;
- ECC off on a data-center GPU: warn (``ecc = "required"`` fails); consumer and workstation
  GPUs ship without it.

Sources: https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html,
https://docs.nvidia.com/deploy/nvml-api/api/structnvmlRemappedRowsInfo__v2__t.html,
NVIDIA/DCGM common/DcgmGPUHardwareLimits.h and nvvs/src/Software.cpp,
Azure/azurehpc-health-checks customTests/azure_gpu_ecc.nhc.
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
from auditor.model import Finding, Severity, Status

if TYPE_CHECKING:
    from auditor.checks.lib import gpustate

#: DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE.
MAX_REMAP_UNCORRECTABLE = 512
STATE_SUBJECT = "gpu-state"


class GpuMemoryOptions(CheckOptions):
    """Options of ``gpu.memory``."""

    ecc: str = option("preferred", choices=("required", "preferred", "any"),
                      help="ECC on data-center GPUs: required (off fails), preferred (off "
                      "warns) or any")
    retired_pages_limit: int = option(63, minimum=1, maximum=1024,
                                      help="retired pages (pre-Ampere) at which a GPU fails")


class GpuMemory(Check[GpuMemoryOptions]):
    """GPU memory must be healthy: ECC on, no uncorrectable errors, no remapping failure."""

    id: ClassVar[str] = "gpu.memory"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (*gpufiles.READS, *pci.DEVICE_READS,
                                        *ENVIRONMENT_READS)
    rationale: ClassVar[str] = (
        "A GPU whose memory failed corrupts or kills every job placed on it: uncorrectable "
        "ECC errors, a row remapping that failed, a recovery action the driver asks for. "
        "DCGM, GPUd and AzNHC drain such GPUs; a pre-flight gate that reads only files clears "
        "them. ECC or MIG changes pending a reset change the GPU under the next job."
    )
    remedy: ClassVar[str] = (
        "No host-side script: drain the node, then reset the GPU (nvidia-smi -r -i BUS) or "
        "reboot for pending remaps and mode changes; a remapping failure or uncorrectable "
        "errors that return mean an RMA. ECC is turned on with nvidia-smi -i BUS -e 1, "
        "applied by the next reset."
    )
    options_type: ClassVar[type[CheckOptions]] = GpuMemoryOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        from auditor.checks.lib import gpustate

        current = gpustate.state(host)
        env = environment(host)
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        problem = gpustate.unavailable(host, current, env.in_container, len(gpus))
        if problem is not None:
            yield self._state_finding(problem, current)
            return
        assert current is not None
        for gpu in current.gpus:
            yield self._judge(gpu, current)

    def _state_finding(self, problem: gpustate.Unavailable,
                       current: gpustate.GpuState | None) -> Finding:
        evidence = {"source": current.source, "path": current.path} if current else {}
        if current is not None and current.error is not None:
            evidence["error"] = current.error[0]
        if problem.status == "fail":
            return self.failed(STATE_SUBJECT, problem.message, fix=problem.fix,
                               severity=Severity.CRITICAL, observed=evidence.get("error", ""),
                               expected="the driver answers", evidence=evidence)
        if problem.status == "error":
            return self.finding(Status.ERROR, STATE_SUBJECT, problem.message,
                                observed=evidence.get("error", ""), evidence=evidence)
        return self.skipped(STATE_SUBJECT, problem.message, evidence=evidence)

    def _judge(self, gpu: gpustate.Gpu, current: gpustate.GpuState) -> Finding:
        from auditor.checks.lib.gpustate import is_datacenter

        subject = gpu.label
        ev: dict[str, str] = {"name": gpu.name, "source": current.source,
                              "driver": current.driver}
        if gpu.error is not None:
            kind, message = gpu.error
            return self.failed(
                subject, f"{gpu.name or 'the GPU'} {subject}: the driver reports it "
                f"{'lost' if kind == 'gpu_lost' else 'in need of a reset'} ({message[:200]}): "
                "every job on it fails", severity=Severity.CRITICAL, observed=kind,
                expected="the GPU answers", evidence={**ev, "error": message[:300]},
                fix=f"drain the node, then nvidia-smi -r -i {subject} or reboot; RMA if it "
                "comes back")
        for key, value in (("ecc_mode", f"{gpu.ecc_current}/{gpu.ecc_pending}"),
                           ("ecc_uncorrectable_volatile", gpu.ecc_unc_volatile),
                           ("ecc_uncorrectable_aggregate", gpu.ecc_unc_aggregate),
                           ("remapped_rows", f"{gpu.remap_corr}/{gpu.remap_unc}/"
                                             f"{gpu.remap_pending}/{gpu.remap_failure}"),
                           ("retired_pages", f"{gpu.retired_sbe}/{gpu.retired_dbe}/"
                                             f"{gpu.retired_pending}"),
                           ("recovery_action", gpu.recovery_action),
                           ("mig_mode", f"{gpu.mig_current}/{gpu.mig_pending}")):
            ev[key] = str(value)
        fails: list[str] = []
        warns: list[str] = []
        fixes: list[str] = []
        notes: list[str] = []
        reset = f"nvidia-smi -r -i {subject}"
        if gpu.recovery_action and gpu.recovery_action != "None":
            fails.append(f"the driver's recovery action is '{gpu.recovery_action}'")
            fixes.append(f"drain the node and do what the driver asks ({gpu.recovery_action}: "
                         f"{reset}, or a reboot)")
        if gpu.remap_failure:
            fails.append("a row remapping failed (an RMA candidate)")
            fixes.append("drain the GPU and open an RMA")
        if gpu.remap_unc is not None and gpu.remap_unc > MAX_REMAP_UNCORRECTABLE:
            fails.append(f"{gpu.remap_unc} rows remapped for uncorrectable errors (more than "
                         f"{MAX_REMAP_UNCORRECTABLE})")
            fixes.append("drain the GPU and open an RMA")
        if gpu.ecc_unc_volatile:
            fails.append(f"{gpu.ecc_unc_volatile} uncorrectable ECC error(s) since the driver "
                         "loaded")
            fixes.append(f"drain the node, then {reset} or reboot; RMA if they return")
        retired = (gpu.retired_sbe or 0) + (gpu.retired_dbe or 0)
        if retired >= self.options.retired_pages_limit:
            fails.append(f"{retired} pages retired (the limit is "
                         f"{self.options.retired_pages_limit})")
            fixes.append("drain the GPU and open an RMA")
        if gpu.remap_pending:
            warns.append("a row remapping is pending: it takes effect at the next GPU reset "
                         "(running and new work can continue)")
            fixes.append(f"when the GPU is drained: {reset}")
        if gpu.retired_pending:
            warns.append("a page retirement is pending the next driver reload")
            fixes.append(f"when the GPU is drained: {reset} or reboot")
        if gpu.ecc_current is not None and gpu.ecc_pending is not None \
                and gpu.ecc_current != gpu.ecc_pending:
            warns.append(f"ECC is {'on' if gpu.ecc_current else 'off'} but "
                         f"{'on' if gpu.ecc_pending else 'off'} is pending a reset")
            fixes.append(f"apply it at the next window: {reset} or reboot")
        if gpu.mig_current is not None and gpu.mig_pending is not None \
                and gpu.mig_current != gpu.mig_pending:
            warns.append(f"MIG is {'on' if gpu.mig_current else 'off'} but "
                         f"{'on' if gpu.mig_pending else 'off'} is pending a reset")
            fixes.append(f"apply it at the next window: {reset} or reboot")
        if gpu.ecc_current is False and is_datacenter(gpu) \
                and gpu.ecc_pending is not True and self.options.ecc != "any":
            text = "ECC is off on a data-center GPU: memory errors go undetected"
            (fails if self.options.ecc == "required" else warns).append(text)
            fixes.append(f"nvidia-smi -i {subject} -e 1, then {reset} or reboot")
        if gpu.ecc_unc_aggregate and not gpu.ecc_unc_volatile:
            notes.append(f"{gpu.ecc_unc_aggregate} uncorrectable error(s) in the GPU's "
                         "lifetime (aggregate counts survive RMA; not judged)")
        unsupported = [name for name, values in (
            ("ECC", (gpu.ecc_current,)),
            ("row remapping", (gpu.remap_pending, gpu.remap_failure)),
            ("retired pages", (gpu.retired_sbe, gpu.retired_pending)),
            ("recovery action", (gpu.recovery_action,))) if all(v is None for v in values)]
        if unsupported:
            ev["not_supported"] = ", ".join(unsupported)
        if gpu.denied:
            ev["denied"] = ", ".join(f"{a}: {k}" for a, k in gpu.denied)
        name = gpu.name or "GPU"
        if fails or warns:
            status = Status.FAIL if fails else Status.WARN
            message = f"{name} {subject}: " + "; ".join(fails + warns + notes)
            return self.finding(status, subject, message, observed="; ".join(fails + warns)[:300],
                                expected="healthy memory", evidence=ev,
                                fix="; ".join(dict.fromkeys(fixes)))
        if gpu.ecc_current is None and gpu.remap_pending is None and gpu.retired_sbe is None \
                and gpu.recovery_action is None:
            return self.skipped(subject, f"{name} {subject}: the driver reports no memory "
                                "error state for this GPU (ECC, row remapping, retired pages "
                                "not supported)", evidence=ev)
        said = [f"ECC {'on' if gpu.ecc_current else 'off' if gpu.ecc_current is False else 'n/a'}"]
        if gpu.remap_pending is not None:
            said.append(f"{gpu.remap_unc or 0} rows remapped for uncorrectable errors, none "
                        "pending or failed")
        if gpu.retired_sbe is not None:
            said.append(f"{retired} pages retired")
        if gpu.ecc_unc_volatile is not None:
            said.append("no uncorrectable ECC error since the driver loaded")
        return self.passed(subject, f"{name} {subject}: " + ", ".join(said + notes)
                           + (f" ({', '.join(unsupported)}: not supported)" if unsupported
                              else ""), observed="healthy", evidence=ev)
