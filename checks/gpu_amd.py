"""gpu.amd: AMD GPU memory health and partition mode, from amdgpu's sysfs (no ROCm library).

amdgpu exposes in files what NVIDIA needs NVML for (docs.kernel.org/gpu/amdgpu/ras.html,
drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c), per device:

- ``ras/<block>_err_count``: ``ue: N`` / ``ce: M`` per RAS block (umc, gfx, sdma, ...): an
  uncorrectable error fails;
- ``ras/gpu_vram_bad_pages``: ``0xPAGE : 0xSIZE : FLAG`` per retired page, ``R`` reserved,
  ``P`` pending, ``F`` failed to reserve: a page that could not be reserved, or as many as
  ``amdgpu.bad_page_threshold`` (when set above 0), fails; a pending one warns;
- ``current_compute_partition`` / ``current_memory_partition`` (MI300X SPX/CPX, NPS1/NPS4):
  a mode other than the policy's warns (changing it needs the GPU idle and a reset).

The PyPI ``amdsmi`` binds every ROCm symbol at import and breaks on a mismatched ROCm
(RLinf/RLinf PR #1507): nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import files, pci
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

AMD = 0x1002
THRESHOLD = "/sys/module/amdgpu/parameters/bad_page_threshold"
_COUNT = lazy_re(r"(ue|ce): ?([0-9]{1,15})")
_BAD_PAGE = lazy_re(r"0x[0-9a-fA-F]{1,16} ?: ?0x[0-9a-fA-F]{1,16} ?: ?([RPF])")


class GpuAmdOptions(CheckOptions):
    """Options of ``gpu.amd``."""

    compute_partition: str = option("", help="the compute partition mode wanted (SPX, CPX...; "
                                    "empty: any)")
    memory_partition: str = option("", help="the memory partition mode wanted (NPS1, NPS4...; "
                                   "empty: any)")


class GpuAmd(Check[GpuAmdOptions]):
    """AMD GPUs must have no uncorrectable memory errors and no unreserved bad pages."""

    id: ClassVar[str] = "gpu.amd"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *pci.DEVICE_READS,
        "/sys/bus/pci/devices/*/ras/*_err_count",
        "/sys/bus/pci/devices/*/ras/gpu_vram_bad_pages",
        "/sys/bus/pci/devices/*/ras/features",
        "/sys/bus/pci/devices/*/current_compute_partition",
        "/sys/bus/pci/devices/*/current_memory_partition",
        THRESHOLD,
    )
    rationale: ClassVar[str] = (
        "An AMD Instinct GPU with uncorrectable memory errors, or bad pages its driver could "
        "not retire, corrupts or kills the jobs on it; a partition mode other than the one "
        "the serving stack expects changes how many devices it sees."
    )
    remedy: ClassVar[str] = (
        "Drain the GPU and reset it (amd-smi reset -G -g N) or reboot; pages that could not "
        "be retired or a threshold reached mean an RMA. Partition modes are set with amd-smi "
        "set --compute-partition / --memory-partition on an idle GPU."
    )
    options_type: ClassVar[type[CheckOptions]] = GpuAmdOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        gpus = [d for d in pci.devices(host) if d.is_gpu and d.vendor == AMD
                and d.driver == "amdgpu"]
        if not gpus:
            yield self.skipped("amdgpu", "no AMD GPU bound to amdgpu")
            return
        threshold_text = files.read_optional(host, THRESHOLD)
        try:
            threshold = int((threshold_text or "")[:12]) if threshold_text else None
        except ValueError:
            threshold = None
        for gpu in gpus:
            yield self._judge(host, gpu.address, threshold)

    def _judge(self, host: Host, address: str, threshold: int | None) -> Finding:
        base = f"/sys/bus/pci/devices/{address}"
        ev: dict[str, str] = {}
        fails: list[str] = []
        warns: list[str] = []
        blocks = host.glob(f"{base}/ras/*_err_count")[:64]
        uncorrectable: dict[str, int] = {}
        for path in blocks:
            block = path.rsplit("/", 1)[1][:-len("_err_count")]
            counts = dict(_COUNT.findall((files.read_text(host, path, 4096) or "")[:4096]))
            ev[f"ras.{block}"] = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            if int(counts.get("ue", "0")):
                uncorrectable[block] = int(counts["ue"])
        if uncorrectable:
            fails.append("uncorrectable errors in " + ", ".join(
                f"{b} ({n})" for b, n in sorted(uncorrectable.items())))
        pages = files.read_text(host, f"{base}/ras/gpu_vram_bad_pages", 1 << 20)
        flags = [m.group(1) for m in (_BAD_PAGE.match(line.strip()) for line in
                                      (pages or "").split("\n")[:100000]) if m]
        if pages is not None:
            ev["bad_pages"] = f"{len(flags)} (R={flags.count('R')} P={flags.count('P')} " \
                              f"F={flags.count('F')})"
        if flags.count("F"):
            fails.append(f"{flags.count('F')} bad page(s) could not be retired")
        if threshold is not None and threshold > 0 and len(flags) >= threshold:
            fails.append(f"{len(flags)} bad pages, at amdgpu.bad_page_threshold ({threshold})")
        if flags.count("P"):
            warns.append(f"{flags.count('P')} bad page(s) pending retirement")
        for kind in ("compute", "memory"):
            mode = (files.read_optional(host, f"{base}/current_{kind}_partition") or "")[:16]
            wanted = getattr(self.options, f"{kind}_partition")
            if mode:
                ev[f"{kind}_partition"] = mode
            if mode and wanted and mode.upper() != wanted.upper():
                warns.append(f"{kind} partition {mode}, the policy wants {wanted}")
        if not blocks and pages is None:
            return self.skipped(address, "amdgpu exposes no RAS counters for this GPU "
                                "(RAS not supported, or amdgpu.ras_enable=0)", evidence=ev)
        fix = "drain the GPU, then amd-smi reset -G or reboot; RMA if errors return"
        if fails:
            return self.failed(address, f"AMD GPU {address}: " + "; ".join(fails + warns),
                               observed="; ".join(fails)[:300], expected="no uncorrectable "
                               "errors", evidence=ev, fix=fix)
        if warns:
            return self.warned(address, f"AMD GPU {address}: " + "; ".join(warns),
                               observed="; ".join(warns)[:300], expected="healthy", evidence=ev,
                               fix="reset the GPU when drained (pending pages, partitions)")
        return self.passed(address, f"AMD GPU {address}: no uncorrectable error in "
                           f"{len(blocks)} RAS block(s), {len(flags)} page(s) retired",
                           observed="healthy", evidence=ev)
