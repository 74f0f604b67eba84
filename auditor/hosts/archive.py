"""A sysroot captured as a tar archive (``.tar``, ``.tar.gz``), read in place.

Symlinks and device entries are honoured from the archive's headers, so a
capture with ``/dev`` nodes is read without root and without unpacking.
"""

from __future__ import annotations

import gzip
import io
import lzma
import posixpath
import tarfile

from auditor.errors import SnapshotError
from auditor.hosts.base import Entry, Host, HostKind
from auditor.hosts.tarindex import Member, fast_index

#: tarfile's member types that map straight to an entry kind (regular files aside).
_KINDS = (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE)


def _member_path(name: str) -> str:
    if name and name[0] not in "./" and "/." not in name and "//" not in name \
            and name[-1] != "/":
        return "/" + name  # already normal (no ".", "..", doubled or trailing "/")
    name = name.lstrip("/")
    while name.startswith("./"):
        name = name[2:]
    norm = posixpath.normpath("/" + name)
    return norm if norm != "//" else "/"


def _decompress(raw: bytes, label: str) -> bytes:
    try:
        if raw[:2] == b"\x1f\x8b":
            return gzip.decompress(raw)
        if raw[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(raw)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise SnapshotError(f"{label}: not a readable compressed archive ({exc})") from exc
    return raw


class ArchiveHost(Host):
    """A host's files read from a tar archive held in memory."""

    kind: HostKind = "sysroot"

    def __init__(self, data: bytes, label: str, name: str | None = None) -> None:
        self.target = f"sysroot:{label}"
        self._data = _decompress(data, label)
        self._entries: dict[str, Entry] = {"/": Entry("dir")}
        self._offsets: dict[str, tuple[int, int]] = {}
        self._hardlinks: dict[str, str] = {}
        self._children: dict[str, set[str]] = {"/": set()}
        members = fast_index(self._data)
        if members is None:
            members = self._tarfile_members(label)
        for member in members:
            self._add(member)
        self.name = name or self.read_optional("/etc/hostname") or posixpath.basename(label)

    @classmethod
    def from_path(cls, path: str) -> ArchiveHost:
        """Open a capture file."""
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot read capture ({exc.strerror})") from exc
        return cls(data, path)

    def _tarfile_members(self, label: str) -> list[Member]:
        """Index the archive with tarfile: every case the fast reader leaves to it."""
        members: list[Member] = []
        try:
            with tarfile.open(fileobj=io.BytesIO(self._data), mode="r:") as archive:
                for info in archive:
                    if info.isreg():
                        kind = 0x30
                    elif info.type in _KINDS:
                        kind = info.type[0]
                    else:
                        kind = 0x36  # a FIFO or a type tarfile does not know: "other"
                    members.append(Member(info.name, kind, info.linkname, info.offset_data,
                                          info.size, info.devmajor, info.devminor))
        except (tarfile.TarError, EOFError) as exc:
            raise SnapshotError(f"{label}: not a readable tar archive ({exc})") from exc
        return members

    def _add(self, member: Member) -> None:
        path = _member_path(member.name)
        if path == "/":
            return
        self._add_parents(path)
        kind = member.type
        if kind == 0x35:  # "5"
            entry = Entry("dir")
            self._children.setdefault(path, set())
        elif kind == 0x32:  # "2"
            entry = Entry("link", target=member.linkname)
        elif kind == 0x31:  # "1"
            entry = Entry("file")
            self._hardlinks[path] = _member_path(member.linkname)
        elif kind == 0x33:  # "3"
            entry = Entry("chr", major=member.devmajor, minor=member.devminor)
        elif kind == 0x34:  # "4"
            entry = Entry("blk", major=member.devmajor, minor=member.devminor)
        elif kind in (0x30, 0x37, 0):  # "0", "7" and the old "\0"
            entry = Entry("file")
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
            parent, _, name = parent.rpartition("/")

    def lstat(self, path: str) -> Entry | None:
        return self._entries.get(path)

    def _read_resolved(self, path: str, limit: int) -> bytes:
        path = self._hardlinks.get(path, path)
        try:
            offset, size = self._offsets[path]
        except KeyError:
            raise OSError(f"{path}: not a regular file") from None
        return self._data[offset : offset + min(size, limit)]

    def _listdir_resolved(self, path: str) -> list[str]:
        return list(self._children.get(path, ()))

    def members(self) -> list[str]:
        """Return every path the archive holds."""
        return sorted(self._entries)
