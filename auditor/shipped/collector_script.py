# ruff: noqa: UP006, UP031, UP035, UP045
"""Write the files matching shell patterns as a tar sysroot: the collector that runs on targets.

This module is sent as it is to an audited host's own ``python3`` and run there,
so it imports only the standard library and keeps to syntax and library calls
that Python 3.6 accepts (RHEL 8 and Ubuntu 18.04 ship 3.6): no ``from
__future__ import annotations``, typing aliases instead of builtin generics.
:mod:`auditor.hosts.collect` is the interface the rest of the package uses.

What is written (a sysroot that :class:`auditor.hosts.archive.ArchiveHost` reads
the same way as the live host):

- regular files with the bytes a program reads (``st_size`` is never trusted:
  sysfs files claim 4096), at most ``FILE_CAP`` bytes each;
- symlinks as symlinks; a path that goes through a symlinked directory is
  recorded as the link plus the target's entries at the target's path;
- directories, and character / block devices with their major and minor;
- nothing that cannot be read (EACCES and other read errors are skipped), and
  never a secret: process environments, memory, keys.
"""

import collections
import fnmatch
import io
import os
import re
import stat
import sys
import tarfile
from typing import BinaryIO, Dict, List, Optional, Set, Tuple  # noqa: F401 - type comments

try:
    Tree  # sent to a remote host, this module follows treeio's source  # noqa: B018
except NameError:
    from auditor.shipped.treeio import Tree

#: The most bytes kept of one file.
FILE_CAP = 1 << 20
_MAX_LINKS = 40
_MAX_PARTS = 4096

#: Paths never collected, whatever a pattern asks for (matched on the path as
#: named and on the path it resolves to).
DENIED = (
    "/proc/*/environ",
    "/proc/*/task/*/environ",
    "/proc/*/mem",
    "/proc/*/task/*/mem",
    "/proc/*/cmdline",
    "/proc/*/task/*/cmdline",
    "/proc/kcore",
    "/proc/kmsg",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/etc/shadow*",
    "/etc/gshadow*",
    "/etc/ssh/*key*",
    "*/.ssh/*",
    "*.key",
    "*.pem",
)


# One regex for all of them: denied() runs for every path component walked.
_DENIED = re.compile("|".join(fnmatch.translate(pattern) for pattern in DENIED))


def denied(path: str) -> bool:
    """Return whether a path is one that is never collected."""
    return _DENIED.match(path) is not None


def _has_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class HostFiles:
    """This machine's own files, from its ``/``."""

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def listdir(self, path: str) -> List[str]:
        return os.listdir(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)

    def read(self, path: str, cap: int) -> Optional[bytes]:
        # Read until EOF or the cap: sysfs sizes are not real sizes, and a /proc
        # seq file may answer one read() with part of its text.
        chunks = []  # type: List[bytes]
        size = 0
        try:
            with open(path, "rb", buffering=0) as handle:
                while size < cap:
                    chunk = handle.read(cap - size)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except OSError:
            return None  # unreadable (EACCES, EIO on a write-only attribute): skip it
        return b"".join(chunks)


class TreeFiles:
    """A sysroot directory's files, every path opened inside it (see ``treeio.Tree``):
    the tree may belong to someone else and change while it is read."""

    def __init__(self, root: str) -> None:
        self.tree = Tree(root)

    def lstat(self, path: str) -> os.stat_result:
        st = self.tree.lstat(path)
        if st is None:
            raise OSError(2, "no such file", path)
        return st

    def readlink(self, path: str) -> str:
        return os.fsdecode(self.tree.readlink(path))

    def listdir(self, path: str) -> List[str]:
        return [os.fsdecode(n) for n in self.tree.listdir(path, follow=True)]

    def isdir(self, path: str) -> bool:
        st = self.tree.stat(path)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def lexists(self, path: str) -> bool:
        return self.tree.lstat(path) is not None

    def read(self, path: str, cap: int) -> Optional[bytes]:
        try:
            return self.tree.read(path, cap)
        except OSError:
            return None  # unreadable, or no longer a regular file: skip it


def files_of(root: str) -> "HostFiles | TreeFiles":
    """Return how to reach the files: this machine's own, or a sysroot directory's."""
    return TreeFiles(root) if root else HostFiles()


def expand(pattern: str, root: str = "", files: "Optional[HostFiles | TreeFiles]" = None
           ) -> List[str]:
    """Return the paths matching an absolute shell pattern, as the Host seam's glob does.

    With ``root`` (a sysroot directory), the pattern is matched below it and the
    paths returned are the sysroot's own (``/etc/...``, not ``ROOT/etc/...``).
    """
    fs = files if files is not None else files_of(root)
    parts = [p for p in pattern.split("/") if p and p != "."]
    found = ["/"]
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        following = []  # type: List[str]
        for base in found:
            if _has_magic(part):
                try:
                    names = fs.listdir(base)
                except OSError:
                    continue
                matches = [n for n in names if fnmatch.fnmatchcase(n, part)]
                if not part.startswith("."):
                    matches = [n for n in matches if not n.startswith(".")]
                following.extend(_join(base, n) for n in sorted(matches))
            else:
                candidate = _join(base, part)
                if last or fs.isdir(candidate):
                    following.append(candidate)
        found = following
    return [p for p in found if fs.lexists(p)]


# -- the GPU state: commands whose output is kept as virtual files -----------------------------

#: The virtual directory of the GPU state (auditor.hosts.gpustate): on a host's own ``/`` a
#: pattern below it runs what makes the file instead of reading one; in a sysroot it is read.
GPU_STATE_DIR = "/host-auditor"
SMI_XML = GPU_STATE_DIR + "/nvidia-smi.xml"
SMI_STATUS = GPU_STATE_DIR + "/nvidia-smi.status"
KMSG = GPU_STATE_DIR + "/kmsg"
SMI_CAP = 8 << 20
SMI_DEADLINE = 10.0
_KMSG_LIMIT = 16 << 20
_KMSG_LINES = 2000


def _status(kind, value, output=b""):
    # type: (str, float, bytes) -> bytes
    return ("%s %g\n" % (kind, value)).encode("ascii") + output[:4096]


def _which(name):
    # type: (str) -> Optional[str]
    directories = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    directories.extend(("/usr/bin", "/usr/sbin", "/bin", "/sbin"))
    for directory in directories:
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_smi(deadline=SMI_DEADLINE, cap=SMI_CAP):
    # type: (float, int) -> Dict[str, bytes]
    """Run ``nvidia-smi -q -x`` within ``deadline`` seconds; return the virtual files.

    The whole process group is killed at the deadline; one that cannot die (blocked on a
    wedged GPU) is left behind, not waited for.
    """
    import signal
    import subprocess

    found = _which("nvidia-smi")
    if found is None:
        return {SMI_STATUS: _status("exit", 127, b"nvidia-smi: command not found\n")}
    try:
        proc = subprocess.Popen([found, "-q", "-x"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return {SMI_STATUS: _status("exit", 126, str(exc).encode("utf-8", "replace"))}
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        return {SMI_STATUS: _status("timeout", deadline)}
    out = out[:cap]
    start = out.find(b"<?xml")
    files = {}  # type: Dict[str, bytes]
    if start >= 0:
        files[SMI_XML] = out[start:]
    # What it said besides the XML (a GPU it could not open), or all of it on failure.
    said = (out[:start] if start >= 0 else out) + err[-4096:]
    files[SMI_STATUS] = _status("exit", proc.returncode, said)
    return files


def _nvidia_lines(data):
    # type: (bytes) -> bytes
    kept = [line[:1024] for line in data.split(b"\n")
            if b"NVRM" in line or b"fallen off the bus" in line][-_KMSG_LINES:]
    return b"\n".join(kept) + (b"\n" if kept else b"")


def read_journal(deadline=5.0, limit=_KMSG_LIMIT):
    # type: (float, int) -> Optional[bytes]
    """Return this boot's kernel messages from the journal, NVIDIA lines only, or None.

    ``journalctl -k -b`` reads the journal where ``/dev/kmsg`` is closed to the user (not
    root, ``kernel.dmesg_restrict=1``) but the journal is open to them (the adm or
    systemd-journal group). Its ``short-monotonic`` lines carry seconds since boot.
    """
    import signal
    import subprocess

    found = _which("journalctl")
    if found is None:
        return None
    try:
        proc = subprocess.Popen([found, "-k", "-b", "--no-pager", "-q", "-o", "short-monotonic"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        return None
    if proc.returncode != 0 or not out:
        return None
    return _nvidia_lines(out[-limit:])


def read_kmsg(path="/dev/kmsg", limit=_KMSG_LIMIT):
    # type: (str, int) -> Optional[bytes]
    """Return the kernel log's NVIDIA lines (``/dev/kmsg`` records, else the journal's), or
    None where neither can be read."""
    import errno

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return read_journal(limit=limit)
    kept = []  # type: List[bytes]
    total = 0
    try:
        while total < limit:
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while read: go on with the next
                    continue
                break
            if not record:
                break
            total += len(record)
            if b"NVRM" in record or b"fallen off the bus" in record:
                kept.append(record.rstrip(b"\n")[:1024])
                del kept[:-_KMSG_LINES]
    finally:
        os.close(fd)
    return b"\n".join(kept) + (b"\n" if kept else b"")


class Collector:
    """Write entries into a tar stream, each path once, parents before children.

    Paths are the host's (or, with ``root``, the sysroot's): a symlink's absolute
    target is followed inside the root, as a chroot would.
    """

    def __init__(self, out: BinaryIO, cap: int = FILE_CAP, root: str = "") -> None:
        self.cap = cap
        self.root = root
        self.files = files_of(root)
        self.tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
        self.seen = set()  # type: Set[str]
        # Directories and links met on the way to a path, with their lstat (and link
        # target): the patterns share most of their components, walked once each.
        self.walked = {}  # type: Dict[str, Tuple[os.stat_result, Optional[str]]]

    def close(self) -> None:
        """Finish the tar stream (the caller closes the file object)."""
        self.tar.close()

    def _info(self, path: str, st: os.stat_result) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        return info

    def _add(self, path: str, st: os.stat_result, link: Optional[str] = None) -> None:
        if path in self.seen or path == "/":
            return
        mode = st.st_mode
        info = self._info(path, st)
        data = None  # type: Optional[bytes]
        if link is not None:
            info.type = tarfile.SYMTYPE
            info.linkname = link
        elif stat.S_ISDIR(mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
            info.devmajor = os.major(st.st_rdev)
            info.devminor = os.minor(st.st_rdev)
        elif stat.S_ISREG(mode):
            data = self.files.read(path, self.cap)
            if data is None:
                return
            info.size = len(data)
        else:
            return  # FIFOs and sockets: reading could block, and no check reads them
        self.seen.add(path)
        self.tar.addfile(info, io.BytesIO(data) if data is not None else None)

    def add_path(self, path: str) -> None:
        """Record ``path``: every symlink and directory on the way, then what it names."""
        pending = collections.deque(p for p in path.split("/") if p)
        resolved = ""
        hops = 0
        while pending:
            part = pending.popleft()
            if part == ".":
                continue
            if part == "..":
                resolved = resolved.rsplit("/", 1)[0]
                continue
            candidate = resolved + "/" + part
            if denied(candidate):
                return
            walked = self.walked.get(candidate)
            if walked is None:
                try:
                    st = self.files.lstat(candidate)
                    target = None  # type: Optional[str]
                    if stat.S_ISLNK(st.st_mode):
                        target = self.files.readlink(candidate)
                except OSError:
                    return
                if target is not None or stat.S_ISDIR(st.st_mode):
                    self.walked[candidate] = (st, target)
            else:
                st, target = walked
            if target is not None:
                self._add(candidate, st, link=target)
                hops += 1
                if hops > _MAX_LINKS:
                    return
                if target.startswith("/"):
                    resolved = ""
                parts = [p for p in target.split("/") if p]
                if len(parts) + len(pending) > _MAX_PARTS:
                    return  # longer than any path the kernel resolves (PATH_MAX)
                pending.extendleft(reversed(parts))
                continue
            if pending and not stat.S_ISDIR(st.st_mode):
                return
            self._add(candidate, st)
            resolved = candidate

    def add_bytes(self, path: str, data: bytes) -> None:
        """Record a file made here (the GPU state's virtual files)."""
        if path in self.seen:
            return
        info = tarfile.TarInfo(path.lstrip("/"))
        info.mode = 0o644
        info.size = len(data)
        self.seen.add(path)
        self.tar.addfile(info, io.BytesIO(data))

    def add_virtual(self, pattern: str) -> None:
        """Run what makes a virtual GPU-state file (this machine's own ``/`` only)."""
        made = {}  # type: Dict[str, bytes]
        if pattern in (SMI_XML, SMI_STATUS):
            if SMI_STATUS not in self.seen:
                made = run_smi()
        elif pattern == KMSG:
            kmsg = read_kmsg()
            if kmsg is not None:
                made = {KMSG: kmsg}
        for path in sorted(made):
            self.add_bytes(path, made[path])

    def add_pattern(self, pattern: str) -> None:
        """Record every path matching a pattern."""
        if not self.root and (pattern == GPU_STATE_DIR
                              or pattern.startswith(GPU_STATE_DIR + "/")):
            self.add_virtual(pattern)
            return
        for path in expand(pattern, files=self.files):
            if not denied(path):
                self.add_path(path)


def collect_to(out: BinaryIO, patterns: List[str], compress: bool = False,
               cap: int = FILE_CAP, root: str = "",
               extra: Optional[Dict[str, bytes]] = None) -> None:
    """Write the tar (gzip-compressed if asked) of every path the patterns match to ``out``.

    ``root``: a sysroot directory to collect from instead of ``/`` ("" for the host).
    ``extra``: files made by the caller (path -> bytes), written first.
    """
    stream = out
    gz = None
    if compress:
        import gzip  # only when asked: every import costs the audited host CPU

        gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0)
        stream = gz  # type: ignore[assignment]
    collector = Collector(stream, cap, root.rstrip("/"))
    try:
        for path in sorted(extra or {}):
            collector.add_bytes(path, (extra or {})[path])
        for pattern in patterns:
            collector.add_pattern(pattern)
    finally:
        collector.close()
        if gz is not None:
            gz.close()


def main(argv: List[str]) -> int:
    """Collect the patterns in ``argv`` as a tar on stdout: ``[-z] [-r ROOT] PATTERN...``.

    ``-z`` gzips the tar; ``-r ROOT`` collects from the sysroot directory ROOT.
    """
    compress = bool(argv) and argv[0] == "-z"
    if compress:
        argv = argv[1:]
    root = ""
    if len(argv) >= 2 and argv[0] == "-r":
        root, argv = argv[1], argv[2:]
    out = sys.stdout.buffer
    if root and not os.path.isdir(root):
        sys.stderr.write("%s: no such directory\n" % root)
        return 2
    out.write(("python uid=%d\n" % os.geteuid()).encode("ascii"))
    collect_to(out, argv, compress=compress, root=root)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
