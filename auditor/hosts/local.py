"""The live local machine, and a sysroot unpacked into a directory."""

from __future__ import annotations

import glob as globlib
import os
import socket
import stat
import subprocess
import tempfile

from auditor.hosts.base import Entry, Host, HostKind, ScriptResult


def _entry_from_stat(st: os.stat_result, path: str) -> Entry:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return Entry("link", target=os.readlink(path))
    if stat.S_ISDIR(mode):
        return Entry("dir")
    if stat.S_ISREG(mode):
        return Entry("file")
    if stat.S_ISCHR(mode):
        return Entry("chr", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
    if stat.S_ISBLK(mode):
        return Entry("blk", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
    return Entry("other")


def _read_file(real: str, limit: int) -> bytes:
    # sysfs files report a size of 4096 whatever they hold: read, never trust st_size.
    with open(real, "rb", buffering=0) as handle:
        return handle.read(limit)


def run_bash(script: str) -> ScriptResult:
    """Run a script with this machine's bash; return its status and its output (stderr too)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="host-auditor-fix-",
                                     delete=False, encoding="utf-8") as handle:
        handle.write(script)
        path = handle.name
    try:
        proc = subprocess.run(["bash", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", check=False)
    finally:
        os.unlink(path)
    return ScriptResult(proc.returncode, proc.stdout)


class DirectoryHost(Host):
    """A sysroot unpacked in a directory: the host's files at their paths below ``root``."""

    kind: HostKind = "sysroot"

    def __init__(self, root: str, name: str | None = None) -> None:
        self.root: str = os.path.abspath(root)
        self.target = f"sysroot:{self.root}"
        self._cache: dict[str, Entry | None] = {}
        self.name = name or self.read_optional("/etc/hostname") or os.path.basename(self.root)

    def _real(self, path: str) -> str:
        return self.root + path if path != "/" else self.root

    def lstat(self, path: str) -> Entry | None:
        try:
            return self._cache[path]
        except KeyError:
            pass
        real = self._real(path)
        try:
            entry: Entry | None = _entry_from_stat(os.lstat(real), real)
        except OSError:
            entry = None
        self._cache[path] = entry
        return entry

    def _read_resolved(self, path: str, limit: int) -> bytes:
        return _read_file(self._real(path), limit)

    def _listdir_resolved(self, path: str) -> list[str]:
        return os.listdir(self._real(path))

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a fix script made for this sysroot with this machine's bash."""
        return run_bash(script)


class LocalHost(Host):
    """The machine this process runs on, read straight from its filesystem."""

    kind: HostKind = "local"
    target = "local"

    def __init__(self) -> None:
        self.name = socket.gethostname()

    def lstat(self, path: str) -> Entry | None:
        try:
            return _entry_from_stat(os.lstat(path), path)
        except OSError:
            return None

    def resolve(self, path: str) -> str:
        return os.path.realpath(path)

    def _read_resolved(self, path: str, limit: int) -> bytes:
        return _read_file(path, limit)

    def _listdir_resolved(self, path: str) -> list[str]:
        return os.listdir(path)

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        return _read_file(path, limit)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def glob(self, pattern: str) -> list[str]:
        return sorted(globlib.glob(pattern))

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a fix script with this machine's bash (as the user running ``audit``)."""
        return run_bash(script)

    def processes(self) -> frozenset[str] | None:
        """Return the names of running processes, as psutil sees them."""
        import psutil  # deferred: only the governor check asks, and only on the live host

        names: set[str] = set()
        for proc in psutil.process_iter(["name"]):
            name = proc.info.get("name")
            if name:
                names.add(str(name))
        return frozenset(names)
