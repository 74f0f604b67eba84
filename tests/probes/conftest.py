"""A stand-in libcuda.so.1 compiled from fake_cuda.c, and the probe program's runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from auditor.probes import agent

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the fake libcuda.so.1 (compiled here; needs cc)."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the fake libcuda.so.1")
    out = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o",
                    str(out / "libcuda.so.1"), str(HERE / "fake_cuda.c")], check=True)
    return out


RunAgent = Callable[..., dict[str, Any]]


@pytest.fixture
def run_agent(fake_cuda: Path) -> RunAgent:
    """Run the probe program as audit probe does, with the fake driver on the library path."""
    def run(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60) -> dict[
            str, Any]:
        environment = {**os.environ, "LD_LIBRARY_PATH": str(fake_cuda), **(env or {})}
        done = subprocess.run([sys.executable, "-I", agent.__file__, *args], env=environment,
                              capture_output=True, text=True, timeout=timeout, check=True)
        line = [x for x in done.stdout.splitlines() if x.startswith(agent.MARK)][-1]
        document: dict[str, Any] = json.loads(line[len(agent.MARK):])
        return document

    return run
