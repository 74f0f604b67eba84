"""A stand-in libcuda.so.1 compiled from fake_cuda.c, and the probe program's runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from auditor.shipped import probe_agent as agent

HERE = Path(__file__).parent


def _build(tmp_path_factory: pytest.TempPathFactory, source: str, library: str) -> Path:
    """Compile a stand-in driver library into a directory of its own; return the directory."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip(f"no C compiler (cc) to build the stand-in {library}")
    out = tmp_path_factory.mktemp(source.removesuffix(".c"))
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o",
                    str(out / library), str(HERE / source)], check=True)
    return out


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the fake libcuda.so.1 (compiled here; needs cc)."""
    return _build(tmp_path_factory, "fake_cuda.c", "libcuda.so.1")


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the fake libnvidia-ml.so.1."""
    return _build(tmp_path_factory, "fake_nvml.c", "libnvidia-ml.so.1")


@pytest.fixture(scope="session")
def fake_hip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the fake libamdhip64.so."""
    return _build(tmp_path_factory, "fake_hip.c", "libamdhip64.so")


RunAgent = Callable[..., dict[str, Any]]


@pytest.fixture
def run_agent(fake_cuda: Path) -> RunAgent:
    """Run the probe program as audit probe does, with the fake driver on the library path."""
    def run(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60,
            libraries: Sequence[Path] | None = None) -> dict[str, Any]:
        path = ":".join(str(p) for p in (fake_cuda, *(libraries or ())))
        environment = {**os.environ, "LD_LIBRARY_PATH": path, **(env or {})}
        done = subprocess.run([sys.executable, "-I", agent.__file__, *args], env=environment,
                              capture_output=True, text=True, timeout=timeout, check=True)
        line = [x for x in done.stdout.splitlines() if x.startswith(agent.MARK)][-1]
        document: dict[str, Any] = json.loads(line[len(agent.MARK):])
        return document

    return run
