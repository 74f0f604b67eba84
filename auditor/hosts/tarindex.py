"""Index a tar held in memory quickly: member names, kinds, links and data offsets.

:mod:`tarfile` builds a ``TarInfo`` per member with a dozen parsed fields; an
SSH audit of a fleet spends most of its client CPU there (a collection holds
several hundred members). :func:`fast_index` reads only what
:class:`auditor.hosts.archive.ArchiveHost` needs, straight from the headers.

It takes the plain case only: ustar headers with octal numbers and valid
checksums, and pax extended headers carrying ``path``, ``linkpath``, ``size``
and the time / owner keys. For anything else (GNU long names, sparse files,
global pax headers, base-256 numbers, a bad or truncated header, data past the
end) it returns None and the caller reads the archive with :mod:`tarfile`, so
every edge case keeps tarfile's behaviour. The data is untrusted: nothing here
raises on garbage.
"""

from __future__ import annotations

import re
import zlib
from typing import NamedTuple

BLOCK = 512
#: The member types indexed here; a type outside these sends the archive to tarfile.
_TYPES = frozenset(b"01234567\0")
#: pax keys that change nothing ArchiveHost keeps (besides path, linkpath, size).
_PAX_IGNORED = frozenset({"mtime", "atime", "ctime", "uid", "gid", "uname", "gname"})
_REGULAR = frozenset(b"07\0")
#: A pax ``mtime`` kept (whole seconds of a non-negative decimal; others keep the header's).
_PAX_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{0,9})?")


class Member(NamedTuple):
    """One archive member: its name, type byte, link target, data offset and size, device."""

    name: str
    type: int
    linkname: str
    offset_data: int
    size: int
    devmajor: int
    devminor: int
    #: Modification time in whole seconds; 0 where the writer left none.
    mtime: int = 0


def _text(field: bytes | bytearray) -> str:
    end = field.find(b"\0")
    if end >= 0:
        field = field[:end]
    return field.decode("utf-8", "surrogateescape")


#: An octal field as tarfile accepts it (stricter is safe: a miss goes to tarfile).
_OCTAL = re.compile(rb" *([0-7]*) *(?:\0[\x00-\xff]*)?")
#: The numeric fields tarfile parses and refuses when malformed: mode, uid, gid, mtime.
_CHECKED = ((100, 108), (108, 116), (116, 124), (136, 148))


def _octal(header: bytes | bytearray, start: int, end: int) -> int:
    """Return the octal number in ``header[start:end]``; ValueError when tarfile would differ."""
    match = _OCTAL.fullmatch(header, start, end)
    if match is None:
        raise ValueError("not an octal field")
    digits = match.group(1)
    return int(digits, 8) if digits else 0


def _byte_sum(data: bytes | bytearray, start: int, end: int) -> int:
    """Return the sum of ``data[start:end]``'s bytes (the tar checksum), at C speed."""
    # Adler-32's low half is 1 + the byte sum modulo 65521: exact for runs of at
    # most 256 bytes (256 * 255 < 65521), where sum() over a header costs 3 us.
    total = 0
    for at in range(start, end, 256):
        total += (zlib.adler32(data[at : min(at + 256, end)]) & 0xFFFF) - 1
    return total


def _pax(data: bytes | bytearray) -> dict[str, str] | None:
    """Parse pax records ("<len> <key>=<value>\\n"); None for anything unusual."""
    values: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break  # tarfile stops at the padding too
        space = data.find(b" ", pos, pos + 24)
        if space < 0:
            return None
        try:
            length = int(data[pos:space])
        except ValueError:
            return None
        end = pos + length
        if length <= 0 or end > len(data) or data[end - 1] != 0x0A:
            return None
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep:
            return None
        try:
            values[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
        pos = end
    if not set(values) <= _PAX_IGNORED | {"path", "linkpath", "size"}:
        return None
    return values


class TooManyMembers(ValueError):
    """The archive holds more members than the caller accepts."""


def fast_index(data: bytes | bytearray, max_members: int | None = None) -> list[Member] | None:
    """Return the members of an uncompressed tar, or None where tarfile must read it.

    Raise :class:`TooManyMembers` past ``max_members`` members.
    """
    members: list[Member] = []
    offset = 0
    total = len(data)
    pax: dict[str, str] | None = None
    try:
        while True:
            header = data[offset : offset + BLOCK]
            if len(header) < BLOCK or header.count(0) == BLOCK:
                # The end: tarfile stops at a zero or short block too (and calls an
                # archive that starts with one empty, which it reports itself).
                return members if members and pax is None else None
            stored = _octal(header, 148, 156)
            unsigned = _byte_sum(header, 0, 148) + 256 + _byte_sum(header, 156, BLOCK)
            if stored != unsigned:
                return None  # a bad checksum (or a signed one): tarfile decides
            kind = header[156]
            if kind not in _TYPES and kind != 0x78:  # 0x78: "x", a pax header
                return None
            size = _octal(header, 124, 136)
            data_at = offset + BLOCK
            padded = (size + BLOCK - 1) // BLOCK * BLOCK
            if kind == 0x78:
                if pax is not None or data_at + padded > total:
                    return None
                pax = _pax(data[data_at : data_at + size])
                if pax is None:
                    return None
                offset = data_at + padded
                continue
            name = _text(header[0:100])
            if header[345]:  # a ustar prefix (tarfile's writer leaves it empty)
                name = _text(header[345:500]) + "/" + name
            if kind == 0 and name.endswith("/"):
                kind = 0x35  # an old-style directory: AREGTYPE with a trailing slash
            if kind == 0x35:
                name = name.rstrip("/")
            linkname = _text(header[157:257]) if header[157] else ""
            mtime = _octal(header, 136, 148)
            if pax is not None:
                name = pax.get("path", name)
                linkname = pax.get("linkpath", linkname)
                if _PAX_SECONDS.fullmatch(pax.get("mtime", "")):
                    mtime = int(pax["mtime"].split(".", 1)[0])
                if "size" in pax:
                    size = int(pax["size"])
                    padded = (size + BLOCK - 1) // BLOCK * BLOCK
                pax = None
            # tarfile parses every numeric field and stops at a malformed one: so do we.
            for start, end in _CHECKED:
                if _OCTAL.fullmatch(header, start, end) is None:
                    return None
            major = _octal(header, 329, 337)
            minor = _octal(header, 337, 345)
            if max_members is not None and len(members) >= max_members:
                raise TooManyMembers(max_members)
            members.append(Member(name, kind, linkname, data_at, size, major, minor, mtime))
            offset = data_at
            if kind in _REGULAR:
                if data_at + padded > total:
                    return None  # truncated data: tarfile says so
                offset += padded
    except TooManyMembers:
        raise
    except (ValueError, UnicodeDecodeError):
        return None
