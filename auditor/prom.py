"""Reports in the Prometheus text exposition format, for node_exporter's textfile collector.

Write the output to ``<textfile dir>/host_auditor.prom`` (through a temporary file and a
rename, as node_exporter asks). Every label value read from a host is untrusted and is
escaped as the format requires: backslash, double quote and line feed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

from auditor.model import Finding, Report, Status, fingerprint

#: Status codes of ``host_auditor_check_status``: higher is worse (``Status.order``).
STATUS_CODES = {status: status.order for status in Status}
_SURROGATES = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_label(value: str) -> str:
    """Escape a label value: backslash, double quote and line feed; no lone surrogates."""
    value = _SURROGATES.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _comment(value: str) -> str:
    # A comment ends at the line's end: fold the value onto one line of printable text.
    return _CONTROL.sub("?", " ".join(_SURROGATES.sub("\ufffd", value).split()))


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{key}="{escape_label(value)}"' for key, value in pairs) + "}"


def _timestamp(started: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(started).timestamp()
    except ValueError:
        return None


def render_prometheus(reports: Sequence[Report]) -> str:
    """Render reports as gauges: one per finding, one per check, counts and run facts."""
    codes = ", ".join(f"{code} {status.value}" for status, code in STATUS_CODES.items())
    finding_lines: list[str] = []
    check_lines: list[str] = []
    count_lines: list[str] = []
    up_lines: list[str] = []
    time_lines: list[str] = []
    duration_lines: list[str] = []
    info_lines: list[str] = []
    for report in reports:
        host = report.host
        # A series must be unique: a finding's key (check, subject, aspect) is, within a
        # report; a report read back from elsewhere may repeat one: keep the worse.
        worst: dict[tuple[str, str, str], Finding] = {}
        for finding in report.findings:
            key = finding.key
            if key not in worst or STATUS_CODES[finding.status] > STATUS_CODES[
                    worst[key].status]:
                worst[key] = finding
        for (check, subject, aspect), finding in worst.items():
            labels = _labels([("host", host), ("check", check), ("subject", subject),
                              ("aspect", aspect), ("status", finding.status.value),
                              ("severity", finding.severity.value),
                              ("waived", "true" if finding.waived else "false")])
            finding_lines.append(f"host_auditor_finding{labels} 1")
        for result in report.results:
            labels = _labels([("host", host), ("check", result.check)])
            check_lines.append(f"host_auditor_check_status{labels} {STATUS_CODES[result.status]}")
        for status, count in report.summary().items():
            labels = _labels([("host", host), ("status", status)])
            count_lines.append(f"host_auditor_findings{labels} {count}")
        up_lines.append(f"host_auditor_up{_labels([('host', host)])} {0 if report.error else 1}")
        stamp = _timestamp(report.started)
        if stamp is not None:
            time_lines.append(
                f"host_auditor_last_run_timestamp_seconds{_labels([('host', host)])} {stamp:.0f}"
            )
        duration_lines.append(
            f"host_auditor_duration_seconds{_labels([('host', host)])} {report.duration_s:.4f}"
        )
        if not report.error:  # nothing read from an unreachable host: no tuned state
            stamp_labels = _labels([("host", host), ("fingerprint", fingerprint(report))])
            info_lines.append(f"host_auditor_tuning_info{stamp_labels} 1")
    blocks = [
        ("host_auditor_finding",
         "One series per check, subject and aspect; the status label holds the verdict, "
         "waived says whether a policy waiver accepted it.",
         finding_lines),
        ("host_auditor_check_status",
         f"Roll-up of each check ({codes}): the worst judged status, skip only when every "
         "finding is a skip, a waived finding as pass.", check_lines),
        ("host_auditor_findings",
         "Number of findings of each status; waived ones are counted as status waived.",
         count_lines),
        ("host_auditor_up", "1 if the host could be audited, 0 if not.", up_lines),
        ("host_auditor_last_run_timestamp_seconds", "When the audit started (Unix time).",
         time_lines),
        ("host_auditor_duration_seconds", "How long the audit took.", duration_lines),
        ("host_auditor_tuning_info", "Fingerprint of the host's tuned state (audit fingerprint).",
         info_lines),
    ]
    out: list[str] = []
    for report in reports:
        # Comments in the exposition format: who made the numbers, and with what privilege.
        # Each starts "# host-auditor": a host name can never make it a HELP or TYPE line.
        privilege = dict(report.facts).get("privilege")
        out.append(f"# host-auditor {_comment(report.version or '-')}: {_comment(report.host)}"
                   + (f": audited without root ({_comment(privilege)})" if privilege else ""))
    for name, help_text, lines in blocks:
        if not lines:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    return "\n".join(out) + "\n"
