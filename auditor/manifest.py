"""The manifest a capture carries: what it collected, with which tool, for which checks, when.

``audit snapshot`` writes ``host-auditor/manifest.json`` at the root of every capture.
Replaying a capture (``audit local --root``), a check whose declared ``reads`` (or the
processes it looks for, ``daemons``) the capture did not cover is reported as a ``skip``
"not collected in this capture": a file the capture never looked for is not a file the
host lacks. A check added after the capture was made is thus skipped, not judged against
an absence. A capture without a manifest (made before manifests, or a tree put together
by hand) is judged as it always was: everything it lacks is taken as absent.

The manifest is read from the capture, so it is as untrusted as the rest of it: bounded
in size and items, every field checked, and none of its text reaches a report except the
tool version and date, which must look like a version and an ISO 8601 time.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.check import CheckClass
from auditor.errors import SnapshotError
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

#: Where the manifest lives in a capture: host-auditor's own folder, where nothing of the
#: host's files is kept; checks read only the GPU state there (auditor.hosts.gpustate).
FOLDER = "/host-auditor"
PATH = FOLDER + "/manifest.json"
#: Bump when a field's meaning changes; a reader refuses a format it does not know.
FORMAT = 1
#: The largest manifest read (a real one is a few KiB: one line per read pattern).
MAX_BYTES = 1 << 20
#: The most patterns, checks or daemons one manifest may list, and the longest of each.
MAX_ITEMS = 10_000
MAX_ITEM = 4096
#: How a skip for an uncovered check begins (tests compare what a capture covers by it).
NOT_COLLECTED = "not collected in this capture"
#: How many uncovered patterns a skip names before "and N more".
_SHOWN = 3

#: A component with glob characters (one without matches only itself).
_MAGIC = lazy_re(r"[*?\[]")
_VERSION = lazy_re(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")


@dataclass(frozen=True)
class Manifest:
    """What a capture holds: the patterns collected, the processes kept, by whom and when."""

    #: The host-auditor version that made the capture.
    version: str
    #: When the capture was made (ISO 8601, UTC).
    created: str
    #: The ids of the checks the capture was made for.
    checks: tuple[str, ...]
    #: Every ``reads`` pattern the collector fetched (with the base facts).
    patterns: tuple[str, ...]
    #: The processes whose ``/proc`` entries were kept (``Check.daemons``).
    daemons: frozenset[str]

    def to_json(self) -> bytes:
        """Return the manifest as the capture stores it."""
        return (json.dumps({
            "format": FORMAT,
            "tool": {"name": "host-auditor", "version": self.version},
            "created": self.created,
            "checks": list(self.checks),
            "patterns": list(self.patterns),
            "daemons": sorted(self.daemons),
        }, indent=1, ensure_ascii=True) + "\n").encode("ascii")

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        """Parse a manifest read from a capture; SnapshotError names ``where`` if it is bad."""
        def bad(why: str) -> SnapshotError:
            return SnapshotError(f"{where}{PATH}: not a capture manifest ({why})")

        if len(raw) > MAX_BYTES:
            raise bad(f"larger than {MAX_BYTES >> 10} KiB")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise bad("not JSON") from exc
        if not isinstance(data, dict):
            raise bad("not an object")
        if data.get("format") != FORMAT:
            raise bad(f"format {data.get('format')!r}, this version reads {FORMAT}")
        tool = data.get("tool")
        version = tool.get("version") if isinstance(tool, dict) else None
        if not isinstance(version, str) or not _VERSION.match(version):
            raise bad("no tool version")
        created = data.get("created")
        try:
            when = dt.datetime.fromisoformat(created) if isinstance(created, str) \
                and len(created) <= 64 else None
        except ValueError:
            when = None
        if when is None:
            raise bad("no creation time")
        return cls(
            version=version,
            created=when.isoformat(),
            checks=_strings(data.get("checks"), "checks", bad),
            patterns=_strings(data.get("patterns"), "patterns", bad),
            daemons=frozenset(_strings(data.get("daemons"), "daemons", bad)),
        )

    def missing(self, check: CheckClass) -> list[str]:
        """Return what ``check`` needs that the capture did not collect (empty: covered).

        A read pattern is covered by the same pattern, or by a collected pattern that
        matches it component by component (``/proc/sys/vm/*`` covers
        ``/proc/sys/vm/swappiness``). A process the check looks for is covered only when the
        capture kept that process's entries.
        """
        exact, by_depth = self._index
        # The manifest covers itself: a check may read it (the capture's date).
        lacking = [read for read in check.reads if read != PATH and read not in exact
                   and not _covered(read, by_depth.get(read.strip("/").count("/"), ()))]
        lacking += [f"process {name}" for name in sorted(check.daemons - self.daemons)]
        return lacking

    @functools.cached_property
    def _index(self) -> tuple[frozenset[str], dict[int, list[list[str]]]]:
        """Return the patterns as a set, and split into components by their depth."""
        by_depth: dict[int, list[list[str]]] = {}
        for pattern in self.patterns:
            parts = pattern.strip("/").split("/")
            by_depth.setdefault(len(parts) - 1, []).append(parts)
        return frozenset(self.patterns), by_depth

    def skip_reason(self, lacking: Sequence[str]) -> str:
        """Return the message of the skip for a check whose ``lacking`` reads were not taken."""
        shown = ", ".join(lacking[:_SHOWN])
        more = f" and {len(lacking) - _SHOWN} more" if len(lacking) > _SHOWN else ""
        return (f"{NOT_COLLECTED} (host-auditor {self.version}, {self.created[:10]}): "
                f"{shown}{more}")

    def describe(self) -> str:
        """Return the report fact that says which capture was replayed."""
        return f"host-auditor {self.version} at {self.created}, {len(self.checks)} checks"


def _strings(value: Any, field: str, bad: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS or not all(
            isinstance(item, str) and 0 < len(item) <= MAX_ITEM for item in value):
        raise bad(f"{field} must be a list of at most {MAX_ITEMS} strings")
    return tuple(value)


def _covered(read: str, collected: Iterable[list[str]]) -> bool:
    """Return whether a collected pattern (split, of the read's depth) matches the read
    pattern component by component."""
    want = read.strip("/").split("/")
    return any(all(h == w or (_MAGIC.search(h) is not None and fnmatch.fnmatchcase(w, h))
                   for h, w in zip(have, want, strict=True))
               for have in collected)


def make_manifest(checks: Iterable[CheckClass], patterns: Sequence[str], daemons: Iterable[str],
         created: dt.datetime | None = None) -> Manifest:
    """Return the manifest of a capture made now for ``checks`` from ``patterns``."""
    from auditor import __version__

    when = created or dt.datetime.now(dt.timezone.utc)
    return Manifest(version=__version__, created=when.isoformat(timespec="seconds"),
                    checks=tuple(c.id for c in checks), patterns=tuple(patterns),
                    daemons=frozenset(daemons))


def read_manifest(host: Host) -> Manifest | None:
    """Return the manifest of a capture or sysroot, or None where it has none.

    Only a sysroot can carry one (a live host's files are its own, never a capture). A
    manifest that is not a regular file, or not a valid one, is refused (SnapshotError):
    judging such a capture as complete could report what it never held as absent.
    """
    if host.kind != "sysroot":
        return None
    entry = host.lstat(PATH)
    if entry is None:
        return None
    where = host.target.removeprefix("sysroot:") + ":"
    if entry.kind != "file":
        raise SnapshotError(f"{where}{PATH}: not a regular file")
    try:
        raw = host.read_bytes(PATH, MAX_BYTES + 1)
    except OSError as exc:
        raise SnapshotError(f"{where}{PATH}: cannot be read ({exc})") from exc
    return Manifest.from_json(raw, where)
