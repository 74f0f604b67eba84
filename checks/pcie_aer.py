"""pcie.aer: PCIe errors since boot on GPUs, NICs and the ports above them (AER counters).

A marginal link retrains and replays and loses bandwidth without any Xid; an
uncorrectable error can hang or reset a GPU. The kernel counts every error its AER driver
handles per device in ``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal``
(kernel 4.19+, Documentation/ABI/testing/sysfs-bus-pci-devices-aer), and per root port in
``aer_rootport_total_err_*``. An error may be counted at the link partner rather than at
the device that caused it (a Surprise Down is recorded on the downstream port above the
device), so the ports on the path are judged too. The kernel creates the files for every
function with the AER capability (drivers/pci/pcie/aer.c ``pci_aer_init``), also where
firmware owns AER and reports errors through GHES; no files at all means a kernel without
AER support (before 4.19, or CONFIG_PCIEAER off) or devices without the capability.

The counters only reset at boot or re-enumeration: every finding carries the raw counts in
its evidence as ``aer.<correctable|nonfatal|fatal>.<name>`` and ``aer.<severity>.total``
(``aer.rootport.<severity>`` on root ports), so a metrics exporter can alert on increases.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from auditor import environment
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import pci
from auditor.checks.lib.gpupath import short_list
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

UPTIME = "/proc/uptime"

#: What each counter points to (PCIe Base Specification, error definitions).
MEANINGS = {
    "SDES": "Surprise Down: the link below dropped (port power management, see pcie.aspm; "
            "or a failing riser or slot)",
    "ACSViol": "ACS Violation: a peer request was blocked by ACS (see pcie.acs)",
    "CmpltTO": "Completion Timeout: a request got no answer (a hung device, or a link that "
               "retrained under it)",
    "DLP": "Data Link Protocol error: link-level failure (signal integrity)",
    "FCP": "Flow Control Protocol error",
    "TLP": "Poisoned TLP: data corrupted upstream (memory or device error)",
    "MalfTLP": "Malformed TLP (firmware or signal integrity)",
    "UnsupReq": "Unsupported Request (a driver or peer touched an address nobody decodes)",
    "CmpltAbrt": "Completer Abort",
    "UnxCmplt": "Unexpected Completion",
    "RxOF": "Receiver Overflow",
    "ECRC": "ECRC error: end-to-end data corruption",
    "UncorrIntErr": "uncorrectable internal error in the device",
    "RxErr": "Receiver Error: physical layer (a few at link training are normal)",
    "BadTLP": "Bad TLP: signal integrity (riser, retimer, cable, slot)",
    "BadDLLP": "Bad DLLP: signal integrity (riser, retimer, cable, slot)",
    "Rollover": "REPLAY_NUM Rollover: repeated replays, signal integrity",
    "Timeout": "Replay Timer Timeout: signal integrity",
    "NonFatalErr": "Advisory Non-Fatal: an uncorrectable error handled as correctable",
    "CorrIntErr": "corrected internal error in the device",
    "HeaderOF": "Header Log Overflow",
}
SIGNAL_INTEGRITY = frozenset({"BadTLP", "BadDLLP", "Rollover", "Timeout"})


class AerOptions(CheckOptions):
    """Options of ``pcie.aer``."""

    correctable_warn: int = option(
        100, minimum=1, help="correctable errors since boot on one device that make a warning")
    correctable_per_hour: float = option(
        10.0, minimum=0.0, help="correctable errors per hour of uptime that make a warning")
    rate_floor_hours: float = option(
        4.0, minimum=0.01,
        help="uptime shorter than this counts as this many hours for the rate, so errors at "
             "link training on a host up for minutes are not a rate")


def uptime_hours(host: Host) -> float | None:
    """Return the uptime in hours from /proc/uptime, or None."""
    text = (pci.read_file(host, UPTIME, 256) or "").split()
    try:
        seconds = float(text[0]) if text else -1.0
    except ValueError:
        return None
    return seconds / 3600 if 0 <= seconds < 1e10 else None


def counter_evidence(counters: pci.AerCounters) -> dict[str, str]:
    """Return the raw counts under ``aer.<severity>.<name>`` keys."""
    found: dict[str, str] = {}
    for severity, values in counters.counters.items():
        for name, count in values.items():
            found[f"aer.{severity}.{name}"] = str(count)
        found[f"aer.{severity}.total"] = str(counters.totals.get(severity, 0))
    for severity, count in counters.rootport.items():
        found[f"aer.rootport.{severity}"] = str(count)
    return found


def _explain(values: dict[str, int]) -> str:
    parts = [f"{name} {count}" + (f" ({MEANINGS[name]})" if name in MEANINGS else "")
             for name, count in values.items() if count]
    return "; ".join(parts[:8])


class PcieAer(Check[AerOptions]):
    """GPUs, NICs and the ports above them should log no PCIe errors (AER) since boot."""

    id: ClassVar[str] = "pcie.aer"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        UPTIME,
        *pci.DEVICE_READS,
        *pci.AER_READS,
        *environment.READS,
    )
    rationale: ClassVar[str] = (
        "A marginal PCIe link retrains and replays, losing bandwidth without any Xid; fatal and "
        "non-fatal errors hang or reset GPUs mid-inference. Surprise Down points at port power "
        "management (pcie.aspm), ACS Violation at ACS (pcie.acs), Bad TLP/DLLP and replays at "
        "signal integrity."
    )
    remedy: ClassVar[str] = (
        "No software fix: reseat the GPU or NIC, swap the riser or retimer cable, move to "
        "another slot, or force the slot to Gen4 in the BIOS for a flaky Gen5 path; for "
        "Surprise Down also pcie_aspm=off pcie_port_pm=off. The counters reset only at boot: "
        "alert on their increase."
    )
    options_type: ClassVar[type[CheckOptions]] = AerOptions

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        if env.vm and not env.in_container:
            yield self.skipped("pcie", f"{env.describe()}: the hypervisor host handles AER for "
                               "the physical links; audit the host",
                               evidence={"environment": env.describe()})
            return
        inventory = pci.by_address(host)
        targets = [d for d in inventory.values() if not d.virtual_function
                   and (d.is_gpu or d.is_network)]
        if not targets:
            yield self.skipped("pcie", "no GPU or network controller")
            return
        order: dict[str, list[str]] = {}
        for device in targets:
            order.setdefault(device.address, [])
            for bridge in device.ancestors():
                order.setdefault(bridge, []).append(device.address)
        hours = uptime_hours(host)
        base = {"uptime_hours": f"{hours:.1f}" if hours is not None else ""}
        if env.in_container:
            base["environment"] = f"{env.describe()}: the host's counters"
        findings: list[Finding] = []
        for address, below in order.items():
            counters = pci.aer_counters(host, address)
            known = inventory.get(address)
            if counters is None:
                continue
            kind = ("port" if known is not None and known.is_bridge else
                    "GPU" if known is not None and known.is_gpu else "network controller")
            what = f"{pci.vendor_name(known.vendor if known else None)} {kind}"
            ev = {**base, **counter_evidence(counters)}
            if below:
                ev["devices_below"] = short_list(below)
            findings.append(self._judge(address, what, counters, hours, ev))
        if not findings:
            yield self.skipped("pcie", "no aer_dev_* files on the GPUs, NICs or the ports above "
                               "them: the kernel keeps no AER statistics (before 4.19, or built "
                               "without PCIe AER) or the devices lack the AER capability",
                               evidence=base)
            return
        yield from findings

    def _judge(self, address: str, what: str, counters: pci.AerCounters, hours: float | None,
               ev: dict[str, str]) -> Finding:
        fatal = counters.totals.get("fatal", 0)
        nonfatal = counters.totals.get("nonfatal", 0)
        cor = counters.totals.get("correctable", 0)
        counts = f"fatal {fatal}, non-fatal {nonfatal}, correctable {cor}"
        if fatal or nonfatal:
            named = "; ".join(x for x in (_explain(counters.counters.get("fatal", {})),
                                          _explain(counters.counters.get("nonfatal", {}))) if x)
            return self.failed(
                address, f"{what}: uncorrectable PCIe errors since boot ({counts})"
                + (f": {named}" if named else ""),
                observed=counts, expected="no uncorrectable errors",
                evidence={**ev, "problem": "uncorrectable"})
        rate = cor / max(hours if hours is not None else 0.0, self.options.rate_floor_hours)
        if cor >= self.options.correctable_warn or rate > self.options.correctable_per_hour:
            named = _explain(counters.counters.get("correctable", {}))
            hint = ("; signal integrity: check the riser, retimer and slot"
                    if SIGNAL_INTEGRITY & {n for n, c in counters.counters.get(
                        "correctable", {}).items() if c} else "")
            return self.warned(
                address, f"{what}: {cor} correctable PCIe errors since boot ({rate:.1f} per "
                f"hour)" + (f": {named}" if named else "") + hint,
                observed=f"{cor} correctable",
                expected=f"< {self.options.correctable_warn} and <= "
                         f"{self.options.correctable_per_hour:g} per hour",
                evidence={**ev, "problem": "correctable"})
        return self.passed(address, f"{what}: {counts}", observed=counts, evidence=ev)
