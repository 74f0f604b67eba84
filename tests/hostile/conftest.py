"""What the hostile-input tests share: canaries outside the tree, limited runs, loop devices.

Everything hostile is built here by test code (bombs, pathological lines, odd names,
device nodes); nothing large is committed.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from tests.support.fixkit import tree_hash

AUDIT = str(Path(sys.executable).parent / "audit")


#: What ``audit host`` prints on stderr for each finished host off a terminal.
PROGRESS = re.compile(r"audit: \[\d+/\d+\] ")


@dataclass
class Canary:
    """Files outside the tree under test that a hostile tree points at; they must not change."""

    root: Path
    secret: str = "CANARY-SECRET-7f3a"

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "secret").write_text(self.secret + "\n")
        (self.root / "60-numa.conf").write_text("kernel.numa_balancing = 1\n")
        (self.root / "cron.d").mkdir(exist_ok=True)
        (self.root / "cron.d" / "keep").write_text("keep\n")
        self.before = tree_hash(self.root)

    def unchanged(self) -> bool:
        return tree_hash(self.root) == self.before


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    return Canary(tmp_path / "outside")


@dataclass
class Finished:
    """A finished command: exit code, output, wall time and peak memory (RSS, bytes)."""

    code: int
    out: str
    err: str
    wall: float
    max_rss: int

    def one_error_line(self) -> str:
        """Return the one line on stderr that is not a host's progress line, all printable."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert all(line.isprintable() for line in lines), lines
        others = [line for line in lines if not PROGRESS.match(line)]
        assert len(others) == 1, self.err
        return others[0]


def run_limited(args: list[str], *, timeout: float = 120, memory: int = 2 << 30,
                env: dict[str, str] | None = None, stdin: bytes | None = None) -> Finished:
    """Run a command with an address-space limit; return its result, wall time and peak RSS.

    The limit is the command's own (setrlimit in the child); the peak RSS is the child's
    own (wait4), so other tests' processes do not count.
    """
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    started = time.monotonic()
    process = subprocess.Popen(args, stdin=subprocess.PIPE if stdin is not None else
                               subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=limit, env=env)
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}

    def drain(name: str, stream: IO[bytes]) -> None:
        for block in iter(lambda: stream.read(65536), b""):
            chunks[name].append(block)

    readers = [threading.Thread(target=drain, args=(name, stream), daemon=True)
               for name, stream in (("out", process.stdout), ("err", process.stderr))]
    for reader in readers:
        reader.start()
    if stdin is not None and process.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(stdin)
        process.stdin.close()
    # wait4: this child's own peak RSS, not the largest of every child this test run made.
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout:
            process.kill()
            os.wait4(process.pid, 0)
            raise AssertionError(f"{args[:3]} ran past {timeout} s")
        time.sleep(0.02)
    wall = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join(10)
    return Finished(process.returncode, b"".join(chunks["out"]).decode("utf-8", "replace"),
                    b"".join(chunks["err"]).decode("utf-8", "replace"), wall,
                    usage.ru_maxrss * 1024)


def audit_cmd(*args: str) -> list[str]:
    return [AUDIT, *args]


@contextlib.contextmanager
def loop_device(backing: Path) -> Iterator[tuple[str, int, int]]:
    """A loop block device over ``backing`` (root): yield its path, major and minor."""
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("a loop device needs root and losetup")
    result = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"no loop device here: {result.stderr.strip()}")
    device = result.stdout.strip()
    try:
        st = os.stat(device)
        yield device, os.major(st.st_rdev), os.minor(st.st_rdev)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
