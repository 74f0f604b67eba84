"""Reports in the Prometheus text exposition format, for node_exporter's textfile collector.

Write the output to ``<textfile dir>/host_auditor.prom`` (through a temporary file and a
rename, as node_exporter asks). Every label value read from a host is untrusted and is
escaped as the format requires: backslash, double quote and line feed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

from auditor.model import Report, Status, fingerprint

#: Status codes of ``host_auditor_check_status``: higher is worse (``Status.order``).
STATUS_CODES = {status: status.order for status in Status}
_SURROGATES = re.compile("[\ud800-\udfff]")


def escape_label(value: str) -> str:
    """Escape a label value: backslash, double quote and line feed; no lone surrogates."""
    value = _SURROGATES.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
        # A series must be unique: two findings on one subject keep the worse status.
        worst: dict[tuple[str, str], tuple[Status, str]] = {}
        for finding in report.findings:
            key = (finding.check, finding.subject)
            if key not in worst or STATUS_CODES[finding.status] > STATUS_CODES[worst[key][0]]:
                worst[key] = (finding.status, finding.severity.value)
        for (check, subject), (verdict, severity) in worst.items():
            labels = _labels([("host", host), ("check", check), ("subject", subject),
                              ("status", verdict.value), ("severity", severity)])
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
         "One series per check and subject; the status label holds the verdict.",
         finding_lines),
        ("host_auditor_check_status", f"Worst status of each check ({codes}).", check_lines),
        ("host_auditor_findings", "Number of findings of each status.", count_lines),
        ("host_auditor_up", "1 if the host could be audited, 0 if not.", up_lines),
        ("host_auditor_last_run_timestamp_seconds", "When the audit started (Unix time).",
         time_lines),
        ("host_auditor_duration_seconds", "How long the audit took.", duration_lines),
        ("host_auditor_tuning_info", "Fingerprint of the host's tuned state (audit fingerprint).",
         info_lines),
    ]
    out: list[str] = []
    for name, help_text, lines in blocks:
        if not lines:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    return "\n".join(out) + "\n"
