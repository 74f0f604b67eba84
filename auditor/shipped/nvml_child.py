"""Read the GPU state through NVML and print it as one JSON document (a child process).

Run by its path (``python .../auditor/shipped/nvml_child.py``, standard library only) by
:func:`auditor.hosts.gpustate.run_nvml`, never imported by the audit itself: a wrong
ctypes call inside NVML kills the interpreter that makes it, and NVML blocks on a wedged
GPU, so the parent gives this process a deadline and survives whatever happens here.

The document has the keys of :mod:`auditor.checks.lib.gpustate`'s normalised GPU record,
so a capture of it replays exactly what was judged. Every call is wrapped: an aspect the
GPU or driver does not support is ``null``; a GPU that is lost or needs a reset is
recorded as such and not queried further; an error of ``nvmlInit`` is the document's
``error``. P2P indices and the like are passed as plain integers (nvidia-ml-py 13.615.71
declares ``NVML_P2P_CAPS_INDEX_READ = 0,``, a tuple).

NVML's error codes (nvml.h ``nvmlReturn_t``) and what they become here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

#: nvmlReturn_t values (nvml.h), by the kind this module reports.
ERROR_KINDS = {
    3: "not_supported",
    4: "no_permission",
    9: "driver_not_loaded",
    10: "timeout",
    12: "library_not_found",
    13: "not_supported",  # FUNCTION_NOT_FOUND: an older driver without the call
    15: "gpu_lost",
    16: "reset_required",
    18: "version_mismatch",
    999: "unknown",
}
#: Field ids (nvml.h ``NVML_FI_DEV_*``).
FI_RECOVERY_ACTION = 230
FI_COUNTERS = {
    "sw_power_cap": 74,  # NVML_FI_DEV_PERF_POLICY_POWER (= CLOCKS_EVENT_REASON_SW_POWER_CAP)
    "sync_boost": 76,  # NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
    "sw_thermal_slowdown": 269,
    "hw_thermal_slowdown": 270,
    "hw_power_brake": 271,
}
#: nvmlClocksEventReasons bits (nvml.h), by the names nvidia-smi's XML uses.
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
#: nvmlDeviceGpuRecoveryAction_t, in nvidia-smi's words.
RECOVERY_ACTIONS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset"}


class Lost(Exception):
    """The GPU is lost or needs a reset: it is not queried further."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def error_kind(exc: BaseException) -> str:
    """Return what an NVML exception means (``not_supported``, ``gpu_lost``...)."""
    value = getattr(exc, "value", None)
    return ERROR_KINDS.get(value, "error") if isinstance(value, int) else "error"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def bus_id(raw: Any) -> str:
    """Return NVML's ``00000000:41:00.0`` as sysfs writes it, ``0000:41:00.0``."""
    text = _text(raw).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if rest else text


class Device:
    """One GPU's queries: each aspect a value, None when not supported."""

    def __init__(self, nvml: Any, handle: Any, record: dict[str, Any]) -> None:
        self.nvml = nvml
        self.handle = handle
        self.record = record
        self.errors: dict[str, str] = {}

    def get(self, aspect: str, call: Callable[[], Any]) -> Any:
        """Return ``call()``, or None where the aspect is not supported or denied."""
        try:
            return call()
        except self.nvml.NVMLError as exc:
            kind = error_kind(exc)
            if kind in ("gpu_lost", "reset_required"):
                raise Lost(kind, _text(exc)) from None
            if kind != "not_supported":
                self.errors[aspect] = kind
            return None

    def field(self, field_id: int) -> int | None:
        """Return one field value as an integer, or None."""
        values = self.get(f"field {field_id}",
                          lambda: self.nvml.nvmlDeviceGetFieldValues(self.handle, [field_id]))
        if not values:
            return None
        value = values[0]
        if getattr(value, "nvmlReturn", 1) != 0:
            return None
        kind = getattr(value, "valueType", 1)
        union = value.value
        number = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                  6: "usVal"}.get(kind, "ullVal")
        result = getattr(union, number, None)
        return int(result) if isinstance(result, (int, float)) else None


def read_device(nvml: Any, index: int) -> dict[str, Any]:
    """Return one GPU's normalised record."""
    record: dict[str, Any] = {"index": index}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        record["error"] = {"kind": error_kind(exc), "message": _text(exc)}
        return record
    device = Device(nvml, handle, record)
    try:
        _query(nvml, device, record)
    except Lost as lost:
        record["error"] = {"kind": lost.kind, "message": str(lost)}
    if device.errors:
        record["denied"] = device.errors
    return record


def _pair(value: Any) -> tuple[Any, Any]:
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return value[0], value[1]
    return None, None


def _query(nvml: Any, d: Device, r: dict[str, Any]) -> None:
    h = d.handle
    pci = d.get("pci", lambda: nvml.nvmlDeviceGetPciInfo(h))
    if pci is not None:
        r["bus_id"] = bus_id(getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b""))
    name = d.get("name", lambda: nvml.nvmlDeviceGetName(h))
    r["name"] = _text(name) if name is not None else None
    uuid = d.get("uuid", lambda: nvml.nvmlDeviceGetUUID(h))
    r["uuid"] = _text(uuid) if uuid is not None else None
    mode = d.get("persistence", lambda: nvml.nvmlDeviceGetPersistenceMode(h))
    r["persistence_mode"] = None if mode is None else mode == 1
    current, pending = _pair(d.get("ecc", lambda: nvml.nvmlDeviceGetEccMode(h)))
    r["ecc_current"] = None if current is None else current == 1
    r["ecc_pending"] = None if pending is None else pending == 1
    # nvmlMemoryErrorType_t UNCORRECTED = 1; nvmlEccCounterType_t VOLATILE = 0, AGGREGATE = 1.
    r["ecc_unc_volatile"] = d.get("ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0))
    r["ecc_unc_aggregate"] = d.get("ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(h, 1, 1))
    rows = d.get("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
    if isinstance(rows, (list, tuple)) and len(rows) >= 4:
        r["remap_corr"], r["remap_unc"] = int(rows[0]), int(rows[1])
        r["remap_pending"], r["remap_failure"] = bool(rows[2]), bool(rows[3])
    # nvmlPageRetirementCause_t: MULTIPLE_SINGLE_BIT = 0, DOUBLE_BIT = 1 (pre-Ampere only).
    sbe = d.get("retired_pages", lambda: nvml.nvmlDeviceGetRetiredPages(h, 0))
    dbe = d.get("retired_pages", lambda: nvml.nvmlDeviceGetRetiredPages(h, 1))
    r["retired_sbe"] = len(sbe) if isinstance(sbe, (list, tuple)) else None
    r["retired_dbe"] = len(dbe) if isinstance(dbe, (list, tuple)) else None
    retired_pending = d.get("retired_pages",
                            lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
    r["retired_pending"] = None if retired_pending is None else retired_pending == 1
    action = d.field(FI_RECOVERY_ACTION)
    r["recovery_action"] = RECOVERY_ACTIONS.get(action, str(action)) if action is not None \
        else None
    current, pending = _pair(d.get("mig", lambda: nvml.nvmlDeviceGetMigMode(h)))
    r["mig_current"] = None if current is None else current == 1
    r["mig_pending"] = None if pending is None else pending == 1
    events = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask = d.get("clocks_event_reasons", lambda: events(h)) if events else None
    r["reasons_active"] = None if mask is None else sorted(
        name for name, bit in REASON_BITS.items() if int(mask) & bit)
    counters = {name: d.field(fid) for name, fid in FI_COUNTERS.items()}
    # Nanoseconds in NVML, microseconds in nvidia-smi's XML: kept as nvidia-smi writes them.
    r["reason_counters_us"] = {k: v // 1000 for k, v in counters.items() if v is not None} \
        or None
    limit = d.get("power", lambda: nvml.nvmlDeviceGetPowerManagementLimit(h))
    default = d.get("power", lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h))
    enforced = d.get("power", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
    r["power_limit_w"] = None if limit is None else limit / 1000
    r["power_default_w"] = None if default is None else default / 1000
    r["power_enforced_w"] = None if enforced is None else enforced / 1000
    # nvmlClockType_t GRAPHICS = 0, MEM = 2.
    r["app_clock_graphics"] = d.get("clocks", lambda: nvml.nvmlDeviceGetApplicationsClock(h, 0))
    r["app_clock_default_graphics"] = d.get(
        "clocks", lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(h, 0))
    r["app_clock_mem"] = d.get("clocks", lambda: nvml.nvmlDeviceGetApplicationsClock(h, 2))
    r["app_clock_default_mem"] = d.get(
        "clocks", lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(h, 2))
    r["pcie_gen_current"] = d.get("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
    r["pcie_gen_max"] = d.get("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
    gpu_max = getattr(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", None)
    r["pcie_gen_device_max"] = d.get("pcie", lambda: gpu_max(h)) if gpu_max else None
    r["pcie_width_current"] = d.get("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h))
    r["pcie_width_max"] = d.get("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h))
    r["pcie_replay"] = d.get("pcie", lambda: nvml.nvmlDeviceGetPcieReplayCounter(h))
    rates = d.get("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    r["gpu_util"] = getattr(rates, "gpu", None) if rates is not None else None


def collect(nvml: Any) -> dict[str, Any]:
    """Return the normalised GPU state through an NVML binding (``pynvml``)."""
    document: dict[str, Any] = {"source": "nvml"}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        document["error"] = {"kind": error_kind(exc), "message": _text(exc)}
        return document
    try:
        try:
            document["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            document["driver"] = None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            document["error"] = {"kind": error_kind(exc), "message": _text(exc)}
            return document
        document["gpus"] = [read_device(nvml, index) for index in range(min(count, 256))]
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return document


def main() -> int:
    """Print the GPU state as JSON on stdout."""
    try:
        import pynvml
    except ImportError as exc:
        document: dict[str, Any] = {"source": "nvml", "error": {
            "kind": "library_not_found", "message": f"nvidia-ml-py is not installed ({exc})"}}
    else:
        document = collect(pynvml)
    sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
