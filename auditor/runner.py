"""The agent runner: every check on a pool, each timed, each failure contained."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from auditor.check import Check
from auditor.hosts.base import Host
from auditor.model import CheckResult, Finding, Report, Status
from auditor.policy import Policy


def _error(check: type[Check], message: str) -> Finding:
    return Finding(
        check=check.id,
        status=Status.ERROR,
        severity=check.severity,
        subject="check",
        message=message,
    )


def run_check(host: Host, check: type[Check], policy: Policy, debug: bool = False) -> CheckResult:
    """Run one check agent against a host; an exception becomes one ``error`` finding."""
    started = time.perf_counter()
    try:
        findings = list(check(policy.options_for(check)).evaluate(host))
        if not findings:
            findings = [_error(check, "the check returned no findings")]
    except Exception as exc:
        if debug:
            raise
        findings = [_error(check, f"check raised {type(exc).__name__}: {exc}")]
    today = dt.date.today()
    stamped = tuple(
        policy.apply_waivers(replace(f, host=host.name, check=check.id), today) for f in findings
    )
    return CheckResult(check=check.id, duration_s=time.perf_counter() - started, findings=stamped)


def host_facts(host: Host) -> tuple[tuple[str, str], ...]:
    """Return a few facts that identify the host in a report."""
    facts: list[tuple[str, str]] = []
    kernel = host.read_optional("/proc/sys/kernel/osrelease")
    if kernel:
        facts.append(("kernel", kernel))
    os_release = host.read_optional("/etc/os-release") or ""
    for line in os_release.splitlines():
        if line.startswith("PRETTY_NAME="):
            facts.append(("os", line.partition("=")[2].strip().strip('"')))
    machine_id = host.read_optional("/etc/machine-id")
    if machine_id:
        facts.append(("machine_id", machine_id))
    return tuple(facts)


def audit(
    host: Host,
    checks: Sequence[type[Check]],
    policy: Policy,
    *,
    debug: bool = False,
    workers: int | None = None,
) -> Report:
    """Run every check against ``host`` in parallel and collect the report."""
    started_at = dt.datetime.now(dt.timezone.utc)
    started = time.perf_counter()
    pool_size = max(1, min(len(checks), workers or 8))
    with ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="check") as pool:
        futures = [pool.submit(run_check, host, check, policy, debug) for check in checks]
        facts = host_facts(host)
        results = tuple(future.result() for future in futures)
    return Report(
        host=host.name,
        target=host.target,
        started=started_at.isoformat(timespec="seconds"),
        duration_s=time.perf_counter() - started,
        results=results,
        facts=facts,
    )
