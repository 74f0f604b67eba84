"""The single-file build: one command makes it, and it audits a machine that has nothing
but Python (no site-packages at all: ``python3 -I -S``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from auditor.hosts.local import proc_names
from tests.support.pyz import audit_pyz
from tests.support.sysroot import Sysroot

#: The interpreter of the machine, not this environment's (whose site-packages hold
#: host-auditor's dependencies): -S leaves every site-packages directory out.
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def bare(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the build with the machine's Python and nothing but its standard library."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd or "/nonexistent"), "LANG": "C.UTF-8"}
    return subprocess.run([PYTHON, "-I", "-S", str(audit_pyz()), *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


def test_the_build_carries_no_compiled_code_and_no_ssh() -> None:
    names = zipfile.ZipFile(audit_pyz()).namelist()
    assert "__main__.py" in names and "auditor/cli/__init__.py" in names
    assert "auditor/templates/report.txt.j2" in names
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert not [n for n in names if n.split("/")[0] in ("paramiko", "fabric", "psutil",
                                                         "msgspec")]
    assert os.access(audit_pyz(), os.X_OK)
    assert audit_pyz().read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_it_audits_a_sysroot_with_only_the_standard_library(
    h200: Sysroot, tmp_path: Path
) -> None:
    proc = bare("local", "--root", str(h200.root), "--format", "json", cwd=tmp_path)
    assert proc.returncode in (0, 1) and proc.stderr == "", proc.stderr
    report = json.loads(proc.stdout)
    assert report["target"] == f"sysroot:{h200.root}"
    # The same findings as the package installed with every dependency gives.
    full = subprocess.run([sys.executable, "-m", "auditor", "local", "--root", str(h200.root),
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    assert full.returncode == proc.returncode
    expected = json.loads(full.stdout)
    assert report["findings"] == expected["findings"] and len(report["findings"]) > 20
    # Its checks are found through its own entry points, every one of them.
    listed = bare("checks", "--format", "json", cwd=tmp_path)
    ours = subprocess.run([sys.executable, "-m", "auditor", "checks", "--format", "json"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert [c["id"] for c in json.loads(listed.stdout)] == [
        c["id"] for c in json.loads(ours.stdout)]


def test_it_audits_this_machine_and_writes_a_fix_script(tmp_path: Path) -> None:
    proc = bare("local", "--format", "line", cwd=tmp_path)
    assert proc.returncode in (0, 1) and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(("OK ", "FAIL ", "WARN ", "ERROR "))
    script = tmp_path / "fix.sh"
    proc = bare("local", "--check", "numa.balancing", "--fix-script", str(script), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    if script.exists():
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_ssh_is_one_line_saying_what_to_install(tmp_path: Path) -> None:
    proc = bare("host", "gpu-01", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "pip install host-auditor" in proc.stderr


def test_merge_is_one_line_saying_where_it_runs(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"host": "gpu-01", "findings": []}')
    proc = bare("merge", "a.json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "msgspec" in proc.stderr
    assert "pip install" in proc.stderr


def test_process_names_without_psutil_are_psutils(tmp_path: Path) -> None:
    """/proc read directly names a process as psutil does, a long name included."""
    psutil = pytest.importorskip("psutil")
    long_name = tmp_path / "host-auditor-long-sleeper"
    long_name.symlink_to(shutil.which("sleep") or "/bin/sleep")
    sleeper = subprocess.Popen([str(long_name), "30"])
    try:
        with_psutil = {p.info["name"] for p in psutil.process_iter(["name"])}
        assert "host-auditor-long-sleeper" in with_psutil
        assert "host-auditor-long-sleeper" in proc_names()
        # The same names, but for processes that started or ended between the two reads.
        mine = psutil.Process()
        assert mine.name() in proc_names()
    finally:
        sleeper.kill()
        sleeper.wait()
