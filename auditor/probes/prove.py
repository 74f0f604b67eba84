"""``--prove``: the probes before a fix and after it, in one report.

Each probe finding measured both times gets a second finding, aspect ``change``, with
both figures and the delta of the figure that probe is judged by: bandwidth for the copy,
peer and NUMA probes (higher is better), the wake-up overshoot p99 (lower is better). A
figure that got worse beyond the noise of a repeated measurement warns, and says the
fix's rollback undoes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from auditor.model import CheckResult, Finding, Report, Severity, Status
from auditor.probes.judge import measurements

#: The figure each probe is compared by, its unit, and whether higher is better.
PRIMARY: dict[str, tuple[str, str, bool]] = {
    "probe.h2d": ("gbps", "GB/s", True),
    "probe.d2h": ("gbps", "GB/s", True),
    "probe.p2p": ("on_gbps", "GB/s", True),
    "probe.numa": ("local_gbps", "GB/s", True),
    "probe.wakeup": ("p99_us", "us", False),
}
#: A bandwidth this much lower is worse, not noise (repeated copies on one GPU vary by
#: under 3%: 53.6-55.3 GB/s on the H200).
BANDWIDTH_NOISE = 0.05
#: A wake-up p99 must grow by this share and this many microseconds to be worse.
WAKEUP_NOISE = (0.20, 2.0)
ASPECT = "change"


def _worse(check: str, before: float, after: float) -> bool:
    _, _, higher_better = PRIMARY[check]
    if higher_better:
        return after < before * (1 - BANDWIDTH_NOISE)
    share, floor = WAKEUP_NOISE
    return after > before * (1 + share) and after - before > floor


def change_findings(before: Report, after: Report) -> list[Finding]:
    """Return a ``change`` finding for each probe finding measured before and after."""
    earlier = {f.key: f for f in before.findings}
    found: list[Finding] = []
    for finding in after.findings:
        if finding.check not in PRIMARY or finding.aspect:
            continue
        metric, unit, _ = PRIMARY[finding.check]
        now = measurements(finding).get(metric)
        then_finding = earlier.get(finding.key)
        then = measurements(then_finding).get(metric) if then_finding is not None else None
        if now is None or then is None:
            continue
        delta = now - then
        relative = delta / then if then else 0.0
        observed = f"{then:.1f} -> {now:.1f} {unit} ({relative:+.0%})"
        evidence = (("measured.before", f"{then:.10g}"), ("measured.after", f"{now:.10g}"),
                    ("measured.delta", f"{delta:.10g}"), ("metric", metric))
        if _worse(finding.check, then, now):
            status, message = Status.WARN, (
                f"worse after the fix: {observed}; the fix's rollback undoes it")
        else:
            status, message = Status.PASS, f"before and after the fix: {observed}"
        found.append(Finding(check=finding.check, status=status, severity=Severity.HIGH,
                             subject=finding.subject, message=message, observed=observed,
                             expected="no worse than before the fix", host=finding.host,
                             evidence=evidence, aspect=ASPECT))
    return found


def proven(report: Report, before: Report, after: Report) -> Report:
    """Return ``report`` (the audit after the fix) with the probes after the fix and their
    change since before, as results of the probe checks."""
    changes = change_findings(before, after)
    results: list[CheckResult] = []
    for result in after.results:
        own = tuple(f for f in changes if f.check == result.check)
        results.append(CheckResult(result.check, result.duration_s,
                                   tuple(_on(f, report.host) for f in result.findings + own)))
    return dataclasses.replace(report, results=report.results + tuple(results))


def _on(finding: Finding, host: str) -> Finding:
    return dataclasses.replace(finding, host=host)


def summary_lines(changes: Sequence[Finding]) -> list[str]:
    """Return one line per probe and subject: before, after, delta."""
    return [f"{f.check} {f.subject}: {f.observed}" + (" WORSE" if f.status is Status.WARN
                                                      else "") for f in changes]


def worst_figures(report: Report) -> list[tuple[str, str]]:
    """Return, per probe, the worst figure of its subjects (the slowest GPU, the slowest
    node's wake-up p99) as ``(probe.metric, value)``: one label each in the NFD format, so
    a scheduler can tell hosts apart by what they measured."""
    worst: dict[str, float] = {}
    for finding in report.findings:
        if finding.check not in PRIMARY or finding.aspect:
            continue
        metric, _, higher_better = PRIMARY[finding.check]
        value = measurements(finding).get(metric)
        if value is None:
            continue
        name = f"{finding.check}.{metric}"
        if name not in worst:
            worst[name] = value
        else:
            worst[name] = min(worst[name], value) if higher_better else max(worst[name], value)
    return [(name, f"{value:.1f}") for name, value in worst.items()]
