"""``nvidia-smi -q -x`` documents as driver branches 470 to 580 write them.

The layout of each branch follows nvidia-smi's DTDs (``nvsmi_device_v11.dtd`` for R470,
``v12`` since R525, ``v13`` in R580) and real outputs: the R580 one is the lent H200's
``nvidia-smi -q`` (``tests/fixtures/hosts/h200-lent-vm.nvidia-smi-q.txt``) written as XML,
value for value, and reads as its real ``nvidia-smi -q -x`` does
(``h200-lent-vm.nvidia-smi-q-x.xml``).
What changed between branches, and is written here per branch:

- R470: ``clocks_throttle_reasons``, ``power_readings`` (``power_limit``,
  ``enforced_power_limit``), ECC counts per memory with ``single_bit``/``double_bit``
  ``total``, ``retired_pages`` counted (Volta), ``remapped_rows`` N/A on pre-Ampere parts;
- R535: ``clocks_event_reasons`` (renamed), ``gpu_power_readings`` (``current_power_limit``,
  ``requested_power_limit``), ``sram_*``/``dram_*`` ECC counts, ``gpu_reset_status``;
- R550: as R535, ``clocks_event_reasons_counters`` not yet;
- R580: ``sram_uncorrectable`` split into ``_parity`` and ``_secded``,
  ``clocks_event_reasons_counters``, ``gpu_recovery_action``, ``max_host_link_gen``.

Each GPU is a :class:`SmiGpu`; its fields are the problems a case plants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from tests.support.cases import Plant
    from tests.support.sysroot import Sysroot

BRANCH_DRIVERS = {"470": "470.256.02", "535": "535.230.02", "550": "550.144.03",
                  "580": "580.159.04"}
BRANCH_CUDA = {"470": "11.4", "535": "12.2", "550": "12.4", "580": "13.0"}


@dataclass
class SmiGpu:
    """One GPU of the document: the lent H200's values unless a field says otherwise."""

    bus_id: str = "00000000:00:06.0"
    name: str = "NVIDIA H200"
    architecture: str = "Hopper"
    minor: int = 0
    uuid: str = "GPU-a13a5bb8-72fc-095b-462a-8ea17a29196a"
    persistence: str = "Enabled"
    mig: tuple[str, str] = ("Disabled", "Disabled")
    ecc: tuple[str, str] = ("Enabled", "Enabled")
    #: Uncorrectable counts (volatile, aggregate) and the aggregate correctable count.
    unc_volatile: int = 0
    unc_aggregate: int = 0
    corr_aggregate: int = 14
    #: Remapped rows: correctable, uncorrectable, pending, failure ("N/A" fields on pre-Ampere).
    remap: tuple[int, int, str, str] | None = (0, 0, "No", "No")
    #: Retired pages: single-bit, double-bit, pending ("N/A" from Ampere on).
    retired: tuple[int, int, str] | None = None
    recovery: str = "None"
    reasons_active: tuple[str, ...] = ("gpu_idle",)
    #: Clocks-event reasons counters (microseconds), where the branch has them.
    counters: dict[str, int] = field(default_factory=lambda: {
        "sw_power_cap": 0, "sync_boost": 0, "sw_therm_slowdown": 0, "hw_therm_slowdown": 0,
        "hw_power_brake": 0})
    power: tuple[float, float] = (700.0, 700.0)  # (current limit, default limit)
    app_clocks: tuple[int, int] = (1980, 1980)  # (graphics now, graphics default)
    gen: tuple[int, int, int] = (5, 5, 5)  # (current, max, device max)
    width: tuple[int, int] = (16, 16)  # (current, max)
    replay: int = 0
    util: int = 0
    processes: tuple[tuple[int, str], ...] = ()


def _e(tag: str, value: object, indent: int) -> str:
    return "\t" * indent + f"<{tag}>{escape(str(value))}</{tag}>\n"


def _group(tag: str, children: list[tuple[str, object]], indent: int) -> str:
    inner = "".join(_e(t, v, indent + 1) for t, v in children)
    return "\t" * indent + f"<{tag}>\n{inner}" + "\t" * indent + f"</{tag}>\n"


_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
            "hw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown",
            "display_clocks_setting")


def _gpu(gpu: SmiGpu, branch: str) -> str:
    b = int(branch)
    out = [f'\t<gpu id="{gpu.bus_id}">\n', _e("product_name", gpu.name, 2),
           _e("product_brand", "NVIDIA" if b >= 535 else "Tesla", 2)]
    if b >= 535:
        out.append(_e("product_architecture", gpu.architecture, 2))
    out += [_e("display_mode", "Disabled", 2), _e("display_active", "Disabled", 2),
            _e("persistence_mode", gpu.persistence, 2)]
    out.append(_group("mig_mode", [("current_mig", gpu.mig[0]), ("pending_mig", gpu.mig[1])], 2))
    out += [_e("accounting_mode", "Disabled", 2), _e("serial", "1653724060881", 2),
            _e("uuid", gpu.uuid, 2), _e("minor_number", gpu.minor, 2),
            _e("vbios_version", "96.00.A5.00.1A", 2)]
    if 535 <= b < 575:
        out.append(_group("gpu_reset_status", [("reset_required", "No"),
                                               ("drain_and_reset_recommended", "N/A")], 2))
    if b >= 575:
        out.append(_e("gpu_recovery_action", gpu.recovery, 2))
    domain, bus, rest = gpu.bus_id.split(":")
    link: list[tuple[str, object]] = [("max_link_gen", gpu.gen[1]),
                                      ("current_link_gen", gpu.gen[0])]
    if b >= 535:
        link += [("device_current_link_gen", gpu.gen[0]), ("max_device_link_gen", gpu.gen[2]),
                 ("max_host_link_gen", "N/A" if b >= 580 else gpu.gen[1])]
    out.append("\t\t<pci>\n" + _e("pci_bus", bus, 3) + _e("pci_device", rest.split(".")[0], 3)
               + _e("pci_domain", domain[-4:], 3) + _e("pci_device_id", "233510DE", 3)
               + _e("pci_bus_id", gpu.bus_id, 3)
               + "\t\t\t<pci_gpu_link_info>\n"
               + _group("pcie_gen", link, 4)
               + _group("link_widths", [("max_link_width", f"{gpu.width[1]}x"),
                                        ("current_link_width", f"{gpu.width[0]}x")], 4)
               + "\t\t\t</pci_gpu_link_info>\n"
               + _e("replay_counter", gpu.replay, 3) + _e("replay_rollover_counter", 0, 3)
               + _e("tx_util", "1035 KB/s", 3) + _e("rx_util", "650 KB/s", 3) + "\t\t</pci>\n")
    out += [_e("fan_speed", "N/A", 2), _e("performance_state", "P0", 2)]
    word = "event" if b >= 535 else "throttle"
    out.append(_group(f"clocks_{word}_reasons", [
        (f"clocks_{word}_reason_{r}", "Active" if r in gpu.reasons_active else "Not Active")
        for r in _REASONS], 2))
    if b >= 580:
        out.append(_group("clocks_event_reasons_counters", [
            (f"clocks_event_reasons_counters_{k}", f"{v} us") for k, v in gpu.counters.items()],
            2))
    out.append(_e("compute_mode", "Default", 2))
    out.append(_group("utilization", [("gpu_util", f"{gpu.util} %"), ("memory_util", "0 %")], 2))
    out.append(_group("ecc_mode", [("current_ecc", gpu.ecc[0]), ("pending_ecc", gpu.ecc[1])], 2))
    ecc_na = gpu.ecc[0] == "N/A"

    def counts(unc: int, corr: int) -> list[tuple[str, object]]:
        if b < 535:
            return []
        if ecc_na:
            unc_s: object = "N/A"
            corr_s: object = "N/A"
        else:
            unc_s, corr_s = unc, corr
        if b >= 580:
            return [("sram_correctable", corr_s), ("sram_uncorrectable_parity", 0 if not ecc_na
                                                    else "N/A"),
                    ("sram_uncorrectable_secded", 0 if not ecc_na else "N/A"),
                    ("dram_correctable", 0 if not ecc_na else "N/A"),
                    ("dram_uncorrectable", unc_s)]
        return [("sram_correctable", corr_s), ("sram_uncorrectable", 0 if not ecc_na else "N/A"),
                ("dram_correctable", 0 if not ecc_na else "N/A"), ("dram_uncorrectable", unc_s)]

    if b < 535:
        def old(unc: int, corr: int) -> str:
            single = [("device_memory", corr), ("register_file", 0), ("l1_cache", "N/A"),
                      ("l2_cache", 0), ("texture_memory", "N/A"), ("texture_shm", "N/A"),
                      ("cbu", "N/A"), ("total", corr)]
            double = [("device_memory", unc), ("register_file", 0), ("l1_cache", "N/A"),
                      ("l2_cache", 0), ("texture_memory", "N/A"), ("texture_shm", "N/A"),
                      ("cbu", 0), ("total", unc)]
            return _group("single_bit", single, 4) + _group("double_bit", double, 4)
        out.append("\t\t<ecc_errors>\n\t\t\t<volatile>\n" + old(gpu.unc_volatile, 0)
                   + "\t\t\t</volatile>\n\t\t\t<aggregate>\n"
                   + old(gpu.unc_aggregate, gpu.corr_aggregate)
                   + "\t\t\t</aggregate>\n\t\t</ecc_errors>\n")
    else:
        out.append("\t\t<ecc_errors>\n" + _group("volatile", counts(gpu.unc_volatile, 0), 3)
                   + _group("aggregate", counts(gpu.unc_aggregate, gpu.corr_aggregate), 3)
                   + "\t\t</ecc_errors>\n")
    retired = gpu.retired
    out.append("\t\t<retired_pages>\n"
               + _group("multiple_single_bit_retirement",
                        [("retired_count", retired[0] if retired else "N/A"),
                         ("retired_pagelist", "" if retired else "N/A")], 3)
               + _group("double_bit_retirement",
                        [("retired_count", retired[1] if retired else "N/A"),
                         ("retired_pagelist", "" if retired else "N/A")], 3)
               + _e("pending_blacklist", retired[2] if retired else "N/A", 3)
               + _e("pending_retirement", retired[2] if retired else "N/A", 3)
               + "\t\t</retired_pages>\n")
    if gpu.remap is None:
        out.append(_e("remapped_rows", "N/A", 2))
    else:
        corr, unc, pending, failure = gpu.remap
        out.append("\t\t<remapped_rows>\n" + _e("remapped_row_corr", corr, 3)
                   + _e("remapped_row_unc", unc, 3) + _e("remapped_row_pending", pending, 3)
                   + _e("remapped_row_failure", failure, 3)
                   + _group("row_remapper_histogram", [
                       ("row_remapper_histogram_max", "3072 bank(s)"),
                       ("row_remapper_histogram_high", "0 bank(s)")], 3)
                   + "\t\t</remapped_rows>\n")
    limit, default = gpu.power
    if b >= 535:
        out.append(_group("gpu_power_readings", [
            ("power_state", "P0"), ("average_power_draw", "80.49 W"),
            ("instant_power_draw", "80.37 W"), ("current_power_limit", f"{limit:.2f} W"),
            ("requested_power_limit", f"{limit:.2f} W"),
            ("default_power_limit", f"{default:.2f} W"), ("min_power_limit", "200.00 W"),
            ("max_power_limit", f"{default:.2f} W")], 2))
    else:
        out.append(_group("power_readings", [
            ("power_state", "P0"), ("power_management", "Supported"),
            ("power_draw", "55.40 W"), ("power_limit", f"{limit:.2f} W"),
            ("default_power_limit", f"{default:.2f} W"),
            ("enforced_power_limit", f"{limit:.2f} W"), ("min_power_limit", "100.00 W"),
            ("max_power_limit", f"{default:.2f} W")], 2))
    out.append(_group("clocks", [("graphics_clock", "345 MHz"), ("sm_clock", "345 MHz"),
                                 ("mem_clock", "3201 MHz"), ("video_clock", "765 MHz")], 2))
    out.append(_group("applications_clocks", [("graphics_clock", f"{gpu.app_clocks[0]} MHz"),
                                              ("mem_clock", "3201 MHz")], 2))
    out.append(_group("default_applications_clocks", [
        ("graphics_clock", f"{gpu.app_clocks[1]} MHz"), ("mem_clock", "3201 MHz")], 2))
    if gpu.processes:
        out.append("\t\t<processes>\n" + "".join(
            "\t\t\t<process_info>\n" + _e("pid", pid, 4) + _e("type", "C", 4)
            + _e("process_name", name, 4) + _e("used_memory", "1024 MiB", 4)
            + "\t\t\t</process_info>\n" for pid, name in gpu.processes) + "\t\t</processes>\n")
    else:
        out.append("\t\t<processes>\n\t\t</processes>\n")
    out.append("\t</gpu>\n")
    return "".join(out)


def smi_xml(branch: str = "580", gpus: list[SmiGpu] | None = None) -> bytes:
    """Return ``nvidia-smi -q -x`` output of a driver branch (470, 535, 550, 580)."""
    chosen = gpus if gpus is not None else [SmiGpu()]
    dtd = ("nvsmi_device_v11.dtd" if int(branch) < 525 else "nvsmi_device_v12.dtd"
           if int(branch) < 580 else "nvsmi_device_v13.dtd")
    text = ('<?xml version="1.0" ?>\n'
            f'<!DOCTYPE nvidia_smi_log SYSTEM "{dtd}">\n<nvidia_smi_log>\n'
            + _e("timestamp", "Thu Dec  3 17:10:41 2026", 1)
            + _e("driver_version", BRANCH_DRIVERS[branch], 1)
            + _e("cuda_version", BRANCH_CUDA[branch], 1)
            + _e("attached_gpus", len(chosen), 1)
            + "".join(_gpu(g, branch) for g in chosen) + "</nvidia_smi_log>\n")
    return text.encode()


def v100(**changes: object) -> SmiGpu:
    """Return a Volta data-center GPU (retired pages, no row remapping) for R470."""
    values: dict[str, object] = {
        "bus_id": "00000000:1A:00.0", "name": "Tesla V100-SXM2-32GB", "architecture": "Volta",
        "remap": None, "retired": (0, 0, "No"), "power": (300.0, 300.0),
        "app_clocks": (1290, 1290), "gen": (3, 3, 3), "recovery": "N/A"}
    values.update(changes)
    return SmiGpu(**values)  # type: ignore[arg-type]


def a100(**changes: object) -> SmiGpu:
    """Return an Ampere data-center GPU (row remapping)."""
    values: dict[str, object] = {
        "bus_id": "00000000:07:00.0", "name": "NVIDIA A100-SXM4-80GB", "architecture": "Ampere",
        "power": (400.0, 400.0), "app_clocks": (1410, 1410), "gen": (4, 4, 4)}
    values.update(changes)
    return SmiGpu(**values)  # type: ignore[arg-type]


def rtx(**changes: object) -> SmiGpu:
    """Return a consumer GPU: ECC not available."""
    values: dict[str, object] = {
        "bus_id": "00000000:01:00.0", "name": "NVIDIA GeForce RTX 4090",
        "architecture": "Ada Lovelace", "ecc": ("N/A", "N/A"), "remap": None,
        "power": (450.0, 450.0), "gen": (4, 4, 4)}
    values.update(changes)
    return SmiGpu(**values)  # type: ignore[arg-type]


# -- planting GPU state into a case's tree ------------------------------------------------


def plant_smi(branch: str = "580", gpus: list[SmiGpu] | None = None,
              status: str = "exit 0\n") -> Plant:
    """Return a case's ``plant``: write ``host-auditor/nvidia-smi.xml`` (and its status)."""
    def plant(root: Sysroot) -> None:
        root.write("/host-auditor/nvidia-smi.xml", smi_xml(branch, gpus))
        root.write("/host-auditor/nvidia-smi.status", status)

    plant.__name__ = f"smi-{branch}"
    return plant


def plant_status(text: str) -> Plant:
    """Return a case's ``plant``: nvidia-smi failed, only its status file is there."""
    def plant(root: Sysroot) -> None:
        root.write("/host-auditor/nvidia-smi.status", text)

    plant.__name__ = "smi-status"
    return plant


def plant_nvml(document: dict[str, object]) -> Plant:
    """Return a case's ``plant``: write ``host-auditor/nvml.json`` as the NVML child would."""
    import json

    def plant(root: Sysroot) -> None:
        root.write("/host-auditor/nvml.json",
                   json.dumps(document, sort_keys=True) + "\n")

    plant.__name__ = "nvml"
    return plant


def plant_kmsg(*lines: str) -> Plant:
    """Return a case's ``plant``: the kernel log's NVIDIA lines (``/dev/kmsg`` records)."""
    def plant(root: Sysroot) -> None:
        text = "".join(f"4,{1000 + i},{5_000_000 + i * 1000},-;{line}\n"
                       for i, line in enumerate(lines))
        root.write("/host-auditor/kmsg", text)

    plant.__name__ = "kmsg"
    return plant


def both(*plants: Plant) -> Plant:
    """Return a plant that runs several in order."""
    def plant(root: Sysroot) -> None:
        for one in plants:
            one(root)

    plant.__name__ = "+".join(getattr(p, "__name__", "plant") for p in plants)
    return plant


#: The lent H200's GPU as the NVML child reports it (next-wave-device.json's values).
H200_NVML: dict[str, object] = {
    "source": "nvml", "driver": "580.159.04", "gpus": [{
        "index": 0, "bus_id": "0000:00:06.0", "name": "NVIDIA H200",
        "uuid": "GPU-a13a5bb8-72fc-095b-462a-8ea17a29196a", "persistence_mode": True,
        "ecc_current": True, "ecc_pending": True, "ecc_unc_volatile": 0, "ecc_unc_aggregate": 0,
        "remap_corr": 0, "remap_unc": 0, "remap_pending": False, "remap_failure": False,
        "retired_sbe": None, "retired_dbe": None, "retired_pending": None,
        "recovery_action": "None", "mig_current": False, "mig_pending": False,
        "reasons_active": ["gpu_idle"], "reason_counters_us": {
            "sw_power_cap": 0, "sync_boost": 0, "hw_thermal_slowdown": 0, "hw_power_brake": 0,
            "sw_thermal_slowdown": 0},
        "power_limit_w": 700.0, "power_default_w": 700.0, "power_enforced_w": 700.0,
        "app_clock_graphics": 1980, "app_clock_default_graphics": 1980,
        "app_clock_mem": 3201, "app_clock_default_mem": 3201,
        "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_gen_device_max": 5,
        "pcie_width_current": 16, "pcie_width_max": 16, "pcie_replay": 0, "gpu_util": 0}]}
