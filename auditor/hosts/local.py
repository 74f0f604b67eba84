"""The live local machine, and a sysroot unpacked into a directory."""

from __future__ import annotations

import contextlib
import errno
import glob as globlib
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from auditor.errors import SnapshotError
from auditor.hosts.base import Entry, Host, HostKind, ScriptResult, clean_host_name
from auditor.shipped.treeio import Tree, read_fd

if TYPE_CHECKING:
    from auditor.hosts.gpustate import LocalGpuState

#: The GPU state's virtual directory (auditor.hosts.gpustate.STATE_DIR, kept here so that
#: a run that never reads it never imports that module).
_STATE_DIR = "/host-auditor"
_GPU_LOCK = threading.Lock()


def _entry_from_stat(st: os.stat_result, target: Callable[[], str]) -> Entry:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return Entry("link", target=target())
    if stat.S_ISDIR(mode):
        return Entry("dir", mtime=st.st_mtime)
    if stat.S_ISREG(mode):
        return Entry("file", mtime=st.st_mtime)
    if stat.S_ISCHR(mode):
        return Entry("chr", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
    if stat.S_ISBLK(mode):
        return Entry("blk", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
    return Entry("other")


def _read_file(real: str | bytes, limit: int) -> bytes:
    """Read a file of this machine until EOF or ``limit`` (sysfs sizes lie: never trusted).

    Opened without waiting (a FIFO where a file belongs does not hang the audit) and read
    only when it is a regular file or a character device (the live machine's own).
    """
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISDIR(mode):
            raise OSError(errno.EPERM, "not a regular file", os.fsdecode(real))
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
        return read_fd(fd, limit)
    finally:
        os.close(fd)


#: A directory sysroot is read with the caps of a tar capture (auditor.hosts.archive:
#: MAX_MEMBERS, MAX_ARCHIVE), counted as it is read: the entries looked at (names listed,
#: paths looked up, files read), the bytes read; and a time, as a collection has.
MAX_ENTRIES = 100_000
MAX_BYTES = 64 << 20
MAX_SECONDS = 120.0

#: How long ``--apply`` may run a fix script on this machine before it is stopped.
APPLY_LIMIT_S = 600.0


def _script_descriptor(script: str) -> int:
    """Return a descriptor holding the script that only this process can change.

    A sealed memfd where the kernel has one (nothing on a file system at all); else an
    unnamed file in a directory only we may write (``O_TMPFILE``), else one made and
    unlinked at once there. Never a name in ``$TMPDIR``: under ``sudo -E`` that is
    another user's directory, where the script could be renamed over before bash reads it.
    """
    import fcntl

    data = script.encode("utf-8")
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        try:
            fd = int(memfd_create("host-auditor-fix", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                _write_all(fd, data)
                seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW \
                    | fcntl.F_SEAL_WRITE
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
                return fd
            except BaseException:
                os.close(fd)
                raise
    fd = _private_file()
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private_file() -> int:
    """Return an unnamed file, opened for writing, in a directory nobody else may write."""
    home = os.path.expanduser("~")
    for directory in ("/run", "/dev/shm", home):
        try:
            st = os.stat(directory)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            continue
        try:
            return os.open(directory, os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
    from auditor.errors import UsageError

    raise UsageError("--apply: no place only this user may write to hold the fix script "
                     "(no memfd, and /run and the home directory are not this user's alone)")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def run_bash(script: str, *, timeout: float = APPLY_LIMIT_S) -> ScriptResult:
    """Run a script with this machine's bash; return its status and its output (stderr too).

    bash reads the script from a descriptor this process made and holds
    (:func:`_script_descriptor`), never from a file it would open again by name. The
    script is stopped (its whole process group) after ``timeout`` seconds.
    """
    fd = _script_descriptor(script)
    try:
        # Inherited by bash alone (pass_fds), and read through /dev/fd: the very file.
        os.lseek(fd, 0, os.SEEK_SET)
        proc = subprocess.Popen(["bash", f"/dev/fd/{fd}"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(fd,))
    finally:
        os.close(fd)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        text = output.decode("utf-8", "replace")
        return ScriptResult(124, text + f"host-auditor: error: the fix script was stopped "
                            f"after {timeout:g} s\n")
    return ScriptResult(proc.returncode, output.decode("utf-8", "replace"))


class DirectoryHost(Host):
    """A sysroot unpacked in a directory: the host's files at their paths below ``root``.

    The tree may belong to someone else and change while it is read: every path is
    opened inside it through :class:`auditor.shipped.treeio.Tree` (never outside, symlinks
    followed as in a chroot, only regular files read).
    """

    kind: HostKind = "sysroot"

    def __init__(self, root: str, name: str | None = None) -> None:
        self.root: str = os.path.abspath(root)
        self.target = f"sysroot:{self.root}"
        self.tree = Tree(self.root)
        self._cache: dict[str, Entry | None] = {}
        self._spent = [0, 0]  # entries, bytes
        self._deadline = time.monotonic() + MAX_SECONDS
        self.name = name or clean_host_name(self.read_optional("/etc/hostname")) \
            or os.path.basename(self.root)

    def _split(self, path: str) -> tuple[bytes, bytes] | None:
        """Return (directory, name) of a path, or None where it names no entry of its own."""
        parent, _, name = self.names.raw(path).rpartition(b"/")
        if name in (b"", b".", b".."):
            return None
        return parent or b"/", name

    def _spend(self, entries: int, size: int = 0) -> None:
        """Count what was read; refuse to read on past a capture's caps."""
        spent = self._spent
        spent[0] += entries
        spent[1] += size
        if spent[0] > MAX_ENTRIES or spent[1] > MAX_BYTES:
            raise SnapshotError(f"{self.root}: more than {MAX_ENTRIES} entries or "
                                f"{MAX_BYTES >> 20} MiB read from the sysroot (the caps of a "
                                "capture): the rest is not read")
        if time.monotonic() > self._deadline:
            raise SnapshotError(f"{self.root}: reading the sysroot took more than "
                                f"{MAX_SECONDS:g} s: the rest is not read")

    def forget(self) -> None:
        """Drop what was learned (a re-audit reads the tree again, with fresh caps)."""
        super().forget()
        self._cache.clear()
        self._spent = [0, 0]
        self._deadline = time.monotonic() + MAX_SECONDS

    def lstat(self, path: str) -> Entry | None:
        try:
            return self._cache[path]
        except KeyError:
            pass
        self._spend(1)
        entry: Entry | None = None
        split = self._split(path)
        try:
            if split is None:
                raw = self.names.raw(path)
                st = self.tree.lstat(raw)
                entry = None if st is None else _entry_from_stat(
                    st, lambda: self.names.text(self.tree.readlink(raw)))
            else:
                # The directory is resolved once (inside the tree) for all its entries.
                parent, name = split
                dirfd = self.tree.hold(parent)
                try:
                    st = self.tree.lstat_at(dirfd, name)
                    entry = None if st is None else _entry_from_stat(
                        st, lambda: self.names.text(os.readlink(name, dir_fd=dirfd)))
                finally:
                    self.tree.release(parent)
        except OSError:
            entry = None
        self._cache[path] = entry
        return entry

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        """Read a regular file of the tree (``..`` and symlinks resolved inside it).

        The file is opened by its directory's path and its name, the last never followed
        (:meth:`Tree.read_file`); a symlink there is resolved inside the tree.
        """
        # The tree resolves the directory's "//", "." and ".." inside it, as the kernel
        # does; a path whose last component is none of its own takes the slow way.
        parent, _, name = self.names.raw(path).rpartition(b"/")
        self._spend(1)
        if name not in (b"", b".", b".."):
            try:
                data = self.tree.read_file(parent or b"/", name, limit)
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundError(path) from None
            if data is not None:
                self._spend(0, len(data))
                return data
        # A symlink where the file is named: resolved inside the tree, the slow way.
        return super().read_bytes(path, limit)

    def _read_resolved(self, path: str, limit: int) -> bytes:
        data = self.tree.read(self.names.raw(path), limit)
        self._spend(0, len(data))
        return data

    def _listdir_resolved(self, path: str) -> list[str]:
        names = self.tree.listdir(self.names.raw(path))
        self._spend(len(names))
        return [self.names.text(n) for n in names]

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a fix script made for this sysroot with this machine's bash."""
        return run_bash(script)

    def close(self) -> None:
        """Close the tree's root descriptor."""
        self.tree.close()


class LocalHost(Host):
    """The machine this process runs on, read straight from its filesystem."""

    kind: HostKind = "local"
    target = "local"
    blocking_reads = True

    #: How long the GPU-state collector (NVML or nvidia-smi) may take.
    gpu_deadline: float = 10.0
    #: None: NVML where pynvml is installed, else nvidia-smi; False: nvidia-smi only.
    gpu_use_nvml: bool | None = None

    def __init__(self) -> None:
        # gethostname(2) is uname(2)'s nodename (importing socket costs ~1 ms a run).
        self.name = os.uname().nodename
        self._gpu_state: LocalGpuState | None = None

    # -- the GPU state's virtual files (auditor.hosts.gpustate), collected on first read --

    def gpu_state(self) -> LocalGpuState:
        """Return the collector of this machine's GPU state (it runs on the first read)."""
        state = self._gpu_state
        if state is None:
            with _GPU_LOCK:  # checks run in parallel here: one collector for all of them
                state = self._gpu_state
                if state is None:
                    from auditor.hosts.gpustate import LocalGpuState

                    state = LocalGpuState(self.gpu_deadline, self.gpu_use_nvml)
                    self._gpu_state = state
        return state

    def _virtual(self, path: str) -> bool:
        return path == _STATE_DIR or path.startswith(_STATE_DIR + "/")

    def forget(self) -> None:
        """Drop what was learned, the GPU state too (a re-audit collects it again)."""
        super().forget()
        self._gpu_state = None

    def lstat(self, path: str) -> Entry | None:
        if self._virtual(path):
            if path == _STATE_DIR:
                return Entry("dir")
            return Entry("file") if self.gpu_state().read(path) is not None else None
        raw = self.names.raw(path)
        try:
            return _entry_from_stat(os.lstat(raw), lambda: self.names.text(os.readlink(raw)))
        except OSError:
            return None

    def resolve(self, path: str) -> str:
        if self._virtual(path):
            return path
        return self.names.text(os.path.realpath(self.names.raw(path)))

    def _read_resolved(self, path: str, limit: int) -> bytes:
        return self.read_bytes(path, limit)

    def _listdir_resolved(self, path: str) -> list[str]:
        if path == _STATE_DIR:
            return self.gpu_state().listing()
        return [self.names.text(n) for n in os.listdir(self.names.raw(path))]

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        if self._virtual(path):
            data = self.gpu_state().read(path)
            if data is None:
                raise FileNotFoundError(path)
            return data[:limit]
        return _read_file(self.names.raw(path), limit)

    def listdir(self, path: str) -> list[str]:
        return sorted(self._listdir_resolved(path))

    def glob(self, pattern: str) -> list[str]:
        if self._virtual(pattern):
            return super().glob(pattern)
        return sorted(self.names.text(p) for p in globlib.glob(self.names.raw(pattern)))

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a fix script with this machine's bash (as the user running ``audit``)."""
        return run_bash(script)

    def processes(self) -> frozenset[str] | None:
        """Return the names of running processes, as psutil sees them (from ``/proc``
        where psutil is not installed: the single-file build carries no compiled code)."""
        try:
            import psutil  # deferred: only the governor check asks, and only on the live host
        except ImportError:
            return proc_names()

        names: set[str] = set()
        for proc in psutil.process_iter(["name"]):
            name = proc.info.get("name")
            if name:
                names.add(str(name))
        return frozenset(names)


#: The longest process name the kernel keeps in ``/proc/PID/comm`` (TASK_COMM_LEN - 1).
COMM_LEN = 15


def proc_names(proc: str = "/proc") -> frozenset[str]:
    """Return the names of running processes as psutil's ``Process.name()`` gives them.

    The kernel's ``comm`` holds 15 bytes at most; where it is that long, psutil takes the
    command line's first word's base name when it starts with ``comm``
    (psutil/_pslinux.py, ``Process.name`` and psutil/__init__.py), and so does this.
    A process that ends meanwhile, or whose files cannot be read, is left out.
    """
    names: set[str] = set()
    try:
        pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return frozenset()
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/comm", "rb") as handle:
                name = handle.read(64).rstrip(b"\n").decode("utf-8", "replace")
        except OSError:
            continue
        if len(name) >= COMM_LEN:
            try:
                with open(f"{proc}/{pid}/cmdline", "rb") as handle:
                    first = handle.read(4096).split(b"\0", 1)[0]
            except OSError:
                first = b""
            full = os.path.basename(first.decode("utf-8", "replace"))
            if full.startswith(name):
                name = full
        if name:
            names.add(name)
    return frozenset(names)
