"""The host seam: the one small protocol every way of reaching a machine implements.

Checks read a host only through :class:`Host`. Paths are absolute paths as they
are on the audited machine (``/proc/devices``), whatever the transport.
"""

from __future__ import annotations

import fnmatch
import posixpath
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

from auditor.text import printable

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Entry", "Host", "Names", "ScriptResult", "clean_host_name", "printable"]

EntryKind = Literal["file", "dir", "link", "chr", "blk", "other"]
#: ``local``: the machine this runs on; ``ssh``: a remote machine's own ``/``;
#: ``sysroot``: a tree of a host's files (a directory, a capture, a directory on a
#: remote machine), not a booted system.
HostKind = Literal["local", "ssh", "sysroot"]

_MAX_LINKS = 40
#: The most components a path may have while it is resolved (PATH_MAX is 4096 bytes).
MAX_PATH_PARTS = 4096
#: The longest host name kept (a DNS name's limit).
MAX_HOST_NAME = 253
T = TypeVar("T")


class Names:
    """File names turned into text once, where a backend meets them.

    A Linux file name is any bytes but NUL and ``/``. One that is not UTF-8 becomes
    text with each stray byte written ``\\xNN`` (Python's ``backslashreplace``), so
    reports, JSON and Prometheus labels are valid text; the backend keeps the raw bytes
    of every name it escaped, to reach the file again.

    The text of each name is unique: a name that is UTF-8 and already reads ``\\xNN``
    (``50-\\xff.conf``, so written on disk) and one whose byte 0xff is escaped to the
    same text are two files, and stay two. Whichever of them is met second has its
    backslashes doubled until its text is free (``50-\\\\xff.conf``), and is reached
    through its raw bytes like any escaped name.
    """

    def __init__(self) -> None:
        self._raw: dict[str, bytes] = {}
        #: UTF-8 names holding a backslash that are their own text (an escape must not be).
        self._plain: set[str] = set()

    def text(self, raw: bytes) -> str:
        """Return one name (or a path, each name in it made text) as text."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if b"/" in raw:
                return "/".join(self.text(part) for part in raw.split(b"/"))
            return self._unique(raw.decode("utf-8", "backslashreplace"), raw)
        if "\\" not in text:
            return text
        if "/" in text:
            return "/".join(self.text(part) for part in raw.split(b"/"))
        known = self._raw.get(text)
        if known is None or known == raw:
            if known is None:
                self._plain.add(text)
            return text
        return self._unique(text, raw)  # an escaped name took this text first

    def _unique(self, text: str, raw: bytes) -> str:
        """Return ``text`` for ``raw``, its backslashes doubled while another name holds it."""
        while True:
            known = self._raw.get(text)
            if known == raw:
                return text
            if known is None and text not in self._plain:
                self._raw[text] = raw
                return text
            text = text.replace("\\", "\\\\")

    def from_os(self, name: str) -> str:
        """Return a name Python decoded with ``surrogateescape`` (``os.listdir``) as text."""
        if name.isascii() and "\\" not in name:
            return name
        return self.text(name.encode("utf-8", "surrogateescape"))

    def raw(self, path: str) -> bytes:
        """Return the bytes of a path whose names came from :meth:`text`."""
        if not self._raw:
            return path.encode("utf-8", "surrogateescape")
        return b"/".join(self._raw.get(part) or part.encode("utf-8", "surrogateescape")
                         for part in path.split("/"))

    def escaped(self, path: str) -> bool:
        """Return whether a path holds a name that is not UTF-8 on the host."""
        return bool(self._raw) and any(part in self._raw for part in path.split("/"))


def clean_host_name(text: str | None) -> str:
    """Return a host name read from the host as one printable token (or "")."""
    if not text:
        return ""
    # Only the first line and word count: /etc/hostname may hold anything, and a
    # capture's may be a megabyte of it.
    words = text[:4096].split(maxsplit=1)
    first = words[0] if words else ""
    return "".join(c for c in first if c.isprintable())[:MAX_HOST_NAME]


@dataclass(frozen=True)
class ScriptResult:
    """What running a script on a host returned: its exit status and its output."""

    returncode: int
    output: str


@dataclass(frozen=True)
class Entry:
    """What one path is, without following a final symlink."""

    kind: EntryKind
    target: str = ""
    major: int = -1
    minor: int = -1
    #: Last modification, seconds since the epoch; None where the transport did not carry
    #: it (the sh collector, a snapshot, a synthesized entry). Not part of equality.
    mtime: float | None = field(default=None, compare=False)


class Host(ABC):
    """Read-only access to one machine's files, the same for every transport."""

    #: Short name used in reports (a hostname, an address, a capture's hostname).
    name: str
    #: What was asked for: ``local``, ``ssh://user@host:22``, ``sysroot:/path``.
    target: str
    kind: HostKind
    #: Whether a read can block for long (a live kernel's files): the runner then runs
    #: checks in parallel, so one stuck read holds no other check up.
    blocking_reads: bool = False
    #: The sysroot directory a fix changes (on the machine that runs the fix), or None
    #: for a booted machine and for a capture, which cannot be changed in place.
    root: str | None = None
    #: Why files only root may read are missing, in a few words ("" when they are not,
    #: or it is not known): a check that skips for want of root says it.
    privilege_note: str = ""

    # -- primitives a backend provides -------------------------------------------------

    @abstractmethod
    def lstat(self, path: str) -> Entry | None:
        """Return what ``path`` is (a symlink is not followed), or None if missing."""

    @abstractmethod
    def _read_resolved(self, path: str, limit: int) -> bytes:
        """Read a file at a path with no symlinks in it."""

    @abstractmethod
    def _listdir_resolved(self, path: str) -> list[str]:
        """List a directory at a path with no symlinks in it."""

    # -- derived operations ------------------------------------------------------------

    @property
    def names(self) -> Names:
        """Return how this host turned its file names into text (see :class:`Names`)."""
        names: Names | None = self.__dict__.get("_names")
        if names is None:
            names = self.__dict__.setdefault("_names", Names())
        return names

    def fact(self, key: str, compute: Callable[[Host], T]) -> T:
        """Return a fact about the host, computed once and shared by every check of an audit.

        Checks run in parallel: two may compute the same fact at once, which is harmless
        (a fact is a pure function of the host's files); the first stored wins.
        """
        facts: dict[str, object] = self.__dict__.setdefault("_facts", {})
        if key in facts:
            return facts[key]  # type: ignore[return-value]
        return facts.setdefault(key, compute(self))  # type: ignore[return-value]

    def forget(self) -> None:
        """Drop what was learned about the host's files (they were read again: a re-audit)."""
        self.__dict__.pop("_facts", None)
        self.__dict__.pop("_resolved_dirs", None)

    def processes(self) -> frozenset[str] | None:
        """Return the names of running processes, or None where they cannot be seen."""
        return None

    def run_script(self, script: str, *, sudo: bool = False) -> ScriptResult:
        """Run a bash script where the host is (the fix), return its status and output.

        A capability: only hosts that can be changed (this machine, a sysroot directory,
        a remote host over its open connection) have it.
        """
        from auditor.errors import UsageError

        raise UsageError(f"{self.target}: cannot run a fix here: a capture cannot be changed "
                         "in place; unpack it (tar -xzf) and pass the directory to --root")

    def resolve(self, path: str) -> str:
        """Return ``path`` with every symlink followed, never leaving the host's root."""
        norm = _normalise(path)
        parent, _, name = norm.rpartition("/")
        if name in ("", ".", ".."):
            return self._walk(norm)
        # Checks read many files of one directory: resolve each directory once.
        cache: dict[str, str] = self.__dict__.setdefault("_resolved_dirs", {})
        resolved_parent = cache.get(parent)
        if resolved_parent is None:
            resolved_parent = self._walk(parent or "/")
            cache[parent] = resolved_parent
        candidate = resolved_parent.rstrip("/") + "/" + name
        entry = self.lstat(candidate)
        if entry is not None and entry.kind == "link":
            return self._walk(candidate)
        return candidate

    def _walk(self, path: str) -> str:
        """Follow every symlink in ``path`` component by component, clamped at the root."""
        pending = deque(p for p in _normalise(path).split("/") if p)
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.popleft()
            if part == ".":
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/" + "/".join([*resolved, part])
            entry = self.lstat(candidate)
            if entry is not None and entry.kind == "link":
                hops += 1
                if hops > _MAX_LINKS:
                    raise OSError(f"too many levels of symbolic links: {path}")
                target = entry.target
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p]
                # A link's target is bounded as the kernel bounds a path (PATH_MAX is 4096
                # bytes): a hostile one of a million components must not cost minutes.
                if len(parts) + len(pending) > MAX_PATH_PARTS:
                    raise OSError(f"file name too long: {path[:200]}")
                pending.extendleft(reversed(parts))
                continue
            resolved.append(part)
        return "/" + "/".join(resolved)

    def stat(self, path: str) -> Entry | None:
        """Return what ``path`` is after following symlinks, or None if missing."""
        try:
            return self.lstat(self.resolve(path))
        except OSError:
            return None

    def mtime(self, path: str) -> float | None:
        """Return when ``path`` was last modified (following symlinks), None if not known."""
        entry = self.stat(path)
        return None if entry is None else entry.mtime

    def exists(self, path: str) -> bool:
        """Return whether ``path`` exists (following symlinks)."""
        return self.stat(path) is not None

    def is_dir(self, path: str) -> bool:
        """Return whether ``path`` is a directory (following symlinks)."""
        entry = self.stat(path)
        return entry is not None and entry.kind == "dir"

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        """Read at most ``limit`` bytes of a file; raise FileNotFoundError if missing."""
        resolved = self.resolve(path)
        entry = self.lstat(resolved)
        if entry is None:
            raise FileNotFoundError(path)
        if entry.kind == "dir":
            raise IsADirectoryError(path)
        if entry.kind != "file" and self.kind != "local":
            # A sysroot's or a remote host's device node or FIFO is never read as a file:
            # it could be the operator's disk, or block forever. (The live machine reads
            # its own devices, such as /dev/cpu_dma_latency, as before.)
            raise OSError(f"{path}: not a regular file")
        return self._read_resolved(resolved, limit)

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Read a text file, decoding bytes that are not UTF-8 as replacement characters."""
        return self.read_bytes(path, limit).decode("utf-8", "replace")

    def read_optional(self, path: str) -> str | None:
        """Return the stripped text of a file, or None if it is missing or unreadable."""
        try:
            return self.read_bytes(path).decode("utf-8", "replace").strip()
        except OSError:
            return None

    def listdir(self, path: str) -> list[str]:
        """Return the sorted names in a directory; raise FileNotFoundError if missing."""
        resolved = self.resolve(path)
        entry = self.lstat(resolved)
        if entry is None:
            raise FileNotFoundError(path)
        if entry.kind != "dir":
            raise NotADirectoryError(path)
        return sorted(self._listdir_resolved(resolved))

    def readlink(self, path: str) -> str | None:
        """Return a symlink's target, or None if ``path`` is not a symlink."""
        norm = _normalise(path)
        try:
            parent = self.resolve(posixpath.dirname(norm))
            entry = self.lstat(posixpath.join(parent, posixpath.basename(norm)))
        except OSError:
            return None
        return entry.target if entry is not None and entry.kind == "link" else None

    def device_numbers(self, path: str) -> tuple[int, int] | None:
        """Return (major, minor) of a character or block device node, else None."""
        entry = self.stat(path)
        if entry is None or entry.kind not in ("chr", "blk"):
            return None
        return entry.major, entry.minor

    def glob(self, pattern: str) -> list[str]:
        """Return the sorted paths matching a shell pattern (``*``, ``?``, ``[...]``)."""
        parts = [p for p in _normalise(pattern).split("/") if p]
        found = ["/"]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            following: list[str] = []
            for base in found:
                if _has_magic(part):
                    try:
                        names = self.listdir(base)
                    except OSError:
                        continue
                    matches = [n for n in names if fnmatch.fnmatchcase(n, part)]
                    if not part.startswith("."):
                        matches = [n for n in matches if not n.startswith(".")]
                    following.extend(posixpath.join(base, n) for n in matches)
                else:
                    candidate = posixpath.join(base, part)
                    if last or self.is_dir(candidate):
                        following.append(candidate)
            found = following
        return sorted(p for p in found if self.lstat_follow_ok(p))

    def lstat_follow_ok(self, path: str) -> bool:
        """Return whether ``path`` exists, as either a live entry or a dangling symlink."""
        return self.exists(path) or self.readlink(path) is not None

    def close(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release what the host holds (connections, open archives)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def _normalise(path: str) -> str:
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path) if ".." not in path else path
