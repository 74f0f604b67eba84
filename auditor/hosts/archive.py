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
from auditor.hosts.base import Entry, Host


def _member_path(name: str) -> str:
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

    kind = "sysroot"

    def __init__(self, data: bytes, label: str, name: str | None = None) -> None:
        self.target = f"sysroot:{label}"
        self._data = _decompress(data, label)
        self._entries: dict[str, Entry] = {"/": Entry("dir")}
        self._offsets: dict[str, tuple[int, int]] = {}
        self._hardlinks: dict[str, str] = {}
        self._children: dict[str, set[str]] = {"/": set()}
        try:
            with tarfile.open(fileobj=io.BytesIO(self._data), mode="r:") as archive:
                for member in archive:
                    self._add(member)
        except (tarfile.TarError, EOFError) as exc:
            raise SnapshotError(f"{label}: not a readable tar archive ({exc})") from exc
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

    def _add(self, member: tarfile.TarInfo) -> None:
        path = _member_path(member.name)
        if path == "/":
            return
        self._add_parents(path)
        if member.isdir():
            entry = Entry("dir")
            self._children.setdefault(path, set())
        elif member.issym():
            entry = Entry("link", target=member.linkname)
        elif member.islnk():
            entry = Entry("file")
            self._hardlinks[path] = _member_path(member.linkname)
        elif member.ischr():
            entry = Entry("chr", major=member.devmajor, minor=member.devminor)
        elif member.isblk():
            entry = Entry("blk", major=member.devmajor, minor=member.devminor)
        elif member.isfile():
            entry = Entry("file")
            self._offsets[path] = (member.offset_data, member.size)
        else:
            entry = Entry("other")
        self._entries[path] = entry

    def _add_parents(self, path: str) -> None:
        child = path
        parent = posixpath.dirname(child)
        while True:
            self._children.setdefault(parent, set()).add(posixpath.basename(child))
            if parent in self._entries:
                break
            self._entries[parent] = Entry("dir")
            child, parent = parent, posixpath.dirname(parent)

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
