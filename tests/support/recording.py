"""A sysroot host that records the paths a check asks for, to test its ``reads`` contract."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from auditor.hosts import DirectoryHost


class RecordingHost(DirectoryHost):
    """A sysroot host that records every path a check reads, lists or follows.

    ``asked`` is every path and pattern, once; ``reads`` the files read and probed for
    existence and ``listings`` the directories listed, in order and with repeats (a
    check that reads a file twice, or lists a directory per CPU, shows there).
    """

    def __init__(self, root: str) -> None:
        self.asked: set[str] = set()
        self.reads: list[str] = []
        self.listings: list[str] = []
        super().__init__(root)
        self.asked.clear()
        self.reads.clear()

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        self.asked.add(path)
        self.reads.append(path)
        return super().read_bytes(path, limit)

    def exists(self, path: str) -> bool:
        self.asked.add(path)
        self.reads.append(path)
        return super().exists(path)

    def listdir(self, path: str) -> list[str]:
        self.asked.add(path)
        self.listings.append(path)
        return super().listdir(path)

    def readlink(self, path: str) -> str | None:
        self.asked.add(path)
        return super().readlink(path)

    def glob(self, pattern: str) -> list[str]:
        self.asked.add(pattern)
        return super().glob(pattern)


def matches_pattern(path: str, pattern: str) -> bool:
    """Return whether a path matches a ``reads`` pattern, component by component.

    A glob asked with the declared pattern itself (``/dev/nvidia[0-9]*``) is declared too.
    """
    if path == pattern:
        return True
    parts, wanted = path.strip("/").split("/"), pattern.strip("/").split("/")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True)
    )


def _lists(path: str, pattern: str) -> bool:
    """Return whether collecting ``pattern`` lists the directory ``path``.

    The collector lists a directory where the next component of a pattern has a
    wildcard: fetching ``/dir/*`` or ``/dir/cpu[0-9]*/x`` fetches the listing of ``/dir``.
    """
    parts, wanted = path.strip("/").split("/"), pattern.strip("/").split("/")
    if len(wanted) <= len(parts) or not any(c in wanted[len(parts)] for c in "*?["):
        return False
    return all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=False))


def undeclared(asked: Iterable[str], reads: Iterable[str]) -> list[str]:
    """Return the paths asked for that no ``reads`` pattern covers (read, or listed)."""
    patterns = list(reads)
    return [path for path in sorted(set(asked))
            if not any(matches_pattern(path, p) or _lists(path, p) for p in patterns)]
