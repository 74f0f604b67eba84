"""Beyond one host: tuning fingerprints, merging per-host JSON results, golden-host diffs.

Each node of a cluster runs ``audit local --format json`` through whatever engine the
cluster already has; :func:`load_results` reads those files back, :func:`fleet_view`
lays them out as hosts by checks, and :func:`golden_diff` says which hosts differ from
a reference host and on what.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from auditor.model import CheckResult, Finding, Report, Severity, Status

#: Bump when the fingerprint's inputs change, so old and new stamps never collide.
FINGERPRINT_VERSION = 1
FINGERPRINT_LENGTH = 12

#: Hosts sort worst first; a cell or host shows its worst status.
_ORDER = {"error": 0, "fail": 1, "warn": 2, "skip": 3, "pass": 4}
_RANK = {"pass": 0, "skip": 1, "warn": 2, "fail": 3, "error": 4}


def _worst(statuses: Iterable[str]) -> str:
    return max(statuses, key=_RANK.__getitem__, default="pass")


def _raw_status(finding: Finding) -> str:
    # A waiver is policy, not tuning: fingerprint the status the host really has.
    if finding.status is not Status.PASS or not finding.evidence:
        return finding.status.value
    return dict(finding.evidence).get("waived") or finding.status.value


def fingerprint_inputs(report: Report) -> dict[str, Any]:
    """Return what defines a host's tuned state: check ids, subjects, statuses, observed."""
    findings = sorted(
        {(f.check, f.subject, _raw_status(f), f.observed) for f in report.findings}
    )
    return {
        "version": FINGERPRINT_VERSION,
        "checks": sorted({r.check for r in report.results}),
        "findings": [list(item) for item in findings],
    }


def fingerprint(report: Report) -> str:
    """Return a short, stable hex digest of the host's tuned state (no times, no host name)."""
    canonical = json.dumps(fingerprint_inputs(report), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_LENGTH]


# -- reading results --------------------------------------------------------------------


@dataclass(frozen=True)
class Unreadable:
    """An input file that could not be merged, and why (one line)."""

    path: str
    reason: str

    def line(self) -> str:
        """Return the one-line message naming the file."""
        return f"{self.path}: {self.reason}; left out of the merge"


@dataclass
class LoadedResults:
    """The reports read from result files, the files that could not be read, and notes."""

    reports: list[Report] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    unreadable: list[Unreadable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _documents(data: Any) -> list[Mapping[str, Any]]:
    if isinstance(data, Mapping) and isinstance(data.get("hosts"), list):
        return list(data["hosts"])
    if isinstance(data, Mapping):
        return [data]
    raise ValueError("not an audit report (a JSON object with host and findings)")


_STATUSES = {s.value: s for s in Status}
_SEVERITIES = {s.value: s for s in Severity}
_TEXT_FIELDS = ("check", "host", "subject", "observed", "expected", "message", "fix")
_STR = frozenset({str})
_text_fields = operator.itemgetter(*_TEXT_FIELDS)


def _finding(data: Any) -> Finding:
    """Build a finding from its JSON form, fast for what ``audit`` writes.

    A merge reads hundreds of thousands of findings: the common case (every field a
    string, evidence a table of strings) skips the per-field conversions and the
    frozen dataclass's ``__init__``; anything else goes through ``Finding.from_dict``.
    """
    if type(data) is dict:
        evidence = data.get("evidence") or {}
        status_text, severity_text = data.get("status"), data.get("severity", "info")
        status = _STATUSES.get(status_text) if type(status_text) is str else None
        severity = _SEVERITIES.get(severity_text) if type(severity_text) is str else None
        try:
            values = _text_fields(data)
        except KeyError:  # not written by audit: some field left out
            values = [data.get(key, "") for key in _TEXT_FIELDS]
        if (
            status is not None and severity is not None and type(evidence) is dict
            and "check" in data and set(map(type, values)) <= _STR
            and set(map(type, evidence)) <= _STR and set(map(type, evidence.values())) <= _STR
        ):
            finding = object.__new__(Finding)
            fields = dict(zip(_TEXT_FIELDS, values, strict=True))
            fields.update(status=status, severity=severity, evidence=tuple(evidence.items()))
            finding.__dict__.update(fields)
            return finding
    return Finding.from_dict(data)


def _report(document: Any) -> Report:
    if not isinstance(document, Mapping) or not isinstance(document.get("host"), str):
        raise ValueError("not an audit report (no host name)")
    findings_data = document.get("findings", [])
    checks_data = document.get("checks", [])
    if not isinstance(findings_data, list) or not isinstance(checks_data, list):
        raise ValueError("not an audit report (findings or checks is not a list)")
    try:
        findings = [_finding(f) for f in findings_data]
        durations = {str(c["check"]): float(c.get("duration_s", 0.0)) for c in checks_data}
        grouped: dict[str, list[Finding]] = {check: [] for check in durations}
        for finding in findings:
            grouped.setdefault(finding.check, []).append(finding)
        return Report(
            host=document["host"],
            target=str(document.get("target", document["host"])),
            started=str(document.get("started", "")),
            duration_s=float(document.get("duration_s", 0.0)),
            results=tuple(
                CheckResult(check, durations.get(check, 0.0), tuple(items))
                for check, items in grouped.items()
            ),
            facts=tuple((str(k), str(v)) for k, v in dict(document.get("facts") or {}).items()),
            error=str(document.get("error", "")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an audit report ({type(exc).__name__}: {exc})") from exc


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause the cycle collector while many acyclic objects are made.

    Reading 10,000 reports makes over a million objects; each collection walks all
    of them again, which tripled the load time. Nothing made here forms a cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was made lives until the command ends: leave it out of later
        # collections rather than walk it again at the next one.
        gc.freeze()
        if enabled:
            gc.enable()


def load_results(paths: Iterable[str]) -> LoadedResults:
    """Read per-host JSON reports; a file that cannot be read is noted and left out.

    A host reported by several files keeps the newest report (by ``started``, then the
    later file), and a note says so.
    """
    with _no_cycle_collection():
        return _load_results(paths)


def _read(path: str) -> bytes | OSError:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        return exc


def _read_ahead(paths: Iterable[str], window: int = 256) -> Iterator[tuple[str, bytes | OSError]]:
    """Yield (path, bytes or the error) in order, reading a window of files ahead.

    Thousands of small files on a busy disk wait on I/O more than they parse: a few
    threads keep reads in flight while this thread decodes (read releases the GIL).
    """
    from concurrent.futures import ThreadPoolExecutor

    pending = list(paths)
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="read") as pool:
        for start in range(0, len(pending), window):
            chunk = pending[start:start + window]
            yield from zip(chunk, pool.map(_read, chunk), strict=True)


def _load_results(paths: Iterable[str]) -> LoadedResults:
    loaded = LoadedResults()
    by_host: dict[str, int] = {}
    for path, raw in _read_ahead(paths):
        if isinstance(raw, OSError):
            loaded.unreadable.append(Unreadable(path, f"cannot read ({raw.strerror})"))
            continue
        try:
            data = json.loads(raw)
        except UnicodeDecodeError:
            loaded.unreadable.append(Unreadable(path, "not UTF-8 text"))
            continue
        except json.JSONDecodeError as exc:
            cut = exc.msg.startswith("Unterminated") or exc.pos >= len(raw.rstrip())
            what = "truncated JSON" if cut and raw.strip() else "not valid JSON"
            loaded.unreadable.append(
                Unreadable(path, f"{what}: {exc.msg} (line {exc.lineno} column {exc.colno})")
            )
            continue
        try:
            reports = [_report(doc) for doc in _documents(data)]
        except ValueError as exc:
            loaded.unreadable.append(Unreadable(path, " ".join(str(exc).split())))
            continue
        for report in reports:
            seen = by_host.get(report.host)
            if seen is None:
                by_host[report.host] = len(loaded.reports)
                loaded.reports.append(report)
                loaded.sources[report.host] = path
                continue
            kept = loaded.reports[seen]
            newer = report.started >= kept.started
            loaded.notes.append(
                f"{report.host}: reported by {loaded.sources[report.host]} and {path}; "
                f"keeping {path if newer else loaded.sources[report.host]} (newer)"
            )
            if newer:
                loaded.reports[seen] = report
                loaded.sources[report.host] = path
    return loaded


# -- the fleet view ---------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One check and subject where a host differs from the golden host."""

    check: str
    subject: str
    golden_status: str
    golden_observed: str
    status: str
    observed: str

    def describe(self) -> str:
        """Return a one-line account of the difference."""
        if not self.golden_status:
            return f"{self.check} {self.subject}: only here ({self.status}, {self.observed!r})"
        if not self.status:
            return (f"{self.check} {self.subject}: missing here (golden: {self.golden_status},"
                    f" {self.golden_observed!r})")
        parts = []
        if self.status != self.golden_status:
            parts.append(f"status {self.golden_status} -> {self.status}")
        if self.observed != self.golden_observed:
            parts.append(f"observed {self.golden_observed!r} -> {self.observed!r}")
        return f"{self.check} {self.subject}: {', '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "check": self.check,
            "subject": self.subject,
            "golden": {"status": self.golden_status, "observed": self.golden_observed},
            "host": {"status": self.status, "observed": self.observed},
        }


def _state(report: Report) -> dict[tuple[str, str], tuple[str, str]]:
    state: dict[tuple[str, str], tuple[str, str]] = {}
    for finding in report.findings:
        key = (finding.check, finding.subject)
        value = (_raw_status(finding), finding.observed)
        # Two findings on one subject: keep the worse, so the comparison is stable.
        if key not in state or _RANK.get(value[0], 0) > _RANK.get(state[key][0], 0):
            state[key] = value
    return state


def golden_diff(
    reports: Sequence[Report], golden: str
) -> dict[str, list[Difference]]:
    """Return, for every other host, where it differs from ``golden`` (empty list: same)."""
    by_host = {r.host: r for r in reports}
    reference = _state(by_host[golden])
    diffs: dict[str, list[Difference]] = {}
    for report in reports:
        if report.host == golden or report.error:
            continue  # a host that could not be audited is listed as such, not diffed
        state = _state(report)
        found: list[Difference] = []
        for key in sorted(reference.keys() | state.keys()):
            want = reference.get(key, ("", ""))
            have = state.get(key, ("", ""))
            if want != have:
                found.append(Difference(key[0], key[1], want[0], want[1], have[0], have[1]))
        diffs[report.host] = found
    return diffs


@dataclass(frozen=True)
class Cell:
    """One host's result for one check: its worst status and the findings behind it."""

    status: str
    findings: tuple[Finding, ...]
    differs: bool = False


@dataclass
class FleetView:
    """Hosts by checks, with the groups and counts the fleet report shows."""

    hosts: list[Report]
    checks: list[str]
    cells: dict[str, dict[str, Cell]]
    fingerprints: dict[str, str]
    groups: list[tuple[str, list[str]]]
    unreadable: list[Unreadable]
    notes: list[str]
    golden: str | None = None
    diffs: dict[str, list[Difference]] = field(default_factory=dict)

    statuses: dict[str, str] = field(default_factory=dict)

    def host_status(self, report: Report) -> str:
        """Return a host's worst status (``error`` when it could not be audited)."""
        return self.statuses[report.host]

    def check_counts(self) -> dict[str, dict[str, int]]:
        """Count, per check, the hosts by their worst status for it."""
        counts: dict[str, dict[str, int]] = {
            c: {s.value: 0 for s in Status} for c in self.checks
        }
        for host_cells in self.cells.values():
            for check, cell in host_cells.items():
                counts[check][cell.status] += 1
        return counts

    def host_counts(self) -> dict[str, int]:
        """Count the hosts by their worst status."""
        counts = {s.value: 0 for s in Status}
        for status in self.statuses.values():
            counts[status] += 1
        return counts

    def problems(self) -> list[tuple[str, str, str, list[str]]]:
        """Return (status, check, subject, hosts) for every warn/fail/error, worst first."""
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for report in self.hosts:
            for finding in report.findings:
                if finding.status.rank == 0:
                    continue
                key = (finding.status.value, finding.check, finding.subject)
                grouped.setdefault(key, []).append(report.host)
        order = {"error": 0, "fail": 1, "warn": 2}
        return [
            (status, check, subject, hosts)
            for (status, check, subject), hosts in sorted(
                grouped.items(), key=lambda item: (order[item[0][0]], -len(item[1]), item[0])
            )
        ]

    def host_dict(self, report: Report) -> dict[str, Any]:
        """Return one host's report in its JSON form, with its fingerprint."""
        return {**report.to_dict(), "fingerprint": self.fingerprints[report.host]}

    def to_dict(self, hosts: bool = True) -> dict[str, Any]:
        """Return the JSON form of the fleet report (``hosts=False``: all but the reports)."""
        data: dict[str, Any] = {
            "summary": {
                "hosts": len(self.hosts),
                "unreachable": sum(1 for r in self.hosts if r.error),
                "hosts_by_status": self.host_counts(),
                "checks": self.check_counts(),
                "findings": _finding_counts(self.hosts),
            },
            "unreadable": [{"path": u.path, "reason": u.reason} for u in self.unreadable],
            "notes": list(self.notes),
            "fingerprints": {fp: hosts for fp, hosts in self.groups},
            "grid": {
                host: {check: cell.status for check, cell in row.items()}
                for host, row in self.cells.items()
            },
        }
        if hosts:
            data["hosts"] = [self.host_dict(r) for r in self.hosts]
        if self.golden is not None:
            data["golden"] = {
                "host": self.golden,
                "same": sorted(h for h, d in self.diffs.items() if not d),
                "differ": {
                    h: [d.to_dict() for d in found]
                    for h, found in sorted(self.diffs.items()) if found
                },
            }
        return data


def _finding_counts(reports: Iterable[Report]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for report in reports:
        for finding in report.findings:
            counts[finding.status.value] += 1
    return counts




def fleet_view(
    loaded: LoadedResults, golden: str | None = None
) -> FleetView:
    """Lay the reports out as hosts by checks, worst hosts first; diff against ``golden``."""
    with _no_cycle_collection():
        return _fleet_view(loaded, golden)


def _fleet_view(loaded: LoadedResults, golden: str | None) -> FleetView:
    cells: dict[str, dict[str, Cell]] = {}
    statuses: dict[str, str] = {}
    for report in loaded.reports:
        row: dict[str, Cell] = {}
        for result in report.results:
            row[result.check] = Cell(
                status=_worst({f.status.value for f in result.findings}),
                findings=result.findings,
            )
        cells[report.host] = row
        statuses[report.host] = "error" if report.error else _worst(
            {c.status for c in row.values()})
    reports = sorted(loaded.reports, key=lambda r: (_ORDER[statuses[r.host]], r.host))
    checks = list(dict.fromkeys(res.check for r in reports for res in r.results))
    diffs = golden_diff(reports, golden) if golden is not None else {}
    for host, found in diffs.items():
        row = cells[host]
        for check in {d.check for d in found}:
            if check in row:
                row[check] = replace(row[check], differs=True)
    fingerprints: dict[str, str] = {}
    groups: dict[str, list[str]] = {}
    for report in reports:
        if report.error:
            fingerprints[report.host] = ""  # nothing was read: no tuned state to stamp
            continue
        stamp = fingerprint(report)
        fingerprints[report.host] = stamp
        groups.setdefault(stamp, []).append(report.host)
    ordered_groups = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return FleetView(
        hosts=reports,
        checks=checks,
        cells=cells,
        fingerprints=fingerprints,
        groups=ordered_groups,
        unreadable=list(loaded.unreadable),
        notes=list(loaded.notes),
        golden=golden,
        diffs=diffs,
        statuses=statuses,
    )


FLEET_FORMATS = ("text", "json", "html", "prometheus")


def render_fleet(view: FleetView, fmt: str, *, limit: int = 10) -> str:
    """Render the fleet report: text, json, html (hosts by checks) or prometheus."""
    if fmt == "json":
        # One host at a time: the whole fleet as dicts at once would triple the memory.
        head = json.dumps(view.to_dict(hosts=False), indent=1, ensure_ascii=False)
        hosts = ",\n".join(json.dumps(view.host_dict(r), ensure_ascii=False) for r in view.hosts)
        return f'{head[:-2]},\n "hosts": [\n{hosts}\n ]\n}}\n'

    if fmt == "prometheus":
        from auditor.prom import render_prometheus

        return render_prometheus(view.hosts)
    if fmt not in FLEET_FORMATS:
        raise ValueError(f"unknown fleet format {fmt!r}")
    from auditor.render import make_environment

    env = make_environment("html" if fmt == "html" else "text")
    template = env.get_template("fleet.html.j2" if fmt == "html" else "merge.txt.j2")
    return template.render(view=view, limit=limit)
