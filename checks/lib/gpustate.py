"""The GPU state the NVIDIA driver reports, from the virtual files of auditor.hosts.gpustate.

One normalised record per GPU, the same whichever way the state was read:

- ``/host-auditor/nvml.json``: NVML through the collector child (its keys are these);
- ``/host-auditor/nvidia-smi.xml``: ``nvidia-smi -q -x`` of any driver branch from 470 to
  580 (tags renamed across branches are all read: ``clocks_throttle_reasons`` before 535,
  ``clocks_event_reasons`` after; ``power_readings`` before 530, ``gpu_power_readings``
  after; ECC counts per memory (``single_bit``/``double_bit`` ``total``) before 510,
  ``sram_*``/``dram_*`` after, ``sram_uncorrectable`` split into parity and SEC-DED in 560);
- ``/host-auditor/nvidia-smi.status``: how the command ended, where it failed.

Everything is read as hostile: the XML through :func:`auditor.hosts.gpustate.parse_xml`
(bounded, no entities), every number bounded, JSON values type-checked.

Error kinds (NVML's ``nvmlReturn_t``, or nvidia-smi's words for them): ``library_not_found``,
``driver_not_loaded``, ``version_mismatch``, ``no_permission``, ``unknown`` (in a container:
the lost device-cgroup signature, NVIDIA/nvidia-container-toolkit#48), ``gpu_lost``,
``reset_required``, ``timeout`` (the deadline passed), ``crashed``, ``no_gpu``, ``failed``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from auditor.hosts.base import Host
from auditor.hosts.gpustate import (
    MAX_XML,
    NVML_JSON,
    READS,
    SMI_STATUS,
    SMI_XML,
    XmlRefused,
    parse_xml,
)
from auditor.parsing import lazy_re

__all__ = ["READS", "Gpu", "GpuState", "state"]

_MAX_GPUS = 256
_NUMBER = lazy_re(r"-?[0-9]{1,15}(?:\.[0-9]{1,6})?")
_BUS = lazy_re(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class Gpu(NamedTuple):
    """One GPU as the driver reports it; None where the driver does not say."""

    #: The GPU's NVML index (nvidia-smi's minor number where the XML has it).
    number: int
    bus_id: str
    name: str = ""
    uuid: str = ""
    #: (kind, message) where the GPU itself failed (``gpu_lost``, ``reset_required``).
    error: tuple[str, str] | None = None
    #: Aspects the driver refused to tell (aspect -> error kind).
    denied: tuple[tuple[str, str], ...] = ()
    persistence_mode: bool | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_unc_volatile: int | None = None
    ecc_unc_aggregate: int | None = None
    remap_corr: int | None = None
    remap_unc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    recovery_action: str | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    reasons_active: tuple[str, ...] | None = None
    reason_counters_us: tuple[tuple[str, int], ...] | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_enforced_w: float | None = None
    app_clock_graphics: int | None = None
    app_clock_default_graphics: int | None = None
    app_clock_mem: int | None = None
    app_clock_default_mem: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_device_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_replay: int | None = None
    gpu_util: int | None = None

    @property
    def label(self) -> str:
        """Return how findings name the GPU: its bus id, else its NVML index."""
        return self.bus_id or f"GPU {self.number}"

    def counters(self) -> dict[str, int]:
        """Return the clocks-event reasons' cumulative counters (microseconds)."""
        return dict(self.reason_counters_us or ())


class GpuState(NamedTuple):
    """What was collected: where from, the driver's version, an error, the GPUs."""

    #: ``nvml`` or ``nvidia-smi``.
    source: str
    driver: str = ""
    #: (kind, message) where the state as a whole could not be read.
    error: tuple[str, str] | None = None
    gpus: tuple[Gpu, ...] = ()
    #: The file the state came from.
    path: str = ""


# -- hostile values ------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not -(1 << 63) < value < (1 << 63):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if abs(value) < 1e12 else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: Any, limit: int = 256) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _error(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return None
    kind = _str(value.get("kind"), 40) or "failed"
    return kind, _str(value.get("message"), 500)


def _bus(value: Any) -> str:
    text = _str(value, 64).strip().lower()
    domain, _, rest = text.partition(":")
    if rest:
        text = f"{domain[-4:]:0>4}:{rest}"
    return text if _BUS.fullmatch(text) else ""


_INT_KEYS = ("ecc_unc_volatile", "ecc_unc_aggregate", "remap_corr", "remap_unc", "retired_sbe",
             "retired_dbe", "app_clock_graphics", "app_clock_default_graphics", "app_clock_mem",
             "app_clock_default_mem", "pcie_gen_current", "pcie_gen_max", "pcie_gen_device_max",
             "pcie_width_current", "pcie_width_max", "pcie_replay", "gpu_util")
_BOOL_KEYS = ("persistence_mode", "ecc_current", "ecc_pending", "remap_pending", "remap_failure",
              "retired_pending", "mig_current", "mig_pending")
_FLOAT_KEYS = ("power_limit_w", "power_default_w", "power_enforced_w")


def gpu_from_record(record: Any, position: int) -> Gpu | None:
    """Return a normalised record (NVML's JSON, or what the XML was read into) as a Gpu."""
    if not isinstance(record, dict):
        return None
    values: dict[str, Any] = {
        "number": _int(record.get("index")) if _int(record.get("index")) is not None
        else position,
        "bus_id": _bus(record.get("bus_id")),
        "name": _str(record.get("name")),
        "uuid": _str(record.get("uuid"), 80),
        "error": _error(record.get("error")),
    }
    denied = record.get("denied")
    if isinstance(denied, dict):
        values["denied"] = tuple((_str(k, 40), _str(v, 40)) for k, v in
                                 list(denied.items())[:32])
    for key in _INT_KEYS:
        values[key] = _int(record.get(key))
    for key in _BOOL_KEYS:
        values[key] = _bool(record.get(key))
    for key in _FLOAT_KEYS:
        values[key] = _float(record.get(key))
    action = record.get("recovery_action")
    values["recovery_action"] = _str(action, 40) or None
    reasons = record.get("reasons_active")
    if isinstance(reasons, list):
        values["reasons_active"] = tuple(_str(r, 40) for r in reasons[:32] if isinstance(r, str))
    counters = record.get("reason_counters_us")
    if isinstance(counters, dict):
        values["reason_counters_us"] = tuple(sorted(
            (_str(k, 40), n) for k, v in list(counters.items())[:16]
            if (n := _int(v)) is not None))
    return Gpu(**values)


def state_from_document(document: Any, path: str = NVML_JSON) -> GpuState:
    """Return the state a normalised document (``nvml.json``) describes."""
    if not isinstance(document, dict):
        return GpuState("nvml", error=("failed", f"{path} is not a JSON object"), path=path)
    records = document.get("gpus")
    gpus = tuple(g for i, r in enumerate(records[:_MAX_GPUS] if isinstance(records, list)
                                         else []) if (g := gpu_from_record(r, i)) is not None)
    return GpuState(_str(document.get("source"), 20) or "nvml",
                    _str(document.get("driver"), 40), _error(document.get("error")), gpus, path)


# -- nvidia-smi -q -x ----------------------------------------------------------------------


def _text(element: Any, path: str) -> str | None:
    """Return the stripped text at ``path``, None where absent or N/A."""
    found = element.find(path)
    if found is None or found.text is None:
        return None
    text: str = found.text.strip()[:256]
    if not text or text in ("N/A", "Unknown Error", "[N/A]") or text.startswith(
            ("Requested functionality", "Not Supported", "[Not Supported]")):
        return None
    return text


def _first(element: Any, *paths: str) -> str | None:
    for path in paths:
        text = _text(element, path)
        if text is not None:
            return text
    return None


def _number(text: str | None) -> float | None:
    """Return the number that starts ``text`` (``700.00 W``, ``16x``, ``0 us``), or None."""
    if text is None:
        return None
    match = _NUMBER.match(text.strip())
    return float(match.group(0)) if match else None


def _whole(text: str | None) -> int | None:
    number = _number(text)
    return None if number is None else int(number)


def _flag(text: str | None, yes: tuple[str, ...] = ("Enabled", "Yes", "Active")) -> bool | None:
    if text is None:
        return None
    if text in yes:
        return True
    if text in ("Disabled", "No", "Not Active"):
        return False
    return None


def _sum(element: Any, paths: tuple[str, ...]) -> int | None:
    """Return the sum of the counters at ``paths`` that exist, None where none does."""
    found = [n for p in paths if (n := _whole(_text(element, p))) is not None]
    return sum(found) if found else None


def _uncorrectable(gpu: Any, which: str) -> int | None:
    base = f"ecc_errors/{which}"
    old = _whole(_text(gpu, f"{base}/double_bit/total"))
    if old is not None:
        return old
    return _sum(gpu, (f"{base}/sram_uncorrectable", f"{base}/sram_uncorrectable_parity",
                      f"{base}/sram_uncorrectable_secded", f"{base}/dram_uncorrectable"))


_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
            "hw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown",
            "display_clocks_setting")
_COUNTERS = {"sw_power_cap": "sw_power_cap", "sync_boost": "sync_boost",
             "sw_thermal_slowdown": "sw_therm_slowdown",
             "hw_thermal_slowdown": "hw_therm_slowdown", "hw_power_brake": "hw_power_brake"}


def _reasons(gpu: Any) -> tuple[str, ...] | None:
    for group, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                          ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        element = gpu.find(group)
        if element is None:
            continue
        seen = {name: _flag(_text(element, prefix + name)) for name in _REASONS}
        if all(v is None for v in seen.values()):
            return None
        return tuple(sorted(name for name, active in seen.items() if active))
    return None


def _counters(gpu: Any) -> tuple[tuple[str, int], ...] | None:
    element = gpu.find("clocks_event_reasons_counters")
    if element is None:
        return None
    found = tuple((name, n) for name, tag in sorted(_COUNTERS.items())
                  if (n := _whole(_text(element, f"clocks_event_reasons_counters_{tag}")))
                  is not None)
    return found or None


def gpu_from_xml(gpu: Any, position: int) -> Gpu:
    """Return one ``<gpu>`` element of ``nvidia-smi -q -x`` as a normalised Gpu."""
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    link = "pci/pci_gpu_link_info"
    sbe = _text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")
    dbe = _text(gpu, "retired_pages/double_bit_retirement/retired_count")
    pending_retire = _first(gpu, "retired_pages/pending_retirement",
                            "retired_pages/pending_blacklist")
    minor = _whole(_text(gpu, "minor_number"))
    current_limit = _first(power, "current_power_limit", "power_limit") \
        if power is not None else None
    enforced = _first(power, "enforced_power_limit", "current_power_limit") \
        if power is not None else None
    return Gpu(
        number=minor if minor is not None and 0 <= minor < 4096 else position,
        bus_id=_bus(gpu.get("id") or _text(gpu, "pci/pci_bus_id") or ""),
        name=_text(gpu, "product_name") or "",
        uuid=(_text(gpu, "uuid") or "")[:80],
        persistence_mode=_flag(_text(gpu, "persistence_mode")),
        ecc_current=_flag(_text(gpu, "ecc_mode/current_ecc")),
        ecc_pending=_flag(_text(gpu, "ecc_mode/pending_ecc")),
        ecc_unc_volatile=_uncorrectable(gpu, "volatile"),
        ecc_unc_aggregate=_uncorrectable(gpu, "aggregate"),
        remap_corr=_whole(_text(gpu, "remapped_rows/remapped_row_corr")),
        remap_unc=_whole(_text(gpu, "remapped_rows/remapped_row_unc")),
        remap_pending=_flag(_text(gpu, "remapped_rows/remapped_row_pending")),
        remap_failure=_flag(_text(gpu, "remapped_rows/remapped_row_failure")),
        retired_sbe=_whole(sbe),
        retired_dbe=_whole(dbe),
        retired_pending=_flag(pending_retire),
        recovery_action=_text(gpu, "gpu_recovery_action"),
        mig_current=_flag(_text(gpu, "mig_mode/current_mig")),
        mig_pending=_flag(_text(gpu, "mig_mode/pending_mig")),
        reasons_active=_reasons(gpu),
        reason_counters_us=_counters(gpu),
        power_limit_w=_number(current_limit),
        power_default_w=_number(_text(power, "default_power_limit")) if power is not None
        else None,
        power_enforced_w=_number(enforced),
        app_clock_graphics=_whole(_text(gpu, "applications_clocks/graphics_clock")),
        app_clock_default_graphics=_whole(_text(gpu, "default_applications_clocks/"
                                                     "graphics_clock")),
        app_clock_mem=_whole(_text(gpu, "applications_clocks/mem_clock")),
        app_clock_default_mem=_whole(_text(gpu, "default_applications_clocks/mem_clock")),
        pcie_gen_current=_whole(_first(gpu, f"{link}/pcie_gen/current_link_gen")),
        pcie_gen_max=_whole(_text(gpu, f"{link}/pcie_gen/max_link_gen")),
        pcie_gen_device_max=_whole(_text(gpu, f"{link}/pcie_gen/max_device_link_gen")),
        pcie_width_current=_whole(_text(gpu, f"{link}/link_widths/current_link_width")),
        pcie_width_max=_whole(_text(gpu, f"{link}/link_widths/max_link_width")),
        pcie_replay=_whole(_text(gpu, "pci/replay_counter")),
        gpu_util=_whole(_text(gpu, "utilization/gpu_util")),
    )


def state_from_xml(data: bytes, status: str = "") -> GpuState:
    """Return the state ``nvidia-smi -q -x`` output describes (GPUs it names as lost too)."""
    # What nvidia-smi printed after the document (a GPU it could not open, on the same
    # stream in the sh collector) is not XML: it is read as what it said.
    end = data.rfind(b"</nvidia_smi_log>")
    if end >= 0:
        status += "\n" + data[end + 17:end + 17 + 4096].decode("utf-8", "replace")
        data = data[:end + 17]
    try:
        root: Any = parse_xml(data)
    except XmlRefused as exc:
        return GpuState("nvidia-smi", error=("failed", f"{SMI_XML} is not read: {exc}"),
                        path=SMI_XML)
    if root.tag != "nvidia_smi_log":
        return GpuState("nvidia-smi", error=("failed", f"{SMI_XML} is not nvidia-smi -q -x "
                                             f"output (root <{str(root.tag)[:40]}>)"),
                        path=SMI_XML)
    gpus = [gpu_from_xml(g, i) for i, g in enumerate(root.findall("gpu")[:_MAX_GPUS])]
    lost = lost_gpus(status)
    gpus += [Gpu(number=len(gpus) + i, bus_id=bus, error=(kind, message))
             for i, (bus, kind, message) in enumerate(lost)
             if bus not in {g.bus_id for g in gpus}]
    return GpuState("nvidia-smi", _text(root, "driver_version") or "", None, tuple(gpus),
                    SMI_XML)


# -- nvidia-smi's failures -------------------------------------------------------------------

_LOST = lazy_re(r"(?i)device handle for gpu ?([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"
                r"[^\n]{0,40}?: ?([^\n]{0,200})")


def lost_gpus(status: str) -> list[tuple[str, str, str]]:
    """Return (bus id, kind, message) for each GPU nvidia-smi could not open (``GPU is lost``)."""
    found: list[tuple[str, str, str]] = []
    for line in status.split("\n")[:64]:
        match = _LOST.search(line[:512])
        if match is None:
            continue
        message = match.group(2).strip()
        lowered = message.lower()
        kind = ("gpu_lost" if "lost" in lowered else "reset_required" if "reset" in lowered
                else classify(message) or "failed")
        found.append((_bus(match.group(1)), kind, line.strip()[:300]))
    return found


#: nvidia-smi's and NVML's messages for each error kind (nvmlErrorString's texts).
_MESSAGES = (
    ("couldn't communicate with the nvidia driver", "driver_not_loaded"),
    ("driver not loaded", "driver_not_loaded"),
    ("driver/library version mismatch", "version_mismatch"),
    ("insufficient permissions", "no_permission"),
    ("no permission", "no_permission"),
    ("shared library not found", "library_not_found"),
    ("libnvidia-ml.so", "library_not_found"),
    ("command not found", "library_not_found"),
    ("no gpu is bound", "no_gpu"),
    ("no devices were found", "no_gpu"),
    ("gpu is lost", "gpu_lost"),
    ("reset required", "reset_required"),
    ("unknown error", "unknown"),
)


def classify(message: str) -> str | None:
    """Return the error kind nvidia-smi's (or NVML's) message names, or None."""
    lowered = message.lower()[:2048]
    return next((kind for text, kind in _MESSAGES if text in lowered), None)


def state_from_status(text: str) -> GpuState:
    """Return the state where nvidia-smi failed: its exit status and what it printed."""
    head, _, output = text.partition("\n")
    word, _, value = head.partition(" ")
    output = output.strip()
    first = output.splitlines()[0][:300] if output else ""
    if word == "timeout":
        return GpuState("nvidia-smi", error=("timeout", f"nvidia-smi did not answer in "
                                             f"{value[:10]} s"), path=SMI_STATUS)
    if word == "exit" and value.strip() == "0":
        return GpuState("nvidia-smi", error=("failed", "nvidia-smi answered without XML"),
                        path=SMI_STATUS)
    kind = classify(output) or ("library_not_found" if value.strip() == "127" else "failed")
    message = first or f"nvidia-smi exited {value[:10]}"
    return GpuState("nvidia-smi", error=(kind, message), path=SMI_STATUS)


# -- reading the host ------------------------------------------------------------------------


def _read(host: Host, path: str) -> bytes | None:
    try:
        return host.read_bytes(path, MAX_XML + 1)
    except OSError:
        return None


def _state(host: Host) -> GpuState | None:
    raw = _read(host, NVML_JSON)
    if raw is not None:
        try:
            document = json.loads(raw[:MAX_XML].decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            return GpuState("nvml", error=("failed", f"{NVML_JSON} is not JSON"),
                            path=NVML_JSON)
        return state_from_document(document)
    status_raw = _read(host, SMI_STATUS)
    status = status_raw.decode("utf-8", "replace")[:8192] if status_raw is not None else ""
    xml = _read(host, SMI_XML)
    if xml is not None and b"<nvidia_smi_log" in xml[:65536]:
        return state_from_xml(xml, status)
    if xml is not None and status_raw is not None:
        # The sh collector streams what nvidia-smi printed into the XML's place: on a failure
        # that is its message.
        head = status.partition("\n")[0]
        return state_from_status(head + "\n" + xml[:4096].decode("utf-8", "replace"))
    if status_raw is not None:
        return state_from_status(status)
    return None


def state(host: Host) -> GpuState | None:
    """Return the GPU state the driver reported, None where it was not collected (read once)."""
    return host.fact("gpu.state", _state)


#: Data-center GPU names: ECC off on these is a finding (workstation and consumer GPUs ship
#: with ECC off or without it). nvidia-smi's product_brand is "NVIDIA" for all of Hopper and
#: later, so the name decides.
_DATACENTER = lazy_re(r"(?i)\b(?:Tesla|A100|A800|A30|A40|A10G?|A16|A2|H100|H800|H200|H20|GH200|"
                      r"B100|B200|B300|GB200|GB300|L40S?|L20|L4|V100|P100|P40|T4|K80|M60|"
                      r"RTX PRO 6000 Blackwell Server)\b")


def is_datacenter(gpu: Gpu) -> bool:
    """Return whether the GPU is a data-center part (ECC is expected on)."""
    return bool(gpu.name) and _DATACENTER.search(gpu.name[:128]) is not None


# -- verdicts every GPU check shares ----------------------------------------------------------


class Unavailable(NamedTuple):
    """Why the GPU state cannot be judged, and the verdict the owning check gives."""

    #: ``skip``, ``fail`` or ``error`` (the verdict of gpu.memory, which owns the state).
    status: str
    message: str
    fix: str = ""
    #: ``nvidia.driver`` where that check judges it.
    routed_to: str = ""


_NOT_COLLECTED = ("the GPU state was not collected (no host-auditor/nvidia-smi.xml or "
                  "host-auditor/nvml.json in this capture)")


def unavailable(host: Host, current: GpuState | None, in_container: bool,
                nvidia_gpus: int) -> Unavailable | None:
    """Return why the GPU state cannot be judged as a whole, or None where it can."""
    if current is None:
        if nvidia_gpus == 0:
            return Unavailable("skip", "no NVIDIA GPU")
        return Unavailable("skip", _NOT_COLLECTED)
    if current.error is None:
        if not current.gpus:
            return Unavailable("skip", f"the driver reports no GPU ({current.source})")
        return None
    kind, message = current.error
    said = (message if message.lower().startswith(current.source) else
            f"{current.source}: {message}") if message else current.source
    if kind == "no_gpu" or (nvidia_gpus == 0 and kind in ("driver_not_loaded",
                                                           "library_not_found")):
        return Unavailable("skip", f"no NVIDIA GPU for the driver ({said})")
    if kind == "library_not_found":
        return Unavailable("skip", f"no NVIDIA userspace to ask ({said}); nvidia.driver judges "
                           "whether one is needed", routed_to="nvidia.driver")
    if kind == "version_mismatch":
        return Unavailable("skip", f"driver/library version mismatch ({said}): nvidia.driver "
                           "judges it", routed_to="nvidia.driver")
    if kind == "driver_not_loaded":
        return Unavailable("fail", f"{nvidia_gpus} NVIDIA GPU(s) in sysfs but the driver does "
                           f"not answer ({said})", fix="load the nvidia module (modprobe nvidia)"
                           " or reboot; see nvidia.driver")
    if kind == "no_permission":
        return Unavailable("skip", f"the driver refused to answer ({said}): run as root or "
                           "with access to /dev/nvidia*")
    if kind == "unknown" and in_container:
        return Unavailable(
            "fail", f"'Unknown Error' inside a container ({said}): the container lost its GPU "
            "device-cgroup rules (a systemd daemon-reload under the cgroup driver drops them, "
            "NVIDIA/nvidia-container-toolkit#48)",
            fix="restart the container; on the host, create the /dev/char links "
            "(nvidia-ctk system create-dev-char-symlinks --create-all) or use CDI")
    if kind in ("gpu_lost", "reset_required"):
        return Unavailable("fail", f"the driver reports a GPU {kind.replace('_', ' ')} "
                           f"({said})", fix="drain the node, then reset the GPU "
                           "(nvidia-smi -r -i BUS) or reboot")
    if kind == "timeout":
        return Unavailable("error", f"GPU state unknown: {said} (a wedged GPU blocks the "
                           "driver; see gpu.xid)")
    return Unavailable("error", f"GPU state unknown: {said}")


def skip_reason(problem: Unavailable) -> str:
    """Return the skip message of a check that does not own the GPU state's failures."""
    if problem.status == "skip":
        return problem.message
    return f"GPU state unavailable ({problem.message}); gpu.memory reports it"
