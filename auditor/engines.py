"""Outputs shaped for the engines fleets run host-auditor under, and their atomic writes.

- ``line``: one line per host, worst finding first, at most 80 bytes: the message of a
  node-problem-detector custom plugin (NPD keeps the first ``max_output_length`` bytes of
  stdout, 80 by default: kubernetes/node-problem-detector, pkg/custompluginmonitor/plugin),
  a Slurm drain reason, an NHC ``die`` message.
- ``nfd``: a node-feature-discovery feature file (kubernetes-sigs/node-feature-discovery,
  source/local/local.go and docs/usage/customization-guide.md, "Feature files"): an
  ``# +expiry-time=`` directive so the labels vanish when the audits stop, then
  ``<namespace>/<name>=<value>`` lines that nfd-master accepts (label names and values
  valid as Kubernetes labels: never a PCI address, whose ``:`` is not allowed).

:func:`write_atomic` writes a report through a dot-file in the target's directory and a
rename, so node_exporter's textfile collector (``*.prom`` only) and NFD (which skips
dot-files) never read a half-written file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Sequence

from auditor.model import PROBLEMS, Finding, Report, Severity, Status, fingerprint

#: node-problem-detector's default ``max_output_length``: the bytes of a message it keeps.
LINE_BYTES = 80

#: Label namespace of the NFD feature file. Sub-namespaces of feature.node.kubernetes.io
#: are always allowed by nfd-master ("cannot be denied": master-configuration-reference.md),
#: so the labels need no ``extraLabelNs``; a site may choose its own domain instead.
NFD_NAMESPACE_ENV = "HOST_AUDITOR_NFD_NAMESPACE"
NFD_NAMESPACE = "host-auditor.feature.node.kubernetes.io"
#: Seconds the labels stay valid after the audit that wrote them (three 5-minute loops).
NFD_TTL_ENV = "HOST_AUDITOR_NFD_TTL"
NFD_TTL_S = 900
#: NFD ignores a feature file larger than this (source/local/local.go MaxFeatureFileSize).
NFD_MAX_BYTES = 65536

# Kubernetes label grammar (k8s.io/apimachinery/pkg/util/validation): a value or a name
# part is at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric; a
# prefix is a DNS-1123 subdomain of at most 253 characters.
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]{0,61}"
                           r"[a-z0-9])?)*")

_NOT_PRINTABLE_ASCII = re.compile("[^\x20-\x7e]")
_SEVERITY_RANK = {severity: index for index, severity in enumerate(Severity)}


def _ascii_line(text: str) -> str:
    """Fold text onto one line of printable ASCII: a byte count is then a character count."""
    return _NOT_PRINTABLE_ASCII.sub("?", " ".join(text.split()))


def _fit(head: str, tail: str, limit: int) -> str:
    """Return ``head`` + ``tail`` in at most ``limit`` characters, cutting ``head``."""
    room = limit - len(tail)
    if len(head) > room:
        head = head[: max(0, room - 3)].rstrip() + "..."
    return (head + tail)[:limit]


def _worst_first(findings: Sequence[Finding]) -> list[Finding]:
    """Order findings worst status first, then highest severity, then report order."""
    ranked = sorted(enumerate(findings), key=lambda item: (
        -item[1].status.order, -_SEVERITY_RANK[item[1].severity], item[0]))
    return [finding for _, finding in ranked]


def _finding_text(finding: Finding) -> str:
    detail = finding.observed or finding.message
    if finding.observed and finding.expected:
        detail = f"{finding.observed}, want {finding.expected}"
    return f"{finding.status.value.upper()} {finding.check} {finding.subject} {detail}"


def report_line(report: Report, *, prefix: str = "", limit: int = LINE_BYTES) -> str:
    """Return one line for one host: its worst problem and how many more, or ``OK N checks``."""
    head = _ascii_line(prefix)
    head = head + " " if head else ""
    if report.error:
        return _fit(_ascii_line(f"{head}ERROR {report.error}"), "", limit)
    problems = _worst_first([f for f in report.findings if f.counted in PROBLEMS])
    if not problems:
        checks = len(report.results)
        skipped = sum(1 for r in report.results if r.status is Status.SKIP)
        text = f"{head}OK {checks} check{'s' if checks != 1 else ''}"
        return _fit(text + (f" ({skipped} skipped)" if skipped else ""), "", limit)
    more = len(problems) - 1
    tail = f" (+{more} more)" if more else ""
    return _fit(_ascii_line(head + _finding_text(problems[0])), tail, limit)


def render_line(reports: Sequence[Report]) -> str:
    """Render one line per host (at most 80 bytes each); several hosts are named by the
    name they were audited under (else their hostname), one machine once."""
    if len(reports) == 1:
        return report_line(reports[0]) + "\n"
    from auditor.fleet import one_per_machine

    kept, _ = one_per_machine(reports)
    return "".join(report_line(r, prefix=r.label) + "\n" for r in kept)


# -- Nagios / Icinga plugin ------------------------------------------------------------------

#: The plugin states (Nagios Plugin API, "Plugin Return Codes"; Icinga's are the same).
NAGIOS_OK, NAGIOS_WARNING, NAGIOS_CRITICAL, NAGIOS_UNKNOWN = 0, 1, 2, 3
_NAGIOS_NAMES = {NAGIOS_OK: "OK", NAGIOS_WARNING: "WARNING", NAGIOS_CRITICAL: "CRITICAL",
                 NAGIOS_UNKNOWN: "UNKNOWN"}
#: Problems listed after the first line (Nagios keeps 8 KiB of a plugin's output by default).
NAGIOS_LINES = 50


def nagios_state(reports: Sequence[Report]) -> int:
    """Return the plugin state: UNKNOWN if a host could not be audited, else CRITICAL for a
    ``fail`` or ``error`` finding, WARNING for a ``warn``, else OK (waived ones count as
    passes, skips are not problems)."""
    if any(r.error for r in reports):
        return NAGIOS_UNKNOWN
    worst = max((f.counted.order for r in reports for f in r.findings), default=0)
    if worst >= Status.FAIL.order:
        return NAGIOS_CRITICAL
    return NAGIOS_WARNING if worst >= Status.WARN.order else NAGIOS_OK


def render_nagios(reports: Sequence[Report]) -> str:
    """Render the Nagios/Icinga plugin output: a status line with performance data, then one
    line per problem (the plugin's exit code is :func:`nagios_state`)."""
    from auditor.fleet import one_per_machine

    kept, _ = one_per_machine(reports) if len(reports) > 1 else (list(reports), [])
    state = nagios_state(kept)
    counts = dict.fromkeys(("pass", "warn", "fail", "error", "skip", "waived"), 0)
    for report in kept:
        for key, value in report.summary().items():
            counts[key] = counts.get(key, 0) + value
    several = len(kept) > 1
    problems: list[str] = []
    for report in kept:
        prefix = report.label if several else ""
        if report.error:
            problems.append(report_line(report, prefix=prefix, limit=200))
            continue
        for finding in _worst_first([f for f in report.findings if f.counted in PROBLEMS]):
            head = f"{prefix} " if prefix else ""
            problems.append(_ascii_line(head + _finding_text(finding))[:200])
    if state == NAGIOS_UNKNOWN:
        down = [r.label for r in kept if r.error]
        summary = f"{len(down)} of {len(kept)} hosts not audited: {', '.join(down)}"
    elif problems:
        summary = (f"{counts['fail'] + counts['error']} fail, {counts['warn']} warn: "
                   f"{problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1
                                       else ""))
    else:
        checks = len({r.check for report in kept for r in report.results})
        summary = f"{checks} checks pass" + (f" on {len(kept)} hosts" if several else "")
    perf = " ".join(f"{key}={value};;;0" for key, value in counts.items())
    duration = max((r.duration_s for r in kept), default=0.0)
    first = _ascii_line(f"HOST-AUDITOR {_NAGIOS_NAMES[state]} - {summary}")[:400]
    lines = [f"{first} | {perf} duration={duration:.3f}s;;;0"]
    lines += problems[1:NAGIOS_LINES + 1] if state != NAGIOS_UNKNOWN else problems
    return "\n".join(lines) + "\n"


# -- node-feature-discovery ------------------------------------------------------------------


def nfd_namespace() -> str:
    """Return the label namespace: ``$HOST_AUDITOR_NFD_NAMESPACE`` or the default."""
    from auditor.errors import UsageError

    namespace = os.environ.get(NFD_NAMESPACE_ENV, "").strip() or NFD_NAMESPACE
    if len(namespace) > 253 or not DNS_SUBDOMAIN.fullmatch(namespace):
        raise UsageError(f"{NFD_NAMESPACE_ENV}={namespace[:80]!r} is not a DNS subdomain "
                         "(lowercase letters, digits, '-' and '.')")
    if namespace == "kubernetes.io" or (namespace.endswith(".kubernetes.io") and not (
            namespace == "feature.node.kubernetes.io"
            or namespace.endswith(".feature.node.kubernetes.io"))):
        raise UsageError(f"{NFD_NAMESPACE_ENV}={namespace!r}: nfd-master denies kubernetes.io "
                         "namespaces other than feature.node.kubernetes.io")
    return namespace


def nfd_ttl() -> int:
    """Return how many seconds the labels live: ``$HOST_AUDITOR_NFD_TTL`` or 900."""
    from auditor.errors import UsageError

    text = os.environ.get(NFD_TTL_ENV, "").strip()
    if not text:
        return NFD_TTL_S
    if not text.isdigit() or not 60 <= int(text) <= 366 * 86400:
        raise UsageError(f"{NFD_TTL_ENV}={text[:20]!r}: give whole seconds from 60 to 31622400")
    return int(text)


def valid_label(name: str, value: str) -> bool:
    """Return whether ``name=value`` is a label nfd-master accepts (name without its prefix)."""
    return bool(LABEL_NAME.fullmatch(name)) and bool(LABEL_VALUE.fullmatch(value))


def _node_status(report: Report) -> Status:
    """Return the node's verdict: the worst finding, a skip or a waived one counting as a
    pass."""
    if report.error:
        return Status.ERROR
    worst = max((f.counted for f in report.findings if f.status is not Status.SKIP),
                key=lambda status: status.order, default=Status.PASS)
    return worst


def render_nfd(reports: Sequence[Report], *, now: dt.datetime | None = None) -> str:
    """Render one node's report as an NFD feature file: expiry, status, fingerprint, checks."""
    from auditor.errors import UsageError

    if len(reports) != 1:
        raise UsageError(f"--format nfd labels one node; {len(reports)} hosts were audited "
                         "(run audit local on each node)")
    report = reports[0]
    namespace, ttl = nfd_namespace(), nfd_ttl()
    now = now or dt.datetime.now(dt.timezone.utc)
    expiry = (now + dt.timedelta(seconds=ttl)).astimezone(dt.timezone.utc)
    machine = f" (machine id {report.machine_id})" if report.machine_id else ""
    header = f"host-auditor labels for {report.identity}{machine}, audited {report.started}"
    lines = [
        f"# {_ascii_line(header)}"[:200],
        f"# +expiry-time={expiry:%Y-%m-%dT%H:%M:%SZ}",
        f"{namespace}/status={_node_status(report).value}",
    ]
    if report.error:
        lines.insert(1, f"# {_ascii_line(f'not audited: {report.error}')}"[:200])
    else:
        lines.append(f"{namespace}/fingerprint={fingerprint(report)}")
    for result in report.results:
        # Check ids are area.name in lowercase; a plug-in's id that is no label name is
        # left out rather than rejected by nfd-master with the rest of the file.
        if valid_label(result.check, result.status.value):
            lines.append(f"{namespace}/{result.check}={result.status.value}")
    if any(result.check.startswith("probe.") for result in report.results):
        from auditor.probes.prove import worst_figures

        # What audit probe measured: the worst GPU's (node's) figure of each probe.
        lines += [f"{namespace}/{name}={value}" for name, value in worst_figures(report)
                  if valid_label(name, value)]
    text = "\n".join(lines) + "\n"
    return text[:NFD_MAX_BYTES]


# -- writing where an engine reads ---------------------------------------------------------


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a dot-file beside it and a rename.

    See :func:`auditor.outfile.write_file`: the new file is made ``0666 & ~umask`` (a
    collector running as another user, node_exporter, can read it); a symlink is followed
    only when it is our own; a device, FIFO or other special file there, a symlink of
    another user, or a directory others may change is refused. Raise OSError.
    """
    from auditor.outfile import write_text

    write_text(path, text)


def write_atomic_chunks(path: str, chunks: Iterable[bytes]) -> None:
    """Write the pieces to ``path`` as :func:`write_atomic` writes text (a large report)."""
    from auditor.outfile import write_file

    write_file(path, chunks)
