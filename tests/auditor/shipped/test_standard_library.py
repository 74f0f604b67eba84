"""The programs shipped to hosts (``auditor/shipped/``) import the standard library only.

Each runs where host-auditor is not installed: sent as source to a target's ``python3``,
embedded in a sysroot's scripts, or run by its path. An import of anything else would
fail there, not here; the few imports that may name more are listed with why.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import auditor.shipped

SHIPPED = Path(auditor.shipped.__file__).parent
PROGRAMS = sorted(p for p in SHIPPED.glob("*.py") if p.name != "__init__.py")
#: Imports beyond the standard library, by program, and why each cannot fail where it runs.
ALLOWED: dict[str, set[str]] = {
    # Imported only where it runs in the package: shipped, the program is sent after
    # treeio and the selector parse, whose names are then already defined.
    "collector_script": {"auditor.shipped.treeio"},
    "sysroot_fix": {"auditor.shipped.treeio", "auditor.parsing"},
    # NVML itself, in a try that reports "library_not_found" when it is not installed.
    "nvml_child": {"pynvml"},
}


def imports(tree: ast.AST) -> set[str]:
    """Return every module a program's source imports, at any depth."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_folder_holds_the_programs_the_auditor_ships() -> None:
    assert {p.stem for p in PROGRAMS} == {"treeio", "collector_script", "sysroot_fix",
                                          "nvml_child", "probe_agent"}


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_a_shipped_program_imports_the_standard_library_only(program: Path) -> None:
    tree = ast.parse(program.read_text(encoding="utf-8"), str(program))
    foreign = {name for name in imports(tree)
               if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"}
    assert foreign == ALLOWED.get(program.stem, set()), program.name

