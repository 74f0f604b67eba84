"""Every registered check against the same contract: its cases, its reads, its fix.

Parametrized over the registry, so a new check is held to the contract without a line
here, and a check removed from the registry leaves its cases module behind, which fails
``test_every_cases_module_names_a_registered_check``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from auditor.fix import build_fix
from auditor.hosts.archive import ArchiveHost
from auditor.model import Status
from auditor.registry import load_checks
from auditor.render import render_fix
from tests.support.cases import Case, all_cases, audit_tree, check_case, check_fix
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import CAPTURES, extract_capture

CHECKS = {c.id: c for c in load_checks()}
CASES = all_cases()
PROBLEMS = (Status.WARN, Status.FAIL)


def _params(fixed: bool | None = None) -> list[object]:
    found: list[object] = []
    for check_id, cases in CASES.items():
        for case in cases.cases:
            if fixed is not None and case.fixed is not fixed:
                continue
            found.append(pytest.param(check_id, case, id=f"{check_id}: {case.name}"))
    return found


def test_every_registered_check_has_cases() -> None:
    missing = sorted(set(CHECKS) - set(CASES))
    assert not missing, f"checks without a cases module in tests/checks/cases: {missing}"
    for check_id, cls in CHECKS.items():
        statuses = {case.expect for case in CASES[check_id].cases}
        assert Status.PASS in statuses, f"{check_id}: no passing case"
        assert statuses & set(PROBLEMS), f"{check_id}: no case with a problem"
        if cls.fixable():
            assert any(c.expect in PROBLEMS for c in CASES[check_id].cases), check_id


def test_every_cases_module_names_a_registered_check() -> None:
    assert sorted(set(CASES) - set(CHECKS)) == []


@pytest.mark.parametrize(("check_id", "case"), _params())
def test_verdict_and_declared_reads(check_id: str, case: Case, tmp_path: Path) -> None:
    check_case(CHECKS[check_id], case, tmp_path)


@pytest.mark.parametrize("capture", sorted(CAPTURES))
@pytest.mark.parametrize("check_id", sorted(CHECKS))
def test_reads_on_the_real_captures_are_declared(check_id: str, capture: str,
                                                 tmp_path: Path) -> None:
    check = CHECKS[check_id]
    root = extract_capture(CAPTURES[capture], tmp_path / capture)
    recording = RecordingHost(str(root))
    findings = list(check().evaluate(recording))
    assert findings, "a check yields at least one finding"
    assert undeclared(recording.asked, check.reads) == []


@pytest.mark.parametrize("capture", sorted(CAPTURES))
@pytest.mark.parametrize("check_id", sorted(CHECKS))
def test_a_capture_of_the_declared_reads_replays_the_same_findings(
    check_id: str, capture: str, tmp_path: Path
) -> None:
    """Collected by its reads alone (as over SSH or in a snapshot), a check judges alike."""
    from auditor.hosts.collect import collect_tar
    from auditor.registry import collected_paths

    check = CHECKS[check_id]
    source = ArchiveHost.from_path(str(CAPTURES[capture]))
    whole = [(f.status, f.subject, f.message) for f in check().evaluate(source)]
    root = extract_capture(CAPTURES[capture], tmp_path / capture)
    narrowed = ArchiveHost(collect_tar(collected_paths([check]), root=str(root)), "narrowed")
    assert [(f.status, f.subject, f.message) for f in check().evaluate(narrowed)] == whole


@pytest.mark.parametrize(("check_id", "case"), [
    p for p in _params() if p.values[1].expect in PROBLEMS  # type: ignore[attr-defined]
    and CHECKS[p.values[0]].fixable()  # type: ignore[attr-defined]
])
def test_the_fix_of_every_problem_renders_and_lints(check_id: str, case: Case,
                                                    tmp_path: Path) -> None:
    from tests.support.fixkit import write_scripts

    check = CHECKS[check_id]
    root = case.tree(tmp_path / "tree")
    report = audit_tree(root.root, check, case)
    from auditor.hosts import DirectoryHost
    from auditor.policy import load_policy

    plan = build_fix(DirectoryHost(str(root.root)), report, [check], load_policy([check]))
    assert plan.sections, f"{case.name}: the fixable check planned nothing for its problem"
    write_scripts(plan, tmp_path)  # bash -n and shellcheck
    assert render_fix(plan).script.startswith("#!/usr/bin/env bash\n")


@pytest.mark.root
@pytest.mark.parametrize(("check_id", "case"), _params(fixed=True))
def test_fix_reaudit_and_byte_exact_rollback(check_id: str, case: Case, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the copies of sysfs are read-only to other users")
    check_fix(CHECKS[check_id], case, tmp_path, list(CHECKS.values()))
