"""Helpers for the fix-script tests: plant problems, run scripts, hash whole trees."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from auditor.fix import FixPlan, build_fix
from auditor.hosts import DirectoryHost
from auditor.model import Report, Status
from auditor.policy import Policy, load_policy
from auditor.registry import load_checks
from auditor.render import render_fix
from auditor.runner import audit
from tests.support.sysroot import Sysroot

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sysfs copies are read-only to users")


def tree_hash(root: Path) -> str:
    """Hash every entry under root: relative path, type and mode, bytes or link target."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
            digest.update(rel + b"\0" + oct(st.st_mode).encode() + b"\0")
            if stat.S_ISLNK(st.st_mode):
                digest.update(os.readlink(path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                digest.update(Path(path).read_bytes())
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                digest.update(str(st.st_rdev).encode())
            digest.update(b"\0")
    return digest.hexdigest()


def copy_tree(src: Path, dest: Path) -> Path:
    """Copy a sysroot exactly (symlinks as links, device nodes, modes)."""
    # cp -a keeps device nodes as nodes; shutil.copytree would open them.
    subprocess.run(["cp", "-a", "--", str(src), str(dest)], check=True)
    return dest


def policy() -> Policy:
    return load_policy(load_checks())


def audit_root(root: Path | Sysroot) -> Report:
    """Audit a sysroot directory with every registered check."""
    path = root.root if isinstance(root, Sysroot) else root
    return audit(DirectoryHost(str(path)), load_checks(), policy())


def plan_for(root: Sysroot, report: Report | None = None) -> FixPlan:
    """Plan the fix of a sysroot's findings (an audit of it unless a report is given)."""
    host = DirectoryHost(str(root.root))
    return build_fix(host, report if report is not None else audit_root(root), load_checks(),
                     policy())


def write_scripts(plan: FixPlan, where: Path, *, lint: bool = True) -> tuple[Path, Path]:
    """Render the fix and rollback, check them with bash -n and shellcheck (``lint``: the
    contract lints each problem's sysroot scripts once, in their own test), return their
    paths."""
    fix, rollback = where / "fix.sh", where / "fix.rollback.sh"
    scripts = render_fix(plan)
    fix.write_text(scripts.script)
    rollback.write_text(scripts.rollback)
    for script in (fix, rollback):
        subprocess.run(["bash", "-n", str(script)], check=True)
    if lint and shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "-S", "style", str(fix), str(rollback)],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout
    return fix, rollback


def run(script: Path, *args: str | Path, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run a script with bash; return the finished process (output captured)."""
    return subprocess.run(["bash", str(script), *map(str, args)], capture_output=True,
                          text=True, check=False, timeout=60, cwd=cwd)


#: A file-name-safe payload (no slash): run in a directory, it leaves a marker there.
EVIL = "$(touch pwned-marker)`touch pwned-marker`"


def statuses(report: Report, check: str) -> set[Status]:
    return {f.status for f in report.findings if f.check == check}


def fix_cycle(root: Sysroot, tmp: Path, report: Report | None = None
              ) -> tuple[FixPlan, Path, Path, Path, str]:
    """Plan a fix, copy the sysroot, run the fix once; return plan, scripts, copy, hash before."""
    plan = plan_for(root, report)
    fix, rollback = write_scripts(plan, tmp)
    copy = copy_tree(root.root, tmp / "copy")
    before = tree_hash(copy)
    result = run(fix, copy)
    assert result.returncode == 0, result.stdout + result.stderr
    return plan, fix, rollback, copy, before


def assert_idempotent_and_reversible(fix: Path, rollback: Path, copy: Path, before: str) -> None:
    """A second run changes nothing; the rollback restores the tree byte for byte."""
    fixed = tree_hash(copy)
    assert fixed != before
    again = run(fix, copy)
    assert again.returncode == 0, again.stdout + again.stderr
    assert tree_hash(copy) == fixed
    undone = run(rollback, copy)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(copy) == before
    # A second rollback finds nothing left to do.
    assert run(rollback, copy).returncode == 0
    assert tree_hash(copy) == before


def live_plan(plan: FixPlan, tree: Path) -> FixPlan:
    """Return a sysroot's plan as the booted machine the tree holds would get it.

    The same steps (the remediations do not depend on the target), no root, and the host
    name the guard of a booted machine compares: the kernel's, else ``/etc/hostname``.
    """
    import dataclasses

    def first_line(rel: str) -> str:
        path = tree / rel
        lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
        return lines[0].strip() if lines else ""

    hostname = (first_line("proc/sys/kernel/hostname") or first_line("etc/hostname")
                or plan.host)
    return dataclasses.replace(plan, root="", hostname=hostname)
