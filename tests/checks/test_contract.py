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
from tests.support import livefix
from tests.support.cases import Case, all_cases, audit_tree, check_case, check_fix
from tests.support.fixkit import write_scripts
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
    # As root, both engines run: a machine that cannot run the bash one fails here.
    assert livefix.available() == "", livefix.available()
    check_fix(CHECKS[check_id], case, tmp_path, list(CHECKS.values()))


def test_every_step_kind_is_one_description_both_engines_follow() -> None:
    """Each step kind names its fix and undo verbs once (``Verbs``); the bash scripts
    define a function and the sysroot engine a ``step_`` method of each name, taking the
    fields the description names, and neither engine has a verb no kind names."""
    import dataclasses
    import re

    from auditor.remedy import CHANGES, RunCommand, Step
    from auditor.shipped.sysroot_fix import Applier

    templates = Path(__file__).parents[2] / "templates"
    defined = {name for template in ("fix.sh.j2", "rollback.sh.j2")
               for name in re.findall(r"^([a-z_]+)\(\) \{$",
                                      (templates / template).read_text(), re.MULTILINE)}
    methods = {name[len("step_"):] for name in dir(Applier) if name.startswith("step_")}
    kinds = {cls.kind for cls in Step.__args__}
    assert set(CHANGES) == kinds - {RunCommand.kind}
    verbs: set[str] = set()
    for kind, cls in CHANGES.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        for verb, args in ((cls.verbs.fix, cls.verbs.fix_args),
                           (cls.verbs.undo, cls.verbs.undo_args)):
            verbs.add(verb)
            assert verb in defined, f"{kind}: no bash function {verb}"
            assert verb in methods, f"{kind}: no sysroot method step_{verb}"
            for arg in args:
                assert arg in fields or isinstance(getattr(cls, arg, None), property), (kind, arg)
        assert set(cls.verbs.undo_args) <= set(cls.verbs.fix_args), kind
    assert methods == verbs, "sysroot step methods no kind names"


@pytest.mark.root
def test_a_step_changed_in_one_engine_only_fails_the_contract(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bash write_file planted to give a new file another mode than the sysroot
    engine gives it: the contract fails on that case, saying the engines disagree."""
    if os.geteuid() != 0:
        pytest.skip("the copies of sysfs are read-only to other users")
    from tests.support import cases as contract

    case = next(c for c in CASES["container.toolkit"].cases if c.fixed)
    planted: list[Path] = []

    def plant(plan: object, where: Path, *, lint: bool = True) -> tuple[Path, Path]:
        fix, rollback = write_scripts(plan, where, lint=lint)  # type: ignore[arg-type]
        if not getattr(plan, "root", "x"):  # the booted machine's script: bash's own steps
            text = fix.read_text()
            assert "        chmod \"$mode\" -- \"$path\"\n" in text
            assert "\nwrite_file s" in text, "the case's fix writes no new file"
            fix.write_text(text.replace("        chmod \"$mode\" -- \"$path\"\n",
                                        "        chmod 0600 -- \"$path\"\n"))
            planted.append(fix)
        return fix, rollback

    check_fix(CHECKS["container.toolkit"], case, tmp_path / "honest", list(CHECKS.values()))
    monkeypatch.setattr(contract, "write_scripts", plant)
    with pytest.raises(AssertionError, match="the engines disagree"):
        check_fix(CHECKS["container.toolkit"], case, tmp_path / "planted", list(CHECKS.values()))
    assert planted
