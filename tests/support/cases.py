"""Per-check pass/fail cases, and the contract every registered check is held to.

Each check has a cases module in ``tests/checks/cases/`` (ansible-lint ships
``rule-<id>-pass`` / ``-fail`` examples for every rule) naming its check id and a
list of :class:`Case`: a tree to start from (a real capture or a generated host), a
problem planted into it by a function, the status the check must give, and for a
fixable problem whether the fix script repairs it. ``tests/checks/test_contract.py``
runs every case of every registered check through the same contract (a plug-in's
test runs its own cases through :func:`check_case` and :func:`check_fix`):

- the check's verdict on the tree is the one the case expects;
- it reads nothing it did not declare in ``reads`` (its fix nothing beyond
  ``fix_reads`` and the paths every fix reads);
- for a fixable case, in both fix engines (the sysroot scripts, which hand their plan to
  python3, and the booted machine's bash scripts, run byte for byte in a private mount
  namespace chrooted onto a copy of the tree): the fix renders, passes ``bash -n`` and
  shellcheck, turns the verdict into the expected one, changes nothing when run again,
  and its rollback restores the tree byte for byte; the two engines leave the same tree.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from auditor.check import CheckClass
from auditor.fix import FixPlan, build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Report, Status, worst
from auditor.policy import Policy, load_policy
from auditor.registry import fix_reads
from auditor.runner import audit
from tests.support import livefix
from tests.support.fixkit import copy_tree, live_plan, run, tree_hash, write_scripts
from tests.support.hostgen import HostSpec, Tree, build_host
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import CAPTURES, Sysroot, extract_capture

#: Makes the starting tree of a case in a directory: a real capture, or a generated host.
Base = Callable[[Path], Sysroot]
#: Plants a problem into a case's tree; what it returns (some give the findings they
#: expect, for their own tests) is not used.
Plant = Callable[[Sysroot], object]


def capture(name: str) -> Base:
    """Start from a copy of one of the real captures (``h200``, ``virtio``)."""
    def make(dest: Path) -> Sysroot:
        return Sysroot(extract_capture(CAPTURES[name], dest))

    make.__name__ = name
    return make


def generated(spec: HostSpec | None = None) -> Base:
    """Start from a generated host (the 8-GPU Proxmox node, problems as the spec says)."""
    def make(dest: Path) -> Sysroot:
        return Sysroot(build_host(spec or HostSpec()).write_dir(dest))

    make.__name__ = "generated"
    return make


def built(make_tree: Callable[[], Tree], name: str = "") -> Base:
    """Start from a host a generator module builds (``lambda: build_pve9(PveSpec(...))``)."""
    def make(dest: Path) -> Sysroot:
        return Sysroot(make_tree().write_dir(dest))

    make.__name__ = name or "built"
    return make


def nothing(root: Sysroot) -> None:
    """Plant nothing: the tree as it is."""


@dataclass(frozen=True)
class Case:
    """One tree and the verdict a check must give on it."""

    name: str
    expect: Status
    plant: Plant = nothing
    base: Base = field(default_factory=lambda: capture("h200"))
    #: The fix script must turn the verdict into ``after`` (only for problem cases).
    fixed: bool = False
    after: Status = Status.PASS
    #: Options for the check (as a policy file would set them).
    options: tuple[tuple[str, object], ...] = ()

    def tree(self, dest: Path) -> Sysroot:
        """Build the case's tree under ``dest``."""
        root = self.base(dest)
        self.plant(root)
        return root


@dataclass(frozen=True)
class CheckCases:
    """The cases of one check, from its module in tests/checks/cases/."""

    check: str
    cases: tuple[Case, ...]


def all_cases() -> dict[str, CheckCases]:
    """Return the cases of every check that has a cases module, by check id."""
    import tests.checks.cases as package

    found: dict[str, CheckCases] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        check_id, cases = getattr(module, "CHECK", None), getattr(module, "CASES", None)
        if not isinstance(check_id, str) or not isinstance(cases, (list, tuple)):
            raise TypeError(f"{module.__name__} must define CHECK (an id) and CASES")
        if check_id in found:
            raise TypeError(f"{module.__name__}: a second cases module for {check_id}")
        found[check_id] = CheckCases(check_id, tuple(cases))
    return found


def _policy(check: CheckClass, case: Case) -> Policy:
    if not case.options:
        return load_policy([check])
    return Policy(options={check.id: check.options_type.build(dict(case.options), "case",
                                                             check.id)})


def verdict(report: Report, check_id: str) -> Status:
    """Return the worst status a report holds for one check."""
    return worst(f.status for f in report.findings if f.check == check_id)


def audit_tree(root: Path, check: CheckClass, case: Case) -> Report:
    """Audit a tree with one check, under the case's options."""
    policy = _policy(check, case)
    return audit(DirectoryHost(str(root)), [check], policy)


def check_case(check: CheckClass, case: Case, tmp: Path) -> None:
    """Assert the check's verdict on the case's tree, and that it read only what it declared."""
    root = case.tree(tmp / "tree")
    report = audit_tree(root.root, check, case)
    found = verdict(report, check.id)
    assert found is case.expect, (case.name, [(f.status, f.subject, f.message)
                                              for f in report.findings])
    assert all(f.status is not Status.ERROR for f in report.findings), report.findings
    recording = RecordingHost(str(root.root))
    list(check(_policy(check, case).options_for(check)).evaluate(recording))
    assert undeclared(recording.asked, check.reads) == [], case.name


def check_fix(check: CheckClass, case: Case, tmp: Path, every: Sequence[CheckClass]) -> None:
    """Assert the fix cycle of a problem case in both engines, and that they agree.

    The sysroot engine (the scripts hand their plan to python3) runs against one copy of
    the tree; the booted machine's bash scripts, byte for byte as operators run them, run
    against another (:mod:`tests.support.livefix`: a private mount namespace, chrooted).
    Each must repair the problem, change nothing on a second run and roll back byte for
    byte, and both must leave the same tree after the fix.
    """
    assert case.fixed and case.expect is not Status.PASS, case.name
    root = case.tree(tmp / "tree")
    report = audit_tree(root.root, check, case)
    assert verdict(report, check.id) is case.expect, report.findings
    policy = _policy(check, case)
    recording = RecordingHost(str(root.root))
    plan = build_fix(recording, report, [check], policy)
    allowed = (*check.reads, *fix_reads([check]))
    assert undeclared(recording.asked, allowed) == [], case.name
    assert plan.actions, f"{case.name}: the fix plans no step"
    live = live_plan(plan, root.root)
    bind = tuple(livefix.units(live, root.root))
    # The sysroot engine runs on the case's tree; the bash engine on the same case built
    # again (quicker than a copy; a case builds the same tree every time, checked here).
    # The sysroot scripts are linted by the render-and-lint test of the same case.
    before = tree_hash(root.root)
    second = case.tree(tmp / "bash-tree").root
    if tree_hash(second) != before:
        shutil.rmtree(second)
        second = copy_tree(root.root, second)
    python_engine = _Engine("python", *write_scripts(plan, tmp, lint=False), root.root, plan,
                            None)
    (tmp / "bash").mkdir()
    bash_engine = _Engine("bash", *write_scripts(live, tmp / "bash"), second, live,
                          tmp / "live", bind)
    for engine in (python_engine, bash_engine):
        livefix.give_dev_null(engine.tree)
    before = tree_hash(python_engine.tree)
    fixed = {}
    for engine in (python_engine, bash_engine):
        first = engine.run(engine.fix)
        assert first[0] == 0, f"{engine.name} engine: {first[1]}"
        fixed[engine.name] = tree_hash(engine.tree)
        assert fixed[engine.name] != before, f"{engine.name} engine changed nothing"
        assert verdict(audit_tree(engine.tree, check, case), check.id) is case.after, (
            f"{engine.name} engine: {case.name}")
    assert fixed["python"] == fixed["bash"], (
        "the engines disagree: " + "; ".join(tree_diff(python_engine.tree, bash_engine.tree)))
    for engine in (python_engine, bash_engine):
        again = engine.run(engine.fix)
        assert again[0] == 0, f"{engine.name} engine: {again[1]}"
        assert tree_hash(engine.tree) == fixed[engine.name], (
            f"{engine.name} engine: a second run changed the tree")
        undone = engine.run(engine.rollback)
        assert undone[0] == 0, f"{engine.name} engine: {undone[1]}"
        assert tree_hash(engine.tree) == before, (
            f"{engine.name} engine: the rollback did not restore the tree byte for byte: "
            + "; ".join(tree_diff(python_engine.tree, bash_engine.tree)))
        assert verdict(audit_tree(engine.tree, check, case), check.id) is case.expect
    assert livefix.leftovers(tmp / "live") == [], "the bash rollback left state behind"


@dataclass(frozen=True)
class _Engine:
    """One fix engine's scripts and the copy of the tree they run against."""

    name: str
    fix: Path
    rollback: Path
    tree: Path
    plan: FixPlan
    work: Path | None  # the live run's scratch directory; None: the sysroot engine
    bind: tuple[str, ...] = ()  # the tree's directories the live runs bind in place

    def run(self, script: Path) -> tuple[int, str]:
        """Run one script of this engine; return its exit status and output."""
        if self.work is None:
            done = run(script, self.tree)
            return done.returncode, done.stdout + done.stderr
        live = livefix.run_live(script, self.tree, self.plan, self.work, self.bind)
        return live.process.returncode, live.output


def tree_diff(left: Path, right: Path, limit: int = 8) -> list[str]:
    """Name the entries two trees hold differently (for failure messages), at most ``limit``.

    Links are compared as links, never followed (sysfs copies link in circles)."""
    def entries(root: Path) -> dict[str, tuple[int, bytes]]:
        found: dict[str, tuple[int, bytes]] = {}
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in (*dirnames, *filenames):
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    body = os.fsencode(os.readlink(path))
                elif stat.S_ISREG(st.st_mode):
                    body = Path(path).read_bytes()
                else:
                    body = str(st.st_rdev).encode()
                found[os.path.relpath(path, root)] = (st.st_mode, body)
        return found

    mine, theirs = entries(left), entries(right)
    return sorted(name for name in mine.keys() | theirs.keys()
                  if mine.get(name) != theirs.get(name))[:limit]
