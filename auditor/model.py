"""The finding model: statuses, severities, findings and reports as frozen values."""

from __future__ import annotations

import datetime as dt
import enum
import operator
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """The verdict of one finding, declared from best to worst (``order``).

    A roll-up (a check, a host, a fleet cell) is not the largest ``order``: it is
    :func:`worst`, where a skip never outranks a judged status.
    """

    PASS = "pass"  # noqa: S105 - a status, not a secret
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"

    @property
    def order(self) -> int:
        """Return the place from best (0, pass) to worst (4, error): sorting and the
        Prometheus status codes."""
        return _ORDER[self]

    @property
    def rank(self) -> int:
        """Return how bad the status is for ``--fail-on``: 0 pass and skip, 1 warn, 2 fail
        and error."""
        return _RANK[self]


_ORDER = {status: index for index, status in enumerate(Status)}
_RANK = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}
#: Statuses whose findings get a remedy.
FIXABLE = (Status.FAIL, Status.WARN)
#: Statuses of findings that are a problem (shown, counted as such).
PROBLEMS = (Status.WARN, Status.FAIL, Status.ERROR)


def worst(statuses: Iterable[Status]) -> Status:
    """Return the roll-up of statuses: the worst of pass, warn, fail and error.

    A skip says nothing about the host, so it never outranks a judged status: the
    roll-up is ``skip`` only when every status is a skip, and ``pass`` when there are
    none. Roll-ups count the skips beside it (:func:`count_by_status`).
    """
    seen = set(statuses)
    judged = seen - {Status.SKIP}
    if judged:
        return max(judged, key=_ORDER.__getitem__)
    return Status.SKIP if seen else Status.PASS


def count_by_status(statuses: Iterable[Status]) -> dict[str, int]:
    """Count statuses, every status present (zero where none)."""
    counts = {s.value: 0 for s in Status}
    for status in statuses:
        counts[status.value] += 1
    return counts


class Severity(str, enum.Enum):
    """How much a problem found by a check costs an inference workload."""

    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class FailOn(str, enum.Enum):
    """The lowest status that makes ``audit`` exit 1 (``warning`` is kept as ``warn``)."""

    WARN = "warn"
    #: The name the level had before ``warn``: the same member, kept for callers.
    WARNING = "warn"
    FAIL = "fail"

    @classmethod
    def _missing_(cls, value: object) -> FailOn | None:
        return cls.WARN if value == "warning" else None

    def trips(self, status: Status) -> bool:
        """Return whether a finding of this status is at or above the level."""
        threshold = 1 if self is FailOn.WARN else 2
        return status.rank >= threshold


@dataclass(frozen=True)
class Finding:
    """One verdict of one check about one subject on one host."""

    check: str
    status: Status
    severity: Severity
    subject: str
    message: str
    observed: str = ""
    expected: str = ""
    fix: str = ""
    host: str = ""
    evidence: tuple[tuple[str, str], ...] = ()
    #: What about the subject this finding judges, where a check judges several things
    #: of one subject (a device's MaxReadReq and its link): (check, subject, aspect) is
    #: the finding's key.
    aspect: str = ""
    #: Accepted by a live waiver of the policy: the status stays the real one, and the
    #: finding no longer counts as a problem (roll-ups, exit code).
    waived: bool = False
    #: The waiver's reason (and its expiry), when waived.
    waiver: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Return what identifies the finding within a host's report: check, subject, aspect."""
        return (self.check, self.subject, self.aspect)

    @property
    def label(self) -> str:
        """Return the subject with its aspect, as the text views show it."""
        return f"{self.subject} [{self.aspect}]" if self.aspect else self.subject

    @property
    def counted(self) -> Status:
        """Return the status roll-ups and the exit code count: a waived finding passes."""
        return Status.PASS if self.waived else self.status

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of the finding (the stable contract)."""
        data: dict[str, Any] = {
            "check": self.check,
            "host": self.host,
            "status": self.status.value,
            "severity": self.severity.value,
            "subject": self.subject,
            "aspect": self.aspect,
            "observed": self.observed,
            "expected": self.expected,
            "message": self.message,
            "fix": self.fix,
            "evidence": dict(self.evidence),
            "waived": self.waived,
        }
        if self.waived:
            data["waiver"] = self.waiver
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Build a finding from its JSON form; raise ValueError/KeyError/TypeError if it is not one.

        A merge reads hundreds of thousands of findings: the common case (every field a
        string, evidence a table of strings) skips the per-field conversions and the
        frozen dataclass's ``__init__``.
        """
        if type(data) is dict:
            fast = _fast_finding(data)
            if fast is not None:
                return fast
        evidence = data.get("evidence") or {}
        return cls(
            check=str(data["check"]),
            host=str(data.get("host", "")),
            status=Status(data["status"]),
            severity=Severity(data.get("severity", "info")),
            subject=str(data.get("subject", "")),
            observed=str(data.get("observed", "")),
            expected=str(data.get("expected", "")),
            message=str(data.get("message", "")),
            fix=str(data.get("fix", "")),
            evidence=tuple((str(k), str(v)) for k, v in dict(evidence).items()),
            aspect=str(data.get("aspect") or ""),
            waived=data.get("waived") is True,
            waiver=str(data.get("waiver") or ""),
        )


_STATUSES = {s.value: s for s in Status}
_SEVERITIES = {s.value: s for s in Severity}
_TEXT_FIELDS = ("check", "host", "subject", "observed", "expected", "message", "fix")
_STR = frozenset({str})
_text_fields = operator.itemgetter(*_TEXT_FIELDS)


def _fast_finding(data: dict[str, Any]) -> Finding | None:
    """Build a finding from what ``audit`` writes, or None for anything else."""
    evidence = data.get("evidence") or {}
    status_text, severity_text = data.get("status"), data.get("severity", "info")
    status = _STATUSES.get(status_text) if type(status_text) is str else None
    severity = _SEVERITIES.get(severity_text) if type(severity_text) is str else None
    try:
        values = _text_fields(data)
    except KeyError:  # not written by audit: some field left out
        values = [data.get(key, "") for key in _TEXT_FIELDS]
    aspect, waived, waiver = data.get("aspect", ""), data.get("waived", False), data.get(
        "waiver", "")
    if (
        status is not None and severity is not None and type(evidence) is dict
        and "check" in data and set(map(type, values)) <= _STR
        and set(map(type, evidence)) <= _STR and set(map(type, evidence.values())) <= _STR
        and type(aspect) is str and type(waived) is bool and type(waiver) is str
    ):
        finding = object.__new__(Finding)
        fields = dict(zip(_TEXT_FIELDS, values, strict=True))
        fields.update(status=status, severity=severity, evidence=tuple(evidence.items()),
                      aspect=aspect, waived=waived, waiver=waiver)
        finding.__dict__.update(fields)
        return finding
    return None


@dataclass(frozen=True)
class CheckResult:
    """The findings of one check agent on one host, with its run time."""

    check: str
    duration_s: float
    findings: tuple[Finding, ...]

    @property
    def status(self) -> Status:
        """Return the roll-up of the findings (:func:`worst`; a waived finding passes)."""
        return worst(f.counted for f in self.findings)

    @property
    def skipped(self) -> int:
        """Return how many findings are skips (counted beside the roll-up)."""
        return sum(1 for f in self.findings if f.status is Status.SKIP)


@dataclass(frozen=True)
class Report:
    """The audit of one host: every check's result, in check order."""

    host: str
    target: str
    started: str
    duration_s: float
    results: tuple[CheckResult, ...]
    facts: tuple[tuple[str, str], ...] = field(default=())
    error: str = ""
    #: Seconds per phase of a remote audit: ``connect``, ``collect``, ``checks``.
    timing: tuple[tuple[str, float], ...] = ()
    #: The version of host-auditor that made the report.
    version: str = ""
    #: Which thresholds made it: ``profile``, and the policy ``file`` and its ``sha256``.
    policy: tuple[tuple[str, str], ...] = ()
    #: The target as the operator named it (an inventory name, ssh config alias or address
    #: as written); empty for ``audit local``, where the machine names itself.
    name: str = ""
    #: The other names the same machine was reached under in the same run (one machine is
    #: reported once: :func:`auditor.fleet.one_per_machine`).
    aliases: tuple[str, ...] = ()

    @property
    def machine_id(self) -> str:
        """Return the machine's app-specific id (``facts.machine_id``), or "" if unknown."""
        for key, value in self.facts:
            if key == "machine_id":
                return value
        return ""

    @property
    def label(self) -> str:
        """Return the name a fleet view lists the host by: the operator's, else its own."""
        return self.name or self.host

    @property
    def identity(self) -> str:
        """Return the target and, where it differs, the hostname it reported: ``gpu-07
        (ubuntu)``."""
        if self.name and self.name != self.host:
            return f"{self.name} ({self.host})"
        return self.label

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    def summary(self) -> dict[str, int]:
        """Count the findings by status, the waived ones apart (``waived``)."""
        findings = self.findings
        counts = count_by_status(f.status for f in findings if not f.waived)
        counts["waived"] = sum(1 for f in findings if f.waived)
        return counts

    @property
    def status(self) -> Status:
        """Return the host's roll-up: ``error`` if it could not be audited, else :func:`worst`."""
        if self.error:
            return Status.ERROR
        return worst(r.status for r in self.results)

    @property
    def skipped(self) -> int:
        """Return how many findings are skips (counted beside the roll-up)."""
        return sum(r.skipped for r in self.results)

    @property
    def waived(self) -> int:
        """Return how many findings a waiver accepted."""
        return sum(1 for f in self.findings if f.waived)

    def exit_code(self, fail_on: FailOn) -> int:
        """Return 3 if the host could not be audited, 1 if a finding trips fail_on, else 0."""
        if self.error:
            return 3
        return 1 if any(fail_on.trips(f.counted) for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of the report (the stable contract)."""
        data: dict[str, Any] = {
            "host": self.host,
            "target": self.target,
            **({"name": self.name} if self.name else {}),
            **({"aliases": list(self.aliases)} if self.aliases else {}),
            "started": self.started,
            "duration_s": round(self.duration_s, 4),
            "summary": self.summary(),
            "facts": dict(self.facts),
            "checks": [
                {"check": r.check, "status": r.status.value, "duration_s": round(r.duration_s, 4)}
                for r in self.results
            ],
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.timing:
            data["timing"] = {f"{name}_s": round(value, 4) for name, value in self.timing}
        if self.version:
            data["tool"] = {"name": "host-auditor", "version": self.version}
        if self.policy:
            data["policy"] = dict(self.policy)
        if self.error:
            data["error"] = self.error
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Report:
        """Build a report from its JSON form; raise ValueError (one line) if it is not one."""
        if not isinstance(data, Mapping) or not isinstance(data.get("host"), str):
            raise ValueError("not an audit report (no host name)")
        findings_data = data.get("findings", [])
        checks_data = data.get("checks", [])
        if not isinstance(findings_data, list) or not isinstance(checks_data, list):
            raise ValueError("not an audit report (findings or checks is not a list)")
        try:
            findings = [Finding.from_dict(f) for f in findings_data]
            durations = {str(c["check"]): float(c.get("duration_s", 0.0)) for c in checks_data}
            grouped: dict[str, list[Finding]] = {check: [] for check in durations}
            for finding in findings:
                grouped.setdefault(finding.check, []).append(finding)
            return cls(
                host=data["host"],
                target=str(data.get("target", data["host"])),
                started=str(data.get("started", "")),
                duration_s=float(data.get("duration_s", 0.0)),
                results=tuple(
                    CheckResult(check, durations.get(check, 0.0), tuple(items))
                    for check, items in grouped.items()
                ),
                facts=tuple((str(k), str(v)) for k, v in dict(data.get("facts") or {}).items()),
                error=str(data.get("error", "")),
                timing=tuple((str(k).removesuffix("_s"), float(v))
                             for k, v in dict(data.get("timing") or {}).items()),
                version=str(dict(data.get("tool") or {}).get("version", "")),
                policy=tuple((str(k), str(v)) for k, v in dict(data.get("policy") or {}).items()),
                name=str(data.get("name") or ""),
                aliases=tuple(str(a) for a in data.get("aliases") or () if isinstance(a, str)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not an audit report ({type(exc).__name__}: {exc})") from exc


# -- two reports of one host ------------------------------------------------------------------


def _started_at(text: str) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _badness(report: Report) -> tuple[int, int, int, int]:
    counts = Counter(f.counted for f in report.findings)
    return (report.status.order, counts[Status.ERROR], counts[Status.FAIL], counts[Status.WARN])


def _describe(report: Report) -> str:
    if report.error:
        return "could not be audited"
    counts = Counter(f.counted.value for f in report.findings)
    problems = ", ".join(f"{counts[s.value]} {s.value}" for s in PROBLEMS[::-1]
                         if counts[s.value])
    return f"{report.status.value}" + (f": {problems}" if problems else "")


def pick_report(kept: Report, other: Report) -> tuple[Report, str]:
    """Return which of two reports of one host to keep, and why (a few words).

    The later start wins (times to the microsecond; reports of older versions have
    whole seconds). Where the starts tie, the worse result wins, so a tie never hides a
    problem; where the results are as bad, a digest of the content decides, so the
    choice never depends on file names or the order the files were read in.
    """
    ours, theirs = _started_at(kept.started), _started_at(other.started)
    if ours is not None and theirs is not None and ours != theirs:
        return (other, "newer") if theirs > ours else (kept, "newer")
    if ours is None and theirs is not None:
        return other, "the other has no readable start time"
    if theirs is None and ours is not None:
        return kept, "the other has no readable start time"
    bad_kept, bad_other = _badness(kept), _badness(other)
    if bad_kept != bad_other:
        worse, better = (other, kept) if bad_other > bad_kept else (kept, other)
        return worse, (f"both started at {kept.started or 'an unknown time'}: keeping the worse "
                       f"result ({_describe(worse)}, against {_describe(better)})")
    import hashlib
    import json

    digests = [hashlib.sha256(json.dumps(r.to_dict(), sort_keys=True).encode()).hexdigest()
               for r in (kept, other)]
    if digests[0] == digests[1]:
        return kept, "the same report"
    chosen = kept if digests[0] > digests[1] else other
    return chosen, ("both started at the same time with results as bad "
                    f"({_describe(chosen)}): keeping the one whose content digest sorts last")


# -- the tuned state's fingerprint ------------------------------------------------------

#: Bump when the fingerprint's inputs change, so old and new stamps never collide.
#: 2: each finding is keyed by (check, subject, aspect).
FINGERPRINT_VERSION = 2
FINGERPRINT_LENGTH = 12


def raw_status(finding: Finding) -> Status:
    """Return the status the host really has: a waiver is policy, not tuning.

    A finding keeps its real status when waived; reports written before that turned a
    waived finding into ``pass`` and kept the real status in its evidence (``waived``).
    """
    if finding.status is not Status.PASS or not finding.evidence:
        return finding.status
    waived = dict(finding.evidence).get("waived")
    try:
        return Status(waived) if waived else finding.status
    except ValueError:
        return finding.status


def fingerprint_inputs(report: Report) -> dict[str, Any]:
    """Return what defines a host's tuned state: each finding's key, real status and observed
    value, and the check ids."""
    findings = sorted(
        {(f.check, f.subject, f.aspect, raw_status(f).value, f.observed)
         for f in report.findings}
    )
    return {
        "version": FINGERPRINT_VERSION,
        "checks": sorted({r.check for r in report.results}),
        "findings": [list(item) for item in findings],
    }


def fingerprint(report: Report) -> str:
    """Return a short, stable hex digest of the host's tuned state (no times, no host name)."""
    import hashlib
    import json

    canonical = json.dumps(fingerprint_inputs(report), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_LENGTH]
