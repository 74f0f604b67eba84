"""The check base class: metadata declared on the class, a pure ``evaluate``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status


class Check(ABC):
    """One check agent: reads a host through the seam and yields findings.

    The first line of a subclass's docstring is its one-line summary.
    """

    #: Dotted lower-case id, ``area.name``.
    id: ClassVar[str]
    #: How much a problem this check finds costs an inference workload.
    severity: ClassVar[Severity]
    #: Shell patterns of every path the check may read (the SSH collector and
    #: ``audit snapshot`` fetch exactly these).
    reads: ClassVar[tuple[str, ...]]
    #: Why it matters for inference (``audit explain``).
    rationale: ClassVar[str]
    #: How it is fixed (``audit explain``).
    remedy: ClassVar[str]
    #: Tunable thresholds with their default values; a policy file overrides them.
    defaults: ClassVar[Mapping[str, Any]] = {}
    tags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options: dict[str, Any] = {**self.defaults, **(options or {})}

    @classmethod
    def summary(cls) -> str:
        """Return the first line of the check's docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @abstractmethod
    def evaluate(self, host: Host) -> Iterable[Finding]:
        """Yield the findings for ``host``; at least one, a skip when nothing can be judged."""

    # -- finding factories: the runner stamps the host ----------------------------------

    def finding(
        self,
        status: Status,
        subject: str,
        message: str,
        *,
        observed: str = "",
        expected: str = "",
        fix: str = "",
        severity: Severity | None = None,
        evidence: Mapping[str, str] | None = None,
    ) -> Finding:
        """Build a finding of this check."""
        return Finding(
            check=self.id,
            status=status,
            severity=severity or self.severity,
            subject=subject,
            message=message,
            observed=observed,
            expected=expected,
            fix=fix,
            evidence=tuple((evidence or {}).items()),
        )

    def passed(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``pass`` finding."""
        return self.finding(Status.PASS, subject, message, **kw)

    def failed(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``fail`` finding."""
        return self.finding(Status.FAIL, subject, message, **kw)

    def warned(self, subject: str, message: str, **kw: Any) -> Finding:
        """Build a ``warn`` finding."""
        return self.finding(Status.WARN, subject, message, **kw)

    def skipped(self, subject: str, reason: str, **kw: Any) -> Finding:
        """Build a ``skip`` finding: the check cannot judge, and says why."""
        return self.finding(Status.SKIP, subject, reason, **kw)
