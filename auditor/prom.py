"""Reports in the Prometheus text exposition format, for node_exporter's textfile collector.

Write the output to ``<textfile dir>/host_auditor.prom`` (``-o`` writes through a
dot-file and a rename, as node_exporter asks), one file per node. Every label value read
from a host is untrusted and is escaped as the format requires: backslash, double quote
and line feed. No sample carries a timestamp (node_exporter skips a whole file that has
one), and the HELP text of each metric is fixed here: node_exporter fails the scrape when
two files give one metric different HELP (prometheus/node_exporter collector/textfile.go).

Raw counts a check keeps (the kernel's AER error counters, say) are exported as
counters from the findings' evidence (:data:`COUNTER_FAMILIES`), so alerts can use
``increase()`` where a verdict alone hides a slow rise.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from auditor.model import Report, Status, fingerprint

#: Status codes of ``host_auditor_check_status``: higher is worse (``Status.order``).
STATUS_CODES = {status.value: status.order for status in Status}
_SURROGATES = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: The HELP text of every metric: fixed, so files written by two versions agree.
HELP = {
    "host_auditor_finding":
        "One series per check and subject; the status label holds the verdict.",
    "host_auditor_check_status":
        "Worst status of each check (0 pass, 1 skip, 2 warn, 3 fail, 4 error).",
    "host_auditor_findings": "Number of findings of each status.",
    "host_auditor_up": "1 if the host could be audited, 0 if not.",
    "host_auditor_last_run_timestamp_seconds": "When the audit started (Unix time).",
    "host_auditor_duration_seconds": "How long the audit took.",
    "host_auditor_tuning_info": "Fingerprint of the host's tuned state (audit fingerprint).",
    "host_auditor_measurement":
        "A figure a probe measured (audit probe): the metric label names it and its unit.",
}


@dataclass(frozen=True)
class CounterFamily:
    """Raw counts a check keeps in its findings' evidence, exported as one counter.

    A finding of ``check`` whose evidence has the key ``<prefix><kind>`` with a whole
    number gives the sample ``<metric>{host, subject, <label>="<kind>"} <number>``.
    """

    metric: str
    check: str
    prefix: str
    label: str
    help: str


#: The counters checks export. ``pcie.aer`` keeps each of the kernel's AER counters of a
#: PCIe function in its findings' evidence as ``aer.<name>`` (``aer.RxErr``,
#: ``aer.TOTAL_ERR_FATAL``, ...: Documentation/ABI/testing/sysfs-bus-pci-devices-aer);
#: they reset only at reboot, which ``increase()`` handles.
COUNTER_FAMILIES: tuple[CounterFamily, ...] = (
    CounterFamily(
        metric="host_auditor_pcie_aer_errors_total",
        check="pcie.aer",
        prefix="aer.",
        label="kind",
        help="AER errors the kernel counted on a PCIe function since boot, by counter.",
    ),
)
_COUNT = re.compile(r"[0-9]{1,20}")
#: The counter families by the check that keeps them, and by metric.
_COUNTERS: dict[str, tuple[CounterFamily, ...]] = {
    check: tuple(f for f in COUNTER_FAMILIES if f.check == check)
    for check in {f.check for f in COUNTER_FAMILIES}}
_FAMILY = {family.metric: family for family in COUNTER_FAMILIES}


@functools.lru_cache(maxsize=1 << 14)  # a fleet repeats its checks, subjects and statuses
def escape_label(value: str) -> str:
    """Escape a label value: backslash, double quote and line feed; no lone surrogates."""
    value = _SURROGATES.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _comment(value: str) -> str:
    # A comment ends at the line's end: fold the value onto one line of printable text.
    return _CONTROL.sub("?", " ".join(_SURROGATES.sub("\ufffd", value).split()))


def _labels(pairs: Sequence[tuple[str, str]], prefix: str = "") -> str:
    """Return ``{key="value",...}``; ``prefix``: labels already rendered (a machine's)."""
    rest = ",".join(f'{key}="{escape_label(value)}"' for key, value in pairs)
    if not prefix:
        return "{" + rest + "}"
    return "{" + prefix + ("," + rest if rest else "") + "}"


def _timestamp(started: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(started).timestamp()
    except ValueError:
        return None


def identity_labels(report: Report) -> list[tuple[str, str]]:
    """Return the labels that name a machine in every series: ``host`` (its hostname),
    ``target`` (the name the operator audited it under: ``audit host``) and ``machine_id``
    (its app-specific machine id, where known).

    A label with no value is left out: to Prometheus an empty label is an absent one
    (node_exporter fills a label a series lacks with ""), so ``audit local``'s series
    stay ``{host}`` plus the machine id.
    """
    pairs = [("host", report.host), ("target", report.name), ("machine_id", report.machine_id)]
    return [(key, value) for key, value in pairs if key == "host" or value]


def distinct_machines(reports: Sequence[Report]) -> tuple[list[Report], list[str]]:
    """Return one report per machine whose identity labels no earlier report has, and a
    comment for each report left out.

    node_exporter rejects a whole scrape where a series repeats ("collected before with
    the same name and label values"): two names of one machine are one machine, and a
    report whose labels repeat an earlier one's (two results files of one host) is left
    out, never written twice.
    """
    from auditor.fleet import one_per_machine

    kept, notes = one_per_machine(reports)
    seen: set[tuple[tuple[str, str], ...]] = set()
    out: list[Report] = []
    for report in kept:
        key = tuple(identity_labels(report))
        if key in seen:
            notes.append(f"{report.identity}: left out, an earlier report has the same host, "
                         "target and machine id")
            continue
        seen.add(key)
        out.append(report)
    return out, notes


class Sample(Protocol):
    """A finding as the exposition reads it: a merge's typed finding, or :class:`Row`."""

    @property
    def check(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def aspect(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def waived(self) -> bool: ...
    @property
    def evidence(self) -> Mapping[str, str]: ...


class Row(NamedTuple):
    """A :class:`~auditor.model.Finding` as the exposition reads it."""

    check: str
    subject: str
    aspect: str
    status: str
    severity: str
    waived: bool
    evidence: Mapping[str, str]


class Machine(NamedTuple):
    """What the exposition says of one machine: made from a :class:`Report`
    (:func:`machine_of`) or from a merge's typed document, and rendered by one code."""

    who: list[tuple[str, str]]
    #: The findings, in the report's order (check by check).
    findings: Sequence[Sample]
    #: (check, roll-up status) of each check, in the report's order.
    checks: Iterable[tuple[str, str]]
    #: (status, count) as :meth:`Report.summary` gives them.
    counts: Iterable[tuple[str, int]]
    error: str
    started: str
    duration_s: float
    #: The tuned state's fingerprint ("" where the host could not be audited).
    fingerprint: str
    comment: str


def comment_line(version: str, identity: str, aliases: Sequence[str], privilege: str) -> str:
    """Return a machine's comment: who made the numbers, and with what privilege."""
    # Each starts "# host-auditor": a host name can never make it a HELP or TYPE line.
    return (f"# host-auditor {_comment(version or '-')}: {_comment(identity)}"
            + (f" (also {_comment(', '.join(aliases))})" if aliases else "")
            + (f": audited without root ({_comment(privilege)})" if privilege else ""))


def machine_of(report: Report) -> Machine:
    """Return what the exposition says of a report."""
    return Machine(
        who=identity_labels(report),
        findings=[Row(f.check, f.subject, f.aspect, f.status.value, f.severity.value,
                      f.waived, dict(f.evidence)) for f in report.findings],
        checks=[(r.check, r.status.value) for r in report.results],
        counts=list(report.summary().items()),
        error=report.error, started=report.started, duration_s=report.duration_s,
        fingerprint="" if report.error else fingerprint(report),
        comment=comment_line(report.version, report.identity, report.aliases,
                             dict(report.facts).get("privilege", "")))


_MEASURED = "measured."


def render_prometheus(reports: Sequence[Report]) -> str:
    """Render reports as gauges (one per finding, one per check, counts, run facts) and the
    counters checks keep; one machine once, every series once."""
    reports, notes = distinct_machines(reports)
    comments, blocks = prometheus_parts([machine_of(report) for report in reports])
    out = comments + [f"# host-auditor: {_comment(line)}" for line in notes]
    for name, lines in blocks.items():
        if lines:
            out.append(family_header(name).rstrip("\n"))
            out.extend(lines)
    return "\n".join(out) + "\n"


#: Each metric family's HELP text and type, in the order the output lists them.
FAMILIES: dict[str, tuple[str, str]] = {
    **{name: (text, "gauge") for name, text in HELP.items()},
    **{family.metric: (family.help, "counter") for family in COUNTER_FAMILIES},
}


def family_header(name: str) -> str:
    """Return the HELP and TYPE lines of a metric family."""
    help_text, kind = FAMILIES[name]
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


@functools.lru_cache(maxsize=64)
def _finding_tail(status: str, severity: str, waived: bool) -> str:
    return _labels([("status", status), ("severity", severity),
                    ("waived", "true" if waived else "false")])[1:]


class Exposition:
    """Samples by metric family, added machine after machine.

    The machines must be distinct (:func:`distinct_machines`). Several expositions of them
    (``audit merge`` renders a fleet in chunks) give one when each family's samples are
    joined chunk after chunk under one header.
    """

    def __init__(self) -> None:
        #: A comment line per machine: who made the numbers, and with what privilege.
        self.comments: list[str] = []
        #: The samples of each metric family, in the order the output lists them.
        self.blocks: dict[str, list[str]] = {name: [] for name in FAMILIES}

    def add(self, machine: Machine) -> None:
        """Add one machine's samples."""
        import math

        escape, codes, tail = escape_label, STATUS_CODES, _finding_tail
        blocks = self.blocks
        who = _labels(machine.who)
        labels = who[1:-1]  # rendered once: every series of the machine starts so
        # A series must be unique: a finding's key (check, subject, aspect) is, within a
        # report; a report read back from elsewhere may repeat one: keep the worse. The
        # figures a probe measured (``measured.*`` evidence: fleets compare hosts by what
        # was measured, not only by the verdicts) and the counters checks keep, likewise.
        worst: dict[tuple[str, str, str], Sample] = {}
        measured: dict[tuple[str, str, str, str], str] = {}
        counted: dict[tuple[str, str, str], str] = {}
        for finding in machine.findings:
            check, subject, aspect = key = (finding.check, finding.subject, finding.aspect)
            held = worst.get(key)
            if held is None or codes[finding.status] > codes[held.status]:
                worst[key] = finding
            for name, value in finding.evidence.items():
                if name.startswith(_MEASURED):
                    metric = name[len(_MEASURED):]
                    series = (check, subject, aspect, metric)
                    if not metric or series in measured:
                        continue
                    try:
                        number = float(value)
                    except ValueError:
                        continue
                    if math.isfinite(number):
                        measured[series] = f"{number:.10g}"
                    continue
                for family in _COUNTERS.get(check, ()):
                    if not name.startswith(family.prefix) or not _COUNT.fullmatch(
                            value.strip()):
                        continue
                    kind = name[len(family.prefix):]
                    if kind and (family.metric, subject, kind) not in counted:
                        counted[family.metric, subject, kind] = str(int(value))
        blocks["host_auditor_finding"].extend(
            f'host_auditor_finding{{{labels},check="{escape(f.check)}",'
            f'subject="{escape(f.subject)}",aspect="{escape(f.aspect)}",'
            f"{tail(f.status, f.severity, f.waived)} 1" for f in worst.values())
        blocks["host_auditor_check_status"].extend(
            f'host_auditor_check_status{{{labels},check="{escape(check)}"}} {codes[status]}'
            for check, status in machine.checks)
        blocks["host_auditor_findings"].extend(
            f'host_auditor_findings{{{labels},status="{escape(status)}"}} {count}'
            for status, count in machine.counts)
        blocks["host_auditor_up"].append(f"host_auditor_up{who} {0 if machine.error else 1}")
        stamp = _timestamp(machine.started)
        if stamp is not None:
            blocks["host_auditor_last_run_timestamp_seconds"].append(
                f"host_auditor_last_run_timestamp_seconds{who} {stamp:.0f}")
        blocks["host_auditor_duration_seconds"].append(
            f"host_auditor_duration_seconds{who} {machine.duration_s:.4f}")
        if not machine.error:  # nothing read from an unreachable host: no tuned state
            blocks["host_auditor_tuning_info"].append(
                f'host_auditor_tuning_info{{{labels},'
                f'fingerprint="{escape(machine.fingerprint)}"}} 1')
        blocks["host_auditor_measurement"].extend(
            f'host_auditor_measurement{{{labels},check="{escape(check)}",'
            f'subject="{escape(subject)}",aspect="{escape(aspect)}",'
            f'metric="{escape(metric)}"}} {number}'
            for (check, subject, aspect, metric), number in measured.items())
        for (metric, subject, kind), count in counted.items():
            label = _FAMILY[metric].label
            blocks[metric].append(f'{metric}{{{labels},subject="{escape(subject)}",'
                                  f'{label}="{escape(kind)}"}} {count}')
        self.comments.append(machine.comment)


def prometheus_parts(machines: Sequence[Machine]) -> tuple[list[str], dict[str, list[str]]]:
    """Return the machines' comment lines and their samples by metric family (in output
    order): an :class:`Exposition` of them."""
    exposition = Exposition()
    for machine in machines:
        exposition.add(machine)
    return exposition.comments, exposition.blocks
