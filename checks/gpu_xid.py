"""gpu.xid: the Xid history of the kernel log, judged by NVIDIA's Xid catalog.

The NVIDIA driver reports GPU faults as ``NVRM: Xid (PCI:0000:41:00): 79, pid=..., ...``
lines in the kernel log; NVML's Xid events are live only (no history), so the log is the
only source for an audit. Read from the kernel's ring buffer (``/dev/kmsg`` by the
collector, ``dmesg`` by the ``sh`` one; where that is closed to the user, this boot's journal,
``journalctl -k -b``) into ``/host-auditor/kmsg``: the NVIDIA lines since boot, at most
2,000, judged within ``window_hours``.

Each Xid is judged by the catalog's immediate resolution (the "Analyzing Xid Catalog"
page), not by a fixed list:

- ``always_fail`` (default 48 double-bit ECC, 79 fallen off the bus, 94 contained and 95
  uncontained memory errors) and "GPU has fallen off the bus" lines fail;
- RESET_GPU, RESTART_BM, RESTART_VM, CHECK_MECHANICALS, CONTACT_SUPPORT and the
  WORKFLOW classes fail;
- RESTART_APP (13, 31, 43...) warns from ``restart_app_warn`` occurrences per GPU in the
  window (one is an application's fault, a stream of them is not);
- IGNORE (63 row-remapping event, 92 high single-bit rate...) never fails a host: it is
  shown, and gpu.memory judges the memory itself; 154 defers to the driver's recovery
  action (gpu.memory);
- an Xid the catalog of this version does not know warns.

AzNHC fails on IGNORE-class 63 and 92; the device plugin keeps a GPU unhealthy after 94
until it restarts (NVIDIA/k8s-device-plugin#1014). A stateless window, re-read each audit,
avoids GPUd's "unhealthy survives reboot" (leptonai/gpud#1072).

Sources: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (as
leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go mirrors it);
Azure/azurehpc-health-checks customTests/azure_gpu_xid.nhc.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, NamedTuple

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import files, nvidia, pci
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.hosts.base import Host
from auditor.hosts.gpufiles import KMSG
from auditor.model import Finding, Severity, Status
from auditor.parsing import lazy_re


def _codes(*spans: tuple[int, int] | int) -> frozenset[int]:
    found: set[int] = set()
    for span in spans:
        if isinstance(span, tuple):
            found.update(range(span[0], span[1] + 1))
        else:
            found.add(span)
    return frozenset(found)


#: The catalog's immediate resolution of each Xid (analyzing-xid-catalog.html, 2025-10).
CATALOG: dict[str, frozenset[int]] = {
    "RESTART_APP": _codes(8, 11, 13, 25, 31, 32, (39, 41), 45, 60, (68, 72), (75, 77), 80,
                          (82, 86), 88, 89, 94, (96, 105), (126, 135), 139),
    "IGNORE": _codes(14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 137, 141,
                     152, 153, 157, 160, 161),
    "RESET_GPU": _codes(46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158),
    "RESTART_BM": _codes(79),
    "RESTART_VM": _codes(151),
    "CHECK_MECHANICALS": _codes(54),
    "UPDATE_SWFW": _codes(78),
    "CHECK_UVM": _codes(159),
    "WORKFLOW": _codes(48, 74, (144, 150)),
    "XID_154": _codes(154),
    "CONTACT_SUPPORT": _codes((1, 7), 9, 10, 12, (15, 24), (26, 30), (33, 36), 42, 47,
                              (49, 53), (55, 59), 61, 65, 73, 81, 87, 90, 91, (111, 118),
                              (122, 125), 138, 142),
}
FAILING = ("RESET_GPU", "RESTART_BM", "RESTART_VM", "CHECK_MECHANICALS", "CONTACT_SUPPORT",
           "WORKFLOW")
FALLEN = "GPU has fallen off the bus"


def resolution(xid: int) -> str:
    """Return the catalog's immediate resolution of an Xid ("" where it does not know it)."""
    return next((name for name, codes in CATALOG.items() if xid in codes), "")


_XID = lazy_re(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
               r"(?:\.[0-7])?\): ([0-9]{1,4})")
_BUS = lazy_re(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?")
_KMSG_TIME = lazy_re(r"[0-9]{1,3},[0-9]{1,20},([0-9]{1,20}),[^;]{0,16};")
_DMESG_TIME = lazy_re(r"\[ {0,12}([0-9]{1,12})\.([0-9]{1,9})\]")


class XidEvent(NamedTuple):
    """One Xid (or fallen-off-the-bus) line: when, which GPU, which code."""

    seconds: float | None
    bus_id: str
    xid: int | None
    line: str


def _bus(short: str) -> str:
    domain, _, rest = short.lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}.0" if rest.count(":") == 1 else short.lower()


def parse_log(text: str, limit: int = 4000) -> list[XidEvent]:
    """Return the Xid events of kernel-log text (``/dev/kmsg`` records or ``dmesg`` lines)."""
    events: list[XidEvent] = []
    for raw in text.split("\n")[-limit:]:
        line = raw[:1024]
        if "NVRM" not in line and "fallen off the bus" not in line:
            continue
        seconds: float | None = None
        stamp = _KMSG_TIME.match(line)
        if stamp is not None:
            seconds = int(stamp.group(1)) / 1e6
        else:
            dmesg = _DMESG_TIME.search(line[:40])
            if dmesg is not None:
                seconds = int(dmesg.group(1)) + int(dmesg.group(2)) / 10 ** len(dmesg.group(2))
        match = _XID.search(line)
        message = line.split(";", 1)[-1].strip()[:300]
        if match is not None:
            events.append(XidEvent(seconds, _bus(match.group(1)), int(match.group(2)), message))
        elif "fallen off the bus" in line:
            bus = _BUS.search(line.split("NVRM", 1)[-1])
            events.append(XidEvent(seconds, _bus(bus.group(1)) if bus else "", None, message))
    return events


class GpuXidOptions(CheckOptions):
    """Options of ``gpu.xid``."""

    window_hours: float = option(24.0, minimum=0.1, maximum=24 * 365,
                                 help="how far back the kernel log is judged (and never past "
                                 "the boot)")
    restart_app_warn: int = option(5, minimum=1, maximum=100000,
                                   help="RESTART_APP-class Xids of one GPU in the window that "
                                   "warn")
    always_fail: tuple[str, ...] = option(("48", "79", "94", "95"),
                                          help="Xids that fail whatever the catalog says")


class GpuXid(Check[GpuXidOptions]):
    """A GPU must not have logged Xid errors that NVIDIA's catalog says need a reset or more."""

    id: ClassVar[str] = "gpu.xid"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (KMSG, "/proc/uptime", *pci.DEVICE_READS,
                                        *nvidia.DRIVER_READS, *ENVIRONMENT_READS)
    rationale: ClassVar[str] = (
        "Xid errors are the driver's record of GPU faults: a double-bit ECC error, a GPU "
        "fallen off the bus, an uncontained memory error. A host that logged them since "
        "boot is a host DCGM and GPUd would drain; application-class Xids (a bad kernel's "
        "page fault) and catalog-ignorable ones (63, 92) are not."
    )
    remedy: ClassVar[str] = (
        "Follow the catalog's action for the Xid: drain and reset the GPU (nvidia-smi -r -i "
        "BUS), reboot, check the mechanics (power cables), or contact support / RMA."
    )
    options_type: ClassVar[type[CheckOptions]] = GpuXidOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        text = files.read_text(host, KMSG, 4 << 20)
        if text is None:
            if not gpus:
                yield self.skipped("kernel-log", "no NVIDIA GPU")
            elif host.kind == "sysroot":
                yield self.skipped("kernel-log", "the kernel log was not collected (no "
                                   "host-auditor/kmsg in this capture)")
            else:
                yield self.skipped("kernel-log", "the kernel log cannot be read (/dev/kmsg "
                                   "needs root or kernel.dmesg_restrict=0, and the journal "
                                   "was not readable either)")
            return
        events = parse_log(text)
        uptime = _uptime(host)
        window = self.options.window_hours * 3600
        if uptime is not None:
            events = [e for e in events if e.seconds is None or uptime - e.seconds <= window]
        driver = nvidia.loaded_driver(host)
        by_gpu: dict[str, list[XidEvent]] = {}
        for event in events:
            by_gpu.setdefault(event.bus_id or "unknown GPU", []).append(event)
        span = (f"the last {self.options.window_hours:g} h" if uptime is not None
                and uptime > window else "since boot")
        if not by_gpu:
            if not gpus:
                yield self.skipped("kernel-log", "no NVIDIA GPU (and no Xid in the kernel log)")
                return
            yield self.passed("kernel-log", f"no Xid in the kernel log {span}",
                              observed="no Xid")
            return
        for bus, found in sorted(by_gpu.items()):
            yield self._judge(bus, found, span, driver.version if driver else "")

    def _judge(self, bus: str, events: list[XidEvent], span: str, driver: str) -> Finding:
        always = {int(x) for x in self.options.always_fail if x.isdigit()}
        counts: dict[int, int] = {}
        fallen = False
        for event in events:
            if event.xid is None:
                fallen = True
            else:
                counts[event.xid] = counts.get(event.xid, 0) + 1
        fails: list[str] = []
        warns: list[str] = []
        shown: list[str] = []
        for xid, count in sorted(counts.items()):
            kind = resolution(xid)
            said = f"Xid {xid} x{count} ({kind or 'not in the catalog'})"
            if xid in always or kind in FAILING:
                fails.append(said)
            elif kind in ("RESTART_APP", "CHECK_UVM", "UPDATE_SWFW"):
                (warns if count >= self.options.restart_app_warn or kind == "UPDATE_SWFW"
                 else shown).append(said)
            elif kind in ("IGNORE", "XID_154"):
                shown.append(said + (": see gpu.memory" if kind == "XID_154" or xid in (63, 92)
                                     else ""))
            else:
                warns.append(said)
        if fallen:
            fails.insert(0, FALLEN)
        last = events[-1].line[:200]
        ev = {"xids": " ".join(f"{x}:{n}" for x, n in sorted(counts.items())),
              "last": last, "driver": driver}
        if 119 in counts and driver.startswith("525.") and driver < "525.105.17":
            shown.append("Xid 119 bursts were a driver bug fixed in 525.105.17")
        message = f"GPU {bus}: " + "; ".join(fails + warns + shown) + f" {span}"
        if fails:
            return self.failed(bus, message, observed=", ".join(fails)[:300],
                               expected="no Xid needing a reset", evidence=ev,
                               fix=f"drain the node; follow the Xid catalog's action "
                                   f"(nvidia-smi -r -i {bus}, reboot, or RMA)")
        if warns:
            return self.warned(bus, message, observed=", ".join(warns)[:300],
                               expected="no recurring Xid", evidence=ev,
                               fix="find the application that faults (the pid in the Xid line)")
        return self.finding(Status.PASS, bus, message, observed=", ".join(shown)[:300],
                            evidence=ev)


def _uptime(host: Host) -> float | None:
    text = files.read_optional(host, "/proc/uptime")
    try:
        return float((text or "").split()[0][:20]) if text else None
    except (ValueError, IndexError):
        return None
