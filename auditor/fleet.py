"""Beyond one host: the fleet view of many hosts' reports, and golden-host diffs.

Each node of a cluster runs ``audit local --format json`` through whatever engine the
cluster already has; :func:`auditor.results.load_results` reads those files back,
:func:`fleet_view` lays them out as hosts by checks, and :func:`golden_diff` says which
hosts differ from a reference host and on what.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from auditor.model import (
    Finding,
    Report,
    Status,
    count_by_status,
    fingerprint,
    raw_status,
    worst,
)
from auditor.results import LoadedResults, Unreadable, no_cycle_collection


@dataclass(frozen=True)
class Difference:
    """One check and subject where a host differs from the golden host."""

    check: str
    subject: str
    golden_status: str
    golden_observed: str
    status: str
    observed: str
    aspect: str = ""

    @property
    def label(self) -> str:
        """Return the subject with its aspect, as the text views show a finding's key."""
        return f"{self.subject} [{self.aspect}]" if self.aspect else self.subject

    def describe(self) -> str:
        """Return a one-line account of the difference."""
        where = f"{self.check} {self.label}"
        if not self.golden_status:
            return f"{where}: only here ({self.status}, {self.observed!r})"
        if not self.status:
            return (f"{where}: missing here (golden: {self.golden_status},"
                    f" {self.golden_observed!r})")
        parts = []
        if self.status != self.golden_status:
            parts.append(f"status {self.golden_status} -> {self.status}")
        if self.observed != self.golden_observed:
            parts.append(f"observed {self.golden_observed!r} -> {self.observed!r}")
        return f"{where}: {', '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "check": self.check,
            "subject": self.subject,
            "aspect": self.aspect,
            "golden": {"status": self.golden_status, "observed": self.golden_observed},
            "host": {"status": self.status, "observed": self.observed},
        }


def _state(report: Report) -> dict[tuple[str, str, str], tuple[str, str]]:
    state: dict[tuple[str, str, str], tuple[str, str]] = {}
    for finding in report.findings:
        value = (raw_status(finding).value, finding.observed)
        # Keys are unique within a report; one read back from elsewhere may repeat one:
        # keep the worse, so the comparison is stable.
        key = finding.key
        if key not in state or Status(value[0]).order > Status(state[key][0]).order:
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
                found.append(Difference(key[0], key[1], want[0], want[1], have[0], have[1],
                                        key[2]))
        diffs[report.host] = found
    return diffs


@dataclass(frozen=True)
class Cell:
    """One host's result for one check: its roll-up and the findings behind it."""

    status: str
    findings: tuple[Finding, ...]
    differs: bool = False

    @property
    def skipped(self) -> int:
        """Return how many of the findings are skips (shown beside the roll-up)."""
        return sum(1 for f in self.findings if f.status is Status.SKIP)

    @property
    def waived(self) -> int:
        """Return how many of the findings a waiver accepted (shown beside the roll-up)."""
        return sum(1 for f in self.findings if f.waived)


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
    #: Hosts with at least one skipped finding.
    skipped_hosts: int = 0

    def host_status(self, report: Report) -> str:
        """Return a host's worst status (``error`` when it could not be audited)."""
        return self.statuses[report.host]

    def check_counts(self) -> dict[str, dict[str, int]]:
        """Count, per check, the hosts by their worst status for it."""
        return {
            check: count_by_status(Status(row[check].status)
                                   for row in self.cells.values() if check in row)
            for check in self.checks
        }

    def host_counts(self) -> dict[str, int]:
        """Count the hosts by their worst status."""
        return count_by_status(Status(s) for s in self.statuses.values())

    def skipped(self) -> int:
        """Count the hosts with at least one skipped finding (beside the roll-ups)."""
        return self.skipped_hosts

    def problems(self) -> list[tuple[str, str, str, list[str]]]:
        """Return (status, check, subject, hosts) for every warn/fail/error, worst first.

        Waived findings are not problems; the subject carries the finding's aspect.
        """
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for report in self.hosts:
            for finding in report.findings:
                if finding.counted.rank == 0:
                    continue
                key = (finding.status.value, finding.check, finding.label)
                grouped.setdefault(key, []).append(report.host)
        return [
            (status, check, subject, hosts)
            for (status, check, subject), hosts in sorted(
                grouped.items(),
                key=lambda item: (-Status(item[0][0]).order, -len(item[1]), item[0]),
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
            "fingerprints": dict(self.groups),
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
    counts = count_by_status(f.status for report in reports for f in report.findings
                             if not f.waived)
    counts["waived"] = sum(report.waived for report in reports)
    return counts


def one_per_machine(reports: Sequence[Report]) -> tuple[list[Report], list[str]]:
    """Return one report per machine, and a line for each machine reached under two names.

    A machine is known by its machine id (``facts.machine_id``), never by its hostname:
    fresh nodes all called ``ubuntu`` stay apart, and two names (ssh aliases, an inventory
    name and an address) that reach one machine are one machine, reported once under the
    first name, the others kept in its ``aliases``. A report without a machine id (a host
    that could not be audited, a sysroot without ``/etc/machine-id``) is its own machine.
    """
    kept: list[Report] = []
    first: dict[str, int] = {}
    others: dict[int, list[str]] = {}
    for report in reports:
        key = "" if report.error else report.machine_id
        if key and key in first:
            others.setdefault(first[key], []).append(report.label)
            continue
        if key:
            first[key] = len(kept)
        kept.append(report)
    lines: list[str] = []
    for index, names in others.items():
        report = kept[index]
        aliases = tuple(dict.fromkeys([*report.aliases, *names]))
        kept[index] = replace(report, aliases=aliases)
        lines.append(f"{', '.join([report.label, *aliases])} are one machine (hostname "
                     f"{report.host}, machine id {report.machine_id[:12]}): reported once, "
                     f"as {report.label}")
    return kept, lines


def row_names(reports: Sequence[Report]) -> list[str]:
    """Return a distinct row name per report: the target, the hostname where it differs,
    the other names of its machine (and the connection where all that still repeats)."""
    names = [r.identity + (f" = {', '.join(r.aliases)}" if r.aliases else "") for r in reports]
    counts = Counter(names)
    return [f"{name} [{r.target}]" if counts[name] > 1 else name
            for name, r in zip(names, reports, strict=True)]


def view_of_reports(reports: Sequence[Report], golden: str | None = None) -> FleetView:
    """Lay out reports audited in this run (``audit host``) as ``audit merge`` lays out files."""
    kept, _ = one_per_machine(reports)
    unique = [replace(r, host=name) for r, name in zip(kept, row_names(kept), strict=True)]
    return fleet_view(LoadedResults(reports=unique), golden)


def fleet_view(
    loaded: LoadedResults, golden: str | None = None
) -> FleetView:
    """Lay the reports out as hosts by checks, worst hosts first; diff against ``golden``."""
    with no_cycle_collection():
        return _fleet_view(loaded, golden)


def _fleet_view(loaded: LoadedResults, golden: str | None) -> FleetView:
    cells: dict[str, dict[str, Cell]] = {}
    statuses: dict[str, str] = {}
    skipped_hosts = 0
    for report in loaded.reports:
        row: dict[str, Cell] = {}
        skipped = False
        for result in report.results:
            row[result.check] = Cell(status=result.status.value, findings=result.findings)
            skipped = skipped or any(f.status is Status.SKIP for f in result.findings)
        cells[report.host] = row
        skipped_hosts += skipped
        statuses[report.host] = "error" if report.error else worst(
            Status(c.status) for c in row.values()).value
    # Worst hosts first.
    reports = sorted(loaded.reports, key=lambda r: (-Status(statuses[r.host]).order, r.host))
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
        skipped_hosts=skipped_hosts,
    )


@dataclass(frozen=True)
class TextView:
    """What the text fleet report shows (templates/merge.txt.j2)."""

    hosts: int
    host_counts: dict[str, int]
    skipped_hosts: int
    checks: list[str]
    check_counts: dict[str, dict[str, int]]
    unreachable: list[tuple[str, str]]
    #: (status, check, subject, how many hosts, the first hosts), worst first.
    problems: list[tuple[str, str, str, int, list[str]]]
    #: (fingerprint, how many hosts, the first hosts) of the largest groups, largest first.
    groups: list[tuple[str, int, list[str]]]
    #: How many fingerprint groups the fleet has.
    group_count: int
    golden: str | None
    compared: int
    differ_total: int
    differ: list[tuple[str, int, list[Any]]]
    unreadable: list[Unreadable]
    notes: list[str]
