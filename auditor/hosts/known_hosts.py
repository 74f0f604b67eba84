"""OpenSSH ``known_hosts`` files, read line by line as ``sshd(8)`` documents them.

Each line is ``[marker] patterns keytype base64-key [comment]``. A line that cannot be
read is skipped on its own (paramiko's loader gives up on the whole file at one
``@cert-authority`` line). Markers (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"):

- ``@cert-authority``: the key is a CA that signs host certificates. Host
  certificates are not checked here, so these lines are skipped: they never make a
  host's key trusted.
- ``@revoked``: the key must never be accepted, for any host, whatever else lists it.

Patterns are comma-separated; ``*`` and ``?`` are wildcards, a pattern starting with
``!`` negates (a host matching a negated pattern does not match the line), and a
hashed name (``|1|salt|hash``, HashKnownHosts) matches by HMAC-SHA1 of the name.
A name with a port other than 22 is written ``[host]:port``.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

#: The most bytes of one known_hosts file read (a large fleet's is a few MB).
MAX_FILE = 64 << 20
#: The most characters of one line considered (an RSA-16384 key is about 3 KB of base64).
MAX_LINE = 16 << 10


@dataclass(frozen=True)
class KnownKey:
    """One key of a known_hosts line: its type and its bytes (the base64 decoded)."""

    keytype: str
    blob: bytes


@dataclass
class KnownHosts:
    """The host keys of some known_hosts files: (patterns, key) in file order, and revoked keys."""

    entries: list[tuple[tuple[str, ...], KnownKey]] = field(default_factory=list)
    revoked: set[bytes] = field(default_factory=set)
    #: Lines skipped (unreadable, or a marker not used here), for diagnostics.
    skipped: int = 0

    def load(self, path: str) -> None:
        """Add a file's keys; a missing or unreadable file adds nothing."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return  # a FIFO or device where a file is expected: never read
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(MAX_FILE)
        except OSError:
            return
        finally:
            os.close(fd)
        for raw in data.decode("utf-8", "replace").splitlines():
            self.add_line(raw)

    def add_line(self, raw: str) -> None:
        """Add one line (a comment, a blank or an unreadable line is skipped)."""
        line = raw.strip()
        if not line or line.startswith("#"):
            return
        fields = line[:MAX_LINE].split()
        marker = ""
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            self.skipped += 1
            return
        patterns, keytype, encoded = fields[0], fields[1], fields[2]
        try:
            blob = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            self.skipped += 1
            return
        if marker == "@revoked":
            self.revoked.add(blob)
            return
        if marker:
            self.skipped += 1  # @cert-authority (or a marker sshd does not know)
            return
        self.entries.append((tuple(p for p in patterns.split(",") if p), KnownKey(keytype,
                                                                                  blob)))

    def lookup(self, name: str) -> list[KnownKey]:
        """Return the keys trusted for ``name`` (``host`` or ``[host]:port``), in file order,
        revoked keys left out."""
        return [key for patterns, key in self.entries
                if key.blob not in self.revoked and matches(name, patterns)]

    def is_revoked(self, key: paramiko.PKey) -> bool:
        """Return whether a key is listed ``@revoked``."""
        return key.asbytes() in self.revoked


def _hashed(name: str, pattern: str) -> bool:
    try:
        _, _, salt, digest = pattern.split("|", 3)
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except (ValueError, binascii.Error):
        return False


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Return whether a host name matches a line's patterns (a negated match wins)."""
    found = False
    lowered = name.lower()
    for pattern in patterns:
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern.startswith("|1|"):
            hit = _hashed(name, pattern)
        elif "*" in pattern or "?" in pattern:
            # fnmatch's [...] classes are not in ssh's pattern language: escape them.
            escaped = pattern.lower().replace("[", "[[]")
            hit = fnmatch.fnmatchcase(lowered, escaped)
        else:
            hit = pattern.lower() == lowered
        if hit and negated:
            return False
        found = found or hit
    return found


def to_pkey(key: KnownKey) -> paramiko.PKey | None:
    """Return a known key as a paramiko key, or None for a type paramiko cannot use."""
    import paramiko

    try:
        return paramiko.PKey.from_type_string(key.keytype, key.blob)
    except (paramiko.SSHException, ValueError, TypeError):
        return None
