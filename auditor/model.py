"""The finding model: statuses, severities, findings and reports as frozen values."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """The verdict of one finding, ordered from best to worst by ``rank``."""

    PASS = "pass"  # noqa: S105 - a status, not a secret
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _STATUS_RANK[self]


_STATUS_RANK = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}


class Severity(str, enum.Enum):
    """How much a problem found by a check costs an inference workload."""

    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class FailOn(str, enum.Enum):
    """The lowest status that makes ``audit`` exit 1."""

    WARNING = "warning"
    FAIL = "fail"

    def trips(self, status: Status) -> bool:
        """Return whether a finding of this status is at or above the level."""
        threshold = 1 if self is FailOn.WARNING else 2
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

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of the finding (the stable contract)."""
        return {
            "check": self.check,
            "host": self.host,
            "status": self.status.value,
            "severity": self.severity.value,
            "subject": self.subject,
            "observed": self.observed,
            "expected": self.expected,
            "message": self.message,
            "fix": self.fix,
            "evidence": {key: value for key, value in self.evidence},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Build a finding from its JSON form."""
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
        )


@dataclass(frozen=True)
class CheckResult:
    """The findings of one check agent on one host, with its run time."""

    check: str
    duration_s: float
    findings: tuple[Finding, ...]

    @property
    def status(self) -> Status:
        """Return the worst status among the findings."""
        return worst(f.status for f in self.findings)


def worst(statuses: Iterable[Status]) -> Status:
    """Return the worst of the statuses (PASS when there are none)."""
    result = Status.PASS
    order = [Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR]
    for status in statuses:
        if order.index(status) > order.index(result):
            result = status
    return result


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

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    def summary(self) -> dict[str, int]:
        """Count the findings by status."""
        counts = {s.value: 0 for s in Status}
        for finding in self.findings:
            counts[finding.status.value] += 1
        return counts

    @property
    def status(self) -> Status:
        if self.error:
            return Status.ERROR
        return worst(r.status for r in self.results)

    def exit_code(self, fail_on: FailOn) -> int:
        """Return 3 if the host could not be audited, 1 if a finding trips fail_on, else 0."""
        if self.error:
            return 3
        return 1 if any(fail_on.trips(f.status) for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of the report (the stable contract)."""
        data: dict[str, Any] = {
            "host": self.host,
            "target": self.target,
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
        if self.error:
            data["error"] = self.error
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Build a report from its JSON form."""
        findings = [Finding.from_dict(f) for f in data.get("findings", [])]
        durations = {c["check"]: float(c.get("duration_s", 0.0)) for c in data.get("checks", [])}
        order = list(durations) + [f.check for f in findings if f.check not in durations]
        results = tuple(
            CheckResult(
                check=check,
                duration_s=durations.get(check, 0.0),
                findings=tuple(f for f in findings if f.check == check),
            )
            for check in dict.fromkeys(order)
        )
        return cls(
            host=str(data["host"]),
            target=str(data.get("target", data["host"])),
            started=str(data.get("started", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            results=results,
            facts=tuple((str(k), str(v)) for k, v in dict(data.get("facts") or {}).items()),
            error=str(data.get("error", "")),
        )
