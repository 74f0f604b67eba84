"""``--prove``: probes before and after a fix, both figures and the change in one report."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from auditor.cli.fix import FixRequest, fix
from auditor.hosts import open_sysroot
from auditor.model import Report, Status
from auditor.policy import load_policy
from auditor.probes import judge
from auditor.probes.prove import change_findings
from auditor.probes.run import ProbeRequest, run_probes
from auditor.registry import load_checks, select
from auditor.runner import audit
from auditor.shipped import probe_agent as agent
from tests.support.fixkit import needs_root, run
from tests.support.plant import plant_numa
from tests.support.sysroot import Sysroot

LINK = {"max_speed": "32.0 GT/s PCIe", "max_width": "16"}


class Scripted:
    """A runner that answers what a host measured, one answer per run."""

    def __init__(self, answers: Sequence[dict[str, Any]]) -> None:
        self.answers: Iterator[dict[str, Any]] = iter(answers)

    def run(self, args: Sequence[str], timeout: float) -> dict[str, Any]:
        return {"protocol": agent.PROTOCOL, "host": "gpu-01",
                "answer": {"status": "ok", "data": next(self.answers)}}


def copies(gbps: float) -> dict[str, Any]:
    return {"driver": "cuda", "driver_version": 13000, "gpus": [{
        "gpu": {"index": 0, "name": "NVIDIA H200", "bdf": "0000:41:00.0"}, "link": LINK,
        "h2d": {"gbps": gbps}}]}


def wakeup(p99: float) -> dict[str, Any]:
    return {"hypervisor": False, "timer_slack_1ns": True, "groups": [
        {"node": 0, "cpu": 1, "as_is": {"p50_us": 5.0, "p99_us": p99, "max_us": 400.0}}]}


def probes(runner: Scripted, names: tuple[str, ...] = ("h2d", "wakeup")) -> Report:
    return run_probes(runner, ProbeRequest(probes=names), target="gpu-01")


def test_better_figures_pass_and_worse_ones_warn() -> None:
    runner = Scripted([copies(31.0), wakeup(300.0), copies(55.0), wakeup(5.0)])
    before, after = probes(runner), probes(runner)
    h2d, wake = change_findings(before, after)
    assert (h2d.check, h2d.aspect, h2d.status) == ("probe.h2d", "change", Status.PASS)
    assert h2d.observed == "31.0 -> 55.0 GB/s (+77%)"
    assert judge.measurements(h2d) == pytest.approx({"before": 31.0, "after": 55.0,
                                                     "delta": 24.0})
    assert wake.observed == "300.0 -> 5.0 us (-98%)" and wake.status is Status.PASS
    runner = Scripted([copies(55.0), wakeup(5.0), copies(50.0), wakeup(9.0)])
    h2d, wake = change_findings(probes(runner), probes(runner))
    assert h2d.status is Status.WARN and "worse after the fix" in h2d.message
    assert wake.status is Status.WARN


def test_noise_is_not_worse() -> None:
    # Within 5% for a bandwidth; for the wake-up p99, less than 20% or 2 us more.
    runner = Scripted([copies(55.0), wakeup(5.0), copies(53.0), wakeup(6.5)])
    assert all(f.status is Status.PASS for f in change_findings(probes(runner), probes(runner)))


def test_a_probe_skipped_on_either_side_has_no_change() -> None:
    runner = Scripted([copies(55.0)])
    before = probes(runner, ("h2d",))
    after = run_probes(type("Skips", (), {"run": lambda self, args, timeout: {
        "answer": {"status": "skip", "reason": "no GPU driver"}}})(),
        ProbeRequest(probes=("h2d",)), target="gpu-01")
    assert change_findings(before, after) == []


@needs_root
@pytest.mark.parametrize(("figures", "worse"), [((31.0, 55.0), False), ((55.0, 40.0), True)])
def test_a_real_fix_with_proof_reports_both_figures(
        h200: Sysroot, capsys: pytest.CaptureFixture[str], figures: tuple[float, float],
        worse: bool) -> None:
    plant_numa(h200)
    every = load_checks()
    checks = select(every, ("numa.balancing",), ())
    policy = load_policy(every, None, None)
    runner = Scripted([copies(figures[0]), copies(figures[1])])

    def measure() -> Report:
        return probes(runner, ("h2d",))

    with open_sysroot(str(h200.root)) as host:
        report = audit(host, checks, policy)

        def reaudit() -> Report:
            with open_sysroot(str(h200.root)) as fresh:
                return audit(fresh, checks, policy)

        shown, code = fix(host, report, checks, policy, FixRequest(apply=True, yes=True),
                          reaudit=reaudit, where=str(h200.root), prove=measure)
    err = capsys.readouterr().err
    assert code == 0, err
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"
    by_key = {f.key: f for f in shown.findings}
    measured = by_key[("probe.h2d", "0000:41:00.0", "")]
    change = by_key[("probe.h2d", "0000:41:00.0", "change")]
    assert judge.measurements(measured)["gbps"] == figures[1]
    assert judge.measurements(change) == pytest.approx(
        {"before": figures[0], "after": figures[1], "delta": figures[1] - figures[0]})
    assert [f.status for f in shown.findings if f.check == "numa.balancing"] == [Status.PASS]
    assert (change.status is Status.WARN) is worse
    assert ("made 1 measured figure(s) worse: roll it back" in err) is worse
    assert f"probe.h2d 0000:41:00.0: {change.observed}" in err
    [kept] = re.findall(r"undo with: bash (\S+)", err)
    assert run(Path(kept)).returncode == 0
    assert h200.read("/proc/sys/kernel/numa_balancing") == "1\n"
