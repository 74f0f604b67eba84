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
from collections.abc import Sequence
from dataclasses import dataclass

from auditor.model import Finding, Report, Status, fingerprint

#: Status codes of ``host_auditor_check_status``: higher is worse (``Status.order``).
STATUS_CODES = {status: status.order for status in Status}
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


def _counter_lines(reports: Sequence[Report], family: CounterFamily) -> list[str]:
    lines: list[str] = []
    seen: set[tuple[str, str, str, str]] = set()
    for report in reports:
        for finding in report.findings:
            if finding.check != family.check:
                continue
            for key, value in finding.evidence:
                if not key.startswith(family.prefix) or not _COUNT.fullmatch(value.strip()):
                    continue
                kind = key[len(family.prefix):]
                series = (report.label, report.machine_id, finding.subject, kind)
                if not kind or series in seen:  # a series must be unique
                    continue
                seen.add(series)
                labels = _labels([*identity_labels(report), ("subject", finding.subject),
                                  (family.label, kind)])
                lines.append(f"{family.metric}{labels} {int(value)}")
    return lines


_MEASURED = "measured."


def _measurement_lines(reports: Sequence[Report]) -> list[str]:
    """Return a gauge per figure a probe measured (a finding's ``measured.*`` evidence), so
    fleets compare hosts by what was measured, not only by the verdicts."""
    import math

    lines: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for report in reports:
        for finding in report.findings:
            for key, value in finding.evidence:
                if not key.startswith(_MEASURED):
                    continue
                try:
                    number = float(value)
                except ValueError:
                    continue
                metric = key[len(_MEASURED):]
                series = (report.label, report.machine_id, finding.check, finding.subject,
                          finding.aspect, metric)
                if not metric or not math.isfinite(number) or series in seen:
                    continue
                seen.add(series)
                labels = _labels([*identity_labels(report), ("check", finding.check),
                                  ("subject", finding.subject), ("aspect", finding.aspect),
                                  ("metric", metric)])
                lines.append(f"host_auditor_measurement{labels} {number:.10g}")
    return lines


def render_prometheus(reports: Sequence[Report]) -> str:
    """Render reports as gauges (one per finding, one per check, counts, run facts) and the
    counters checks keep; one machine once, every series once."""
    reports, notes = distinct_machines(reports)
    comments, blocks = prometheus_parts(reports)
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


def prometheus_parts(reports: Sequence[Report]) -> tuple[list[str], dict[str, list[str]]]:
    """Return the reports' comment lines and their samples by metric family (in output order).

    The reports must be distinct machines (:func:`distinct_machines`). Several batches of
    them (``audit merge`` renders a fleet in chunks) give one exposition when each family's
    samples are joined batch after batch under one header.
    """
    finding_lines: list[str] = []
    check_lines: list[str] = []
    count_lines: list[str] = []
    up_lines: list[str] = []
    time_lines: list[str] = []
    duration_lines: list[str] = []
    info_lines: list[str] = []
    for report in reports:
        who = identity_labels(report)
        machine = _labels(who)[1:-1]  # rendered once: every series of the machine starts so
        # A series must be unique: a finding's key (check, subject, aspect) is, within a
        # report; a report read back from elsewhere may repeat one: keep the worse.
        worst: dict[tuple[str, str, str], Finding] = {}
        for finding in report.findings:
            key = finding.key
            if key not in worst or STATUS_CODES[finding.status] > STATUS_CODES[
                    worst[key].status]:
                worst[key] = finding
        for (check, subject, aspect), finding in worst.items():
            labels = _labels([("check", check), ("subject", subject),
                              ("aspect", aspect), ("status", finding.status.value),
                              ("severity", finding.severity.value),
                              ("waived", "true" if finding.waived else "false")], machine)
            finding_lines.append(f"host_auditor_finding{labels} 1")
        for result in report.results:
            labels = _labels([("check", result.check)], machine)
            check_lines.append(f"host_auditor_check_status{labels} {STATUS_CODES[result.status]}")
        for status, count in report.summary().items():
            labels = _labels([("status", status)], machine)
            count_lines.append(f"host_auditor_findings{labels} {count}")
        up_lines.append(f"host_auditor_up{_labels(who)} {0 if report.error else 1}")
        stamp = _timestamp(report.started)
        if stamp is not None:
            time_lines.append(
                f"host_auditor_last_run_timestamp_seconds{_labels(who)} {stamp:.0f}"
            )
        duration_lines.append(
            f"host_auditor_duration_seconds{_labels(who)} {report.duration_s:.4f}"
        )
        if not report.error:  # nothing read from an unreachable host: no tuned state
            stamp_labels = _labels([("fingerprint", fingerprint(report))], machine)
            info_lines.append(f"host_auditor_tuning_info{stamp_labels} 1")
    blocks = {
        "host_auditor_finding": finding_lines,
        "host_auditor_check_status": check_lines,
        "host_auditor_findings": count_lines,
        "host_auditor_up": up_lines,
        "host_auditor_last_run_timestamp_seconds": time_lines,
        "host_auditor_duration_seconds": duration_lines,
        "host_auditor_tuning_info": info_lines,
        "host_auditor_measurement": _measurement_lines(reports),
    }
    for family in COUNTER_FAMILIES:
        blocks[family.metric] = _counter_lines(reports, family)
    comments: list[str] = []
    for report in reports:
        # Comments in the exposition format: who made the numbers, and with what privilege.
        # Each starts "# host-auditor": a host name can never make it a HELP or TYPE line.
        privilege = dict(report.facts).get("privilege")
        comments.append(
            f"# host-auditor {_comment(report.version or '-')}: {_comment(report.identity)}"
            + (f" (also {_comment(', '.join(report.aliases))})" if report.aliases else "")
            + (f": audited without root ({_comment(privilege)})" if privilege else ""))
    return comments, blocks

