"""The agent runner: parallel checks, stamping, contained failures."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import ClassVar

import pytest

from auditor.check import Check, CheckOptions
from auditor.checks.numa_balancing import NumaBalancing
from auditor.hosts import DirectoryHost, LocalHost
from auditor.hosts.base import Host
from auditor.model import FailOn, Finding, Severity, Status
from auditor.policy import Policy
from auditor.runner import audit
from tests.support.sysroot import Sysroot


class Exploding(Check[CheckOptions]):
    """Raise while reading."""

    id: ClassVar[str] = "test.exploding"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/proc/devices",)
    rationale: ClassVar[str] = ""
    remedy: ClassVar[str] = ""

    def evaluate(self, host: Host) -> Iterable[Finding]:
        int(host.read_text("/proc/devices"))
        return []


class Silent(Check[CheckOptions]):
    """Yield nothing."""

    id: ClassVar[str] = "test.silent"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/proc/devices",)
    rationale: ClassVar[str] = ""
    remedy: ClassVar[str] = ""

    def evaluate(self, host: Host) -> Iterable[Finding]:
        return []


class Barrier(Check[CheckOptions]):
    """Wait until a second check runs at the same time."""

    id: ClassVar[str] = "test.barrier"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/proc/devices",)
    rationale: ClassVar[str] = ""
    remedy: ClassVar[str] = ""
    barrier = threading.Barrier(2, timeout=5)

    def evaluate(self, host: Host) -> Iterable[Finding]:
        self.barrier.wait()
        yield self.passed("host", "ran in parallel")


class Barrier2(Barrier):
    """Wait until the first barrier check runs at the same time."""

    id: ClassVar[str] = "test.barrier2"


def test_broken_check_is_one_error_and_the_rest_finish(h200: Sysroot) -> None:
    host = DirectoryHost(str(h200.root))
    report = audit(host, [Exploding, NumaBalancing, Silent], Policy())
    by_check = {r.check: r for r in report.results}
    [error] = by_check["test.exploding"].findings
    assert error.status is Status.ERROR
    assert "ValueError" in error.message
    assert by_check["numa.balancing"].status is Status.PASS
    assert by_check["test.silent"].findings[0].status is Status.ERROR
    assert [r.check for r in report.results] == ["test.exploding", "numa.balancing", "test.silent"]
    assert all(f.host == "gpu-h200-vm" for f in report.findings)
    assert report.exit_code(FailOn.FAIL) == 1


def test_debug_reraises(h200: Sysroot) -> None:
    with pytest.raises(ValueError):
        audit(DirectoryHost(str(h200.root)), [Exploding], Policy(), debug=True)


def test_checks_run_in_parallel_on_the_live_host() -> None:
    report = audit(LocalHost(), [Barrier, Barrier2], Policy())
    assert [f.status for f in report.findings] == [Status.PASS, Status.PASS]


def test_checks_run_in_parallel_on_a_sysroot_when_asked(h200: Sysroot) -> None:
    report = audit(DirectoryHost(str(h200.root)), [Barrier, Barrier2], Policy(), workers=2)
    assert [f.status for f in report.findings] == [Status.PASS, Status.PASS]
