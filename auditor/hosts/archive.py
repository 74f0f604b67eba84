"""A sysroot captured as a tar archive (``.tar``, ``.tar.gz``), read in place.

Symlinks and device entries are honoured from the archive's headers, so a
capture with ``/dev`` nodes is read without root and without unpacking.
"""

from __future__ import annotations

import io
import lzma
import os
import posixpath
import stat
import tarfile
import time
import zlib
from collections.abc import Callable, Collection

from auditor.errors import AuditorError, SnapshotError
from auditor.hosts.base import Entry, Host, HostKind, Names, clean_host_name
from auditor.hosts.tarindex import Member, TooManyMembers, fast_index

#: tarfile's member types that map straight to an entry kind (regular files aside).
_KINDS = (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE)
#: The most bytes a capture may hold once decompressed (a real one is 20 KB to a few MB;
#: a snapshot of a 512-CPU host about 20 MB).
MAX_ARCHIVE = 64 << 20
#: The most members a capture may hold (a 128-CPU host's collection has about 4,500; a host
#: running 30,000 processes adds 60,000 for their /proc entries).
MAX_MEMBERS = 100_000
#: The most entries (members and the directories their names imply) and bytes of their
#: names an archive may make.
MAX_ENTRIES = 2 * MAX_MEMBERS
MAX_NAME_BYTES = 64 << 20
#: The longest member name or link target taken (Linux's PATH_MAX).
MAX_PATH = 4096
#: The most compressed streams one capture may chain (gzip and xz allow several).
MAX_STREAMS = 16
COMPRESSIONS = frozenset({"gzip", "xz", "none"})


def compression_of(raw: bytes | bytearray) -> str:
    """Return how a capture is compressed, by its magic bytes: gzip, xz or none."""
    if raw[:2] == b"\x1f\x8b":
        return "gzip"
    if raw[:6] == b"\xfd7zXZ\x00":
        return "xz"
    return "none"


def _member_path(name: str, names: Names | None = None) -> str:
    if names is not None and (not name.isascii() or "\\" in name):
        # A name that is not UTF-8 arrives surrogate-escaped: make it the host's text once
        # (one with a backslash too: its text must not be another name's escape).
        name = names.text(name.encode("utf-8", "surrogateescape"))
    if name and name[0] not in "./" and "/." not in name and "//" not in name \
            and name[-1] != "/":
        return "/" + name  # already normal (no ".", "..", doubled or trailing "/")
    name = name.lstrip("/")
    while name.startswith("./"):
        name = name[2:]
    norm = posixpath.normpath("/" + name)
    return norm if norm != "//" else "/"


def decompress(raw: bytes | bytearray, label: str, *, allowed: Collection[str] = COMPRESSIONS,
               cap: int = MAX_ARCHIVE, error: type[AuditorError] = SnapshotError
               ) -> bytes | bytearray:
    """Return a capture's tar bytes, decompressing incrementally: never more than ``cap``.

    A compression not in ``allowed`` is refused (an SSH answer is compressed only when
    asked to be), as is a capture that would expand past ``cap`` bytes or chains more
    than a few compressed streams.
    """
    kind = compression_of(raw)
    if kind not in allowed:
        raise error(f"{label}: the answer is {kind}-compressed, which was not asked for")
    if kind == "none":
        if len(raw) > cap:
            raise error(f"{label}: the archive is larger than {cap >> 20} MiB")
        return raw
    # One buffer grown in place: the archive is never held twice (a list of chunks joined
    # at the end would be).
    out = bytearray()
    data = raw
    streams = 0
    try:
        while data:
            streams += 1
            if streams > MAX_STREAMS:
                raise error(f"{label}: more than {MAX_STREAMS} compressed streams in one archive")
            inflater: zlib._Decompress | lzma.LZMADecompressor = (
                zlib.decompressobj(16 + zlib.MAX_WBITS) if kind == "gzip"
                else lzma.LZMADecompressor(format=lzma.FORMAT_XZ))
            pending = data
            while True:
                chunk = inflater.decompress(pending, min(cap + 1 - len(out), 1 << 20))
                pending = getattr(inflater, "unconsumed_tail", b"")
                out += chunk
                if len(out) > cap:
                    raise error(f"{label}: the archive expands past {cap >> 20} MiB: refused")
                if inflater.eof:
                    break
                if not chunk and not pending and getattr(inflater, "needs_input", True):
                    raise error(f"{label}: not a readable compressed archive (truncated)")
            data = inflater.unused_data
            if not data.strip(b"\0"):
                break  # the zero blocks a tar writer may pad a compressed archive with
    except (zlib.error, lzma.LZMAError, EOFError) as exc:
        raise error(f"{label}: not a readable compressed archive ({exc})") from exc
    return out


class ArchiveHost(Host):
    """A host's files read from a tar archive held in memory."""

    kind: HostKind = "sysroot"
    _deadline: float | None = None
    _error: type[AuditorError] = SnapshotError
    _name_bytes = 0

    def __init__(self, data: bytes | bytearray, label: str, name: str | None = None, *,
                 allowed: Collection[str] = COMPRESSIONS, cap: int = MAX_ARCHIVE,
                 max_members: int = MAX_MEMBERS, deadline: float | None = None,
                 error: type[AuditorError] = SnapshotError,
                 skip: Callable[[str], bool] | None = None) -> None:
        """Index a capture; ``deadline`` (``time.monotonic()``) bounds the work, ``error`` is
        the error class for what cannot be read (SnapshotError: a bad file named by hand);
        members whose path ``skip`` returns True for are left out (an SSH answer holding
        what the collector never collects)."""
        self.target = f"sysroot:{label}"
        self._error = error
        self._deadline = deadline
        self._data = decompress(data, label, allowed=allowed, cap=cap, error=error)
        del data
        self._entries: dict[str, Entry] = {"/": Entry("dir")}
        self._offsets: dict[str, tuple[int, int]] = {}
        self._hardlinks: dict[str, str] = {}
        self._children: dict[str, set[str]] = {"/": set()}
        self._check_time(label)
        try:
            members = fast_index(self._data, max_members)
        except TooManyMembers:
            raise error(f"{label}: more than {max_members} members in the archive") from None
        if members is None:
            members = self._tarfile_members(label, max_members)
        names = self.names
        for index, member in enumerate(members):
            if not index & 0x3FF:
                self._check_time(label)
            self._add(member, names, skip)
        self.name = name or clean_host_name(self.read_optional("/etc/hostname")) \
            or posixpath.basename(label)

    def _check_time(self, label: str) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise self._error(f"{label}: timed out reading the collection")

    @classmethod
    def from_path(cls, path: str, *, cap: int = MAX_ARCHIVE) -> ArchiveHost:
        """Open a capture file (a regular file: a FIFO or device is refused, never opened)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot read capture ({exc.strerror})") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SnapshotError(f"{path}: not a regular file")
            if st.st_size > cap:
                raise SnapshotError(f"{path}: larger than {cap >> 20} MiB")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(cap + 1)
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot read capture ({exc.strerror})") from exc
        finally:
            os.close(fd)
        return cls(data, path, cap=cap)

    def _tarfile_members(self, label: str, max_members: int = MAX_MEMBERS) -> list[Member]:
        """Index the archive with tarfile: every case the fast reader leaves to it."""
        members: list[Member] = []
        try:
            with tarfile.open(fileobj=io.BytesIO(self._data), mode="r:") as archive:
                for info in archive:
                    if len(members) >= max_members:
                        raise self._error(f"{label}: more than {max_members} members in the "
                                          "archive")
                    if not len(members) & 0x3FF:
                        self._check_time(label)
                    archive.members.clear()  # type: ignore[attr-defined] # kept otherwise
                    if info.isreg():
                        kind = 0x30
                    elif info.type in _KINDS:
                        kind = info.type[0]
                    else:
                        kind = 0x36  # a FIFO or a type tarfile does not know: "other"
                    members.append(Member(info.name, kind, info.linkname, info.offset_data,
                                          info.size, info.devmajor, info.devminor,
                                          _seconds(info.mtime)))
        except (tarfile.TarError, EOFError, ValueError, OverflowError) as exc:
            raise self._error(f"{label}: not a readable tar archive ({exc})") from exc
        return members

    def _add(self, member: Member, names: Names,
             skip: Callable[[str], bool] | None = None) -> None:
        if len(member.name) > MAX_PATH or len(member.linkname) > MAX_PATH:
            # No path on a host is longer (PATH_MAX), and the directories a name implies
            # grow with the square of its depth: such a member is not a host's file.
            return
        path = _member_path(member.name, names)
        if path == "/" or (skip is not None and skip(path)):
            return
        self._add_parents(path)
        kind = member.type
        # A writer that keeps no times (a snapshot, the sh collector) writes 0: not known.
        mtime = float(member.mtime) if member.mtime > 0 else None
        if kind == 0x35:  # "5"
            entry = Entry("dir", mtime=mtime)
            self._children.setdefault(path, set())
        elif kind == 0x32:  # "2"
            linkname = member.linkname
            if not linkname.isascii() or "\\" in linkname:
                linkname = names.text(linkname.encode("utf-8", "surrogateescape"))
            entry = Entry("link", target=linkname)
        elif kind == 0x31:  # "1"
            entry = Entry("file")
            self._hardlinks[path] = _member_path(member.linkname, names)
        elif kind == 0x33:  # "3"
            entry = Entry("chr", major=member.devmajor, minor=member.devminor)
        elif kind == 0x34:  # "4"
            entry = Entry("blk", major=member.devmajor, minor=member.devminor)
        elif kind in (0x30, 0x37, 0):  # "0", "7" and the old "\0"
            entry = Entry("file", mtime=mtime)
            self._offsets[path] = (member.offset_data, member.size)
        else:
            entry = Entry("other")
        self._entries[path] = entry

    def _add_parents(self, path: str) -> None:
        # path is normal and absolute: rpartition is dirname and basename, and cheaper.
        parent, _, name = path.rpartition("/")
        while True:
            parent = parent or "/"
            self._children.setdefault(parent, set()).add(name)
            if parent in self._entries:
                break
            self._entries[parent] = Entry("dir")
            self._name_bytes += len(parent)
            if len(self._entries) > MAX_ENTRIES or self._name_bytes > MAX_NAME_BYTES:
                raise self._error(f"{self.target[len('sysroot:'):]}: the archive's names imply "
                                  f"more than {MAX_ENTRIES} entries or {MAX_NAME_BYTES >> 20} "
                                  "MiB of names")
            parent, _, name = parent.rpartition("/")

    def lstat(self, path: str) -> Entry | None:
        return self._entries.get(path)

    def _read_resolved(self, path: str, limit: int) -> bytes:
        # One hop only: a hard link to a hard link is not followed (no loops).
        path = self._hardlinks.get(path, path)
        try:
            offset, size = self._offsets[path]
        except KeyError:
            raise OSError(f"{path}: not a regular file") from None
        return bytes(self._data[offset : offset + min(size, limit)])

    def _listdir_resolved(self, path: str) -> list[str]:
        return list(self._children.get(path, ()))

    @property
    def size(self) -> int:
        """Return the bytes of the uncompressed archive held."""
        return len(self._data)

    @property
    def entry_count(self) -> int:
        """Return how many paths the archive holds (with the directories it implies)."""
        return len(self._entries)

    def members(self) -> list[str]:
        """Return every path the archive holds."""
        return sorted(self._entries)


def _seconds(mtime: float) -> int:
    """Return a member's time in whole seconds; 0 (not known) for one that is not a time."""
    try:
        return max(0, int(mtime))
    except (ValueError, OverflowError):
        return 0
