"""The package as it is built and checked: one import root, every file type-checked."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_one_import_root_with_every_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("host_auditor-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = next(n for n in names if n.endswith("top_level.txt"))
        assert archive.read(top_level).decode().split() == ["auditor"]
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
    packaged = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    source = {os.path.relpath(directory, ROOT)
              for directory, _, files in os.walk(ROOT / "auditor", followlinks=True)
              if "__init__.py" in files}
    assert packaged == source
    assert any(n.startswith("auditor/templates/") and n.endswith(".j2") for n in names)
    assert b"[host_auditor.checks]" in entry_points


@pytest.mark.slow
def test_plain_mypy_in_the_checkout_reports_a_type_error_in_checks(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("auditor", "checks", "remediations", "templates", "tests"):  # mypy's packages
        shutil.copytree(ROOT / name, copy / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    planted = copy / "checks" / "lib" / "pci.py"
    planted.write_text(planted.read_text() + '\n\nPLANTED: int = "not an int"\n')
    mypy = Path(sys.executable).with_name("mypy")
    result = subprocess.run([str(mypy), "--no-incremental"], cwd=copy, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 1, result.stdout
    assert "auditor/checks/lib/pci.py" in result.stdout
    assert 'Incompatible types in assignment (expression has type "str"' in result.stdout


def test_ruff_bans_the_old_import_roots(tmp_path: Path) -> None:
    offender = tmp_path / "offender.py"
    offender.write_text("import checks\nfrom templates import x\n")
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "--no-cache", "--config",
                             str(ROOT / "pyproject.toml"), "--select", "TID", str(offender)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert result.stdout.count("TID251") == 2


def _imported_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Return which of ``modules`` a fresh interpreter has imported after running ``code``."""
    probe = (f"{code}\nimport sys\n"
             f"print(sorted(m for m in {modules!r} if m in sys.modules), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=False)
    imported: list[str] = ast.literal_eval(result.stderr.strip())  # nothing else on stderr
    return imported


def test_a_json_audit_imports_neither_jinja_nor_ssh_libraries() -> None:
    """Nor a thread pool: a capture's checks run one after another in the calling thread."""
    capture = str(ROOT / "tests/fixtures/hosts/h200-vm.tar.gz")
    code = ("from auditor.cli import main\n"
            f"main(['local', '--root', {capture!r}, '--format', 'json'])")
    assert _imported_after(code, ("jinja2", "fabric", "paramiko", "invoke",
                                  "concurrent.futures")) == []


#: What every command does first.
LOAD_CHECKS = "from auditor.registry import load_checks\nload_checks()"


def test_loading_the_checks_imports_no_fix_machinery() -> None:
    """Every run imports every check: what only a fix or some hosts need waits until used."""
    assert _imported_after(LOAD_CHECKS, ("auditor.remedy", "auditor.remediations.boot",
                                  "auditor.fix", "jinja2", "configparser", "hashlib")) == []


def test_a_warm_start_reads_no_distribution_metadata() -> None:
    """With the entry points remembered, listing the checks needs no metadata search (and
    none of what importlib.metadata, or applying a fix, would import)."""
    modules = ("importlib.metadata", "email", "socket", "tempfile")
    _imported_after(LOAD_CHECKS, modules)  # the first run remembers the entry points
    assert _imported_after(LOAD_CHECKS, modules) == []


def _ruff_stdin(source: str, filename: str, select: str) -> str:
    """Return ruff's report on ``source`` checked as if it were ``filename`` of the checkout
    (the per-file rules of pyproject.toml apply by that name)."""
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "--no-cache", "--config",
                             str(ROOT / "pyproject.toml"), "--select", select,
                             "--stdin-filename", str(ROOT / filename), "-"],
                            input=source, capture_output=True, text=True, check=False, cwd=ROOT)
    return result.stdout


@pytest.mark.parametrize(("filename", "count"), [("checks/planted.py", 1),
                                                 ("auditor/planted.py", 0)])
def test_ruff_keeps_the_remedy_model_out_of_a_check_modules_imports(
        filename: str, count: int) -> None:
    source = ("from __future__ import annotations\n\n"
              "from auditor.remedy import Remedy\n\n"
              "def fix() -> Remedy:\n    return Remedy('a.b', 's', 't')\n")
    report = _ruff_stdin(source, filename, "TID253")
    assert report.count("TID253") == count, report


@pytest.mark.parametrize(("filename", "count"), [("auditor/runner.py", 1),
                                                 ("checks/planted.py", 1),
                                                 ("auditor/hosts/planted.py", 1),
                                                 ("auditor/cli/planted.py", 0)])
def test_ruff_keeps_prints_out_of_the_core_and_the_checks(filename: str, count: int) -> None:
    """The core reports through return values and callbacks; only the CLI writes."""
    source = "def report(line: str) -> None:\n    print(line)\n"
    report = _ruff_stdin(source, filename, "T20")
    assert report.count("T201") == count, report
