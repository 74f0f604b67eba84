#!/usr/bin/env python3
"""Build ``audit`` as one file: a zipapp that runs on any Linux machine with Python 3.10+.

    python3 contrib/pyz/build.py                  # -> dist/audit.pyz
    install -m 755 dist/audit.pyz /usr/local/bin/audit

Run it with the Python environment host-auditor is installed in (a checkout's ``.venv``):
host-auditor itself is built from this repository with pip, and its pure-Python
dependencies (typer, Jinja2, PyYAML, rich, pyudev, ...) are copied from that environment,
so the build needs no network beyond what ``pip install .`` needs. Compiled extensions
are never copied (a zip cannot load them): MarkupSafe and PyYAML fall back to their pure
Python code, the process list is read from ``/proc`` where psutil is missing, and
``audit host`` / ``audit snapshot`` over SSH, which need fabric, paramiko and the
compiled ``cryptography``, say so and exit 2: install the package (``pip install .``) on
the controller that audits over SSH, and the file on the nodes that run ``audit local``
(Slurm, NHC, Ansible ``mode: installed``, the Kubernetes image).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipapp
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Distributions host-auditor needs at run time, or the closure of them, that are left
#: out: each needs compiled code and serves only the SSH commands, or is optional.
LEFT_OUT = {
    "fabric": "SSH (audit host, audit snapshot HOST): needs paramiko and cryptography",
    "paramiko": "SSH: needs the compiled cryptography, bcrypt and PyNaCl",
    "invoke": "fabric's",
    "psutil": "compiled; the process list is read from /proc without it",
    "msgspec": "compiled; audit merge runs where host-auditor is installed from its wheel",
    "colorama": "Windows only",
}

#: What of the repository the package is not built from.
NOT_PACKAGED = (".git", ".venv", ".ci", "build", "dist", "tests", "bench", "contrib",
                "ansible", "*.egg-info", "__pycache__", ".*_cache", ".devcarry", ".whl",
                ".bench")

MAIN = '''\
"""Run ``audit`` from the zipapp."""
import sys

from auditor.cli import main

sys.exit(main())
'''


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requirement: str) -> bool:
    """Return whether a requirement applies here at run time (no extra, markers true)."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1]
    if "extra" in marker:
        return False
    try:
        from packaging.markers import Marker
    except ImportError:
        from pip._vendor.packaging.markers import Marker
    return bool(Marker(marker).evaluate())


def closure(root: str) -> list[importlib.metadata.Distribution]:
    """Return the installed distributions ``root`` needs at run time, less :data:`LEFT_OUT`."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = _normal(todo.pop())
        if name in seen or name in LEFT_OUT:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"build: {name} is not installed in {sys.executable}'s "
                             "environment: run this with the one host-auditor is installed "
                             "in (.venv/bin/python contrib/pyz/build.py)") from None
        seen[name] = dist
        todo.extend(_name(r) for r in dist.requires or () if _wanted(r))
    seen.pop(_normal(root))
    return list(seen.values())


def copy_distribution(dist: importlib.metadata.Distribution, stage: Path) -> int:
    """Copy a distribution's Python files and metadata into ``stage``; return how many."""
    copied = 0
    for entry in dist.files or ():
        parts = Path(str(entry)).parts
        if not parts or parts[0] == ".." or "__pycache__" in parts:
            continue  # console scripts live outside site-packages; bytecode is remade
        if str(entry).endswith((".so", ".pyd", ".pyc", ".dll")):
            continue  # compiled code cannot be imported from a zip
        source = Path(str(dist.locate_file(entry)))
        if not source.is_file():
            continue
        target = stage.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    return copied


def build(output: Path) -> Path:
    """Build the zipapp at ``output``; return its path."""
    with tempfile.TemporaryDirectory(prefix="audit-pyz-") as scratch:
        stage = Path(scratch) / "app"
        # host-auditor itself, as pip builds it from a copy of this repository's package
        # (so the build leaves no build/ or egg-info in the checkout): its entry points,
        # templates and checks all in place, without its dependencies.
        source = Path(scratch) / "src"
        shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
            *NOT_PACKAGED))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-compile", "--disable-pip-version-check", "--target", str(stage),
                        str(source)], check=True)
        for dist in closure("host-auditor"):
            copy_distribution(dist, stage)
        for leftover in stage.glob("bin"):
            shutil.rmtree(leftover)
        (stage / "__main__.py").write_text(MAIN)
        # Bytecode beside each module, where zipimport looks: this Python starts without
        # compiling; another version finds the bytecode's magic wrong and reads the source.
        compileall.compile_dir(str(stage), quiet=1, legacy=True, workers=1)
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_name(f".{output.name}.{os.getpid()}")
        zipapp.create_archive(stage, partial, interpreter="/usr/bin/env python3",
                              compressed=True)
        os.chmod(partial, 0o755)  # noqa: S103 - a program every user may run
        os.replace(partial, output)
    return output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=REPO / "dist" / "audit.pyz",
                        help="where to write the zipapp (default: dist/audit.pyz)")
    args = parser.parse_args()
    path = build(args.output)
    print(f"{path}: {path.stat().st_size // 1024} KiB; install it as /usr/local/bin/audit")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
