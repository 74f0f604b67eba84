"""Entry points of one group, found by importlib.metadata and remembered between runs.

Finding entry points means importing ``importlib.metadata`` and reading every installed
distribution's metadata: tens of milliseconds on each start of a command that runs for
a few hundred. What it found is kept in the user's cache directory under a key that
changes whenever an installed distribution could: the interpreter, ``sys.path`` in order,
and for each directory on it the name of every distribution in it with its
``entry_points.txt`` modification time and size (a distribution installed, removed,
upgraded or edited in place changes one of them). A key that differs,
a cache that cannot be read or does not parse, or a finder that supplies distributions
from elsewhere (``find_distributions`` on a finder other than the path finder) means a
fresh search, as stevedore does for OpenStack's plug-ins.

The cache belongs to the user running the tool, or is not used: its directory and the
cache directory above it must be that user's and writable by no one else (group-writable
only by the user's own private group), and the file a
regular file of that user's, writable by no one else, opened without following a symlink
and without blocking (a FIFO planted there never hangs a run). Under ``sudo -E`` the
cache of the user whose HOME it is is neither read nor written.

The cache holds entry points only (distribution, name, ``module:attribute``); what they
name is imported and validated by the registry as on a fresh search. A cached entry
point that no longer imports makes the registry search again before reporting it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any, NamedTuple

#: Set to a non-empty value to search every time and keep nothing.
NO_CACHE_ENV = "HOST_AUDITOR_NO_CACHE"
CACHE_NAME = "entry-points.json"
#: Bump when the file's layout changes.
CACHE_VERSION = 1
#: A cache file larger than this is not read (a real one is a few KiB).
MAX_CACHE_BYTES = 1 << 20
#: Keys remembered at once (``audit`` and ``python -m auditor`` put different first
#: entries on ``sys.path``; so do virtual environments sharing a home).
MAX_ENTRIES = 8
#: Distributions in one directory beyond which the key is not built (the search runs).
MAX_DISTRIBUTIONS = 20000
_SUFFIXES = (".dist-info", ".egg-info", ".egg")


class Point(NamedTuple):
    """One entry point: the distribution that declares it, its name, ``module:attr``."""

    distribution: str
    name: str
    value: str


def search(group: str) -> list[Point]:
    """Return the group's entry points as importlib.metadata finds them, uncached."""
    from importlib.metadata import entry_points

    points: list[Point] = []
    # A distribution's name is parsed from its METADATA file on every ``.name``: once each.
    names: dict[int, str] = {}
    for point in entry_points(group=group):
        dist = "" if point.dist is None else names.get(id(point.dist)) or names.setdefault(
            id(point.dist), point.dist.name)
        points.append(Point(dist, point.name, point.value))
    return points


def cache_file() -> Path | None:
    """Return where the cache lives, or None where it is turned off or there is no home."""
    if os.environ.get(NO_CACHE_ENV):
        return None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG base directory specification ignores relative ones
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "host-auditor" / CACHE_NAME


def _path_key() -> list[Any] | None:
    """Return what the installed distributions depend on, or None where it cannot be told."""
    from importlib.machinery import PathFinder  # already loaded by the import system

    if any(hasattr(finder, "find_distributions") and finder is not PathFinder
           for finder in sys.meta_path):
        return None
    key: list[Any] = [sys.version]
    for entry in sys.path:
        where = os.path.abspath(entry or ".")
        try:
            stat = os.stat(where)
        except OSError:
            key.append([where])
            continue
        if not os.path.isdir(where):  # a zip file
            key.append([where, stat.st_mtime_ns, stat.st_size])
            continue
        dists: list[Any] = []
        try:
            with os.scandir(where) as listing:
                for item in listing:
                    if not item.name.endswith(_SUFFIXES):
                        continue
                    if len(dists) >= MAX_DISTRIBUTIONS:
                        return None
                    try:
                        points = os.stat(os.path.join(item.path, "entry_points.txt"))
                        dists.append([item.name, points.st_mtime_ns, points.st_size])
                    except OSError:
                        dists.append([item.name])
        except OSError:
            return None
        key.append([where, sorted(dists)])
    return key


def _ours(directory: str) -> bool:
    """Return whether ``directory`` is a directory of this user's that no other can write."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & stat.S_IWOTH:
        return False
    return not st.st_mode & stat.S_IWGRP or _private_group(st.st_gid)


def _private_group(gid: int) -> bool:
    """Return whether ``gid`` is this user's own group, of which no one else is a member.

    Where users get a group of their own (Debian's and Ubuntu's USERGROUPS_ENAB), their
    umask is 002 and ``~/.cache`` is often group-writable: writable by them alone.
    """
    import grp
    import pwd

    try:
        group = grp.getgrgid(gid)
        user = pwd.getpwuid(os.geteuid())
    except (KeyError, OSError):
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and not [
        member for member in group.gr_mem if member != user.pw_name]


def _usable(path: Path) -> bool:
    """Return whether the cache's directory, and the one above it, are this user's alone."""
    return _ours(str(path.parent)) and _ours(str(path.parent.parent))


def _entries(path: Path) -> list[Any]:
    """Return the cache file's entries (key, group, points), or none where it is unusable.

    Unusable: not this user's alone (see the module's docstring), not a regular file, too
    large, or not the cache's layout.
    """
    import json

    if not _usable(path):
        return []
    try:
        # No symlink followed, no FIFO waited on; a device or FIFO is then refused by fstat.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return []
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_CACHE_BYTES + 1)
        if len(raw) > MAX_CACHE_BYTES:
            return []
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return []
    finally:
        os.close(fd)
    if not (isinstance(data, dict) and data.get("version") == CACHE_VERSION
            and isinstance(data.get("entries"), list)):
        return []
    return [e for e in data["entries"] if isinstance(e, dict)][:MAX_ENTRIES]


def _points(entry: dict[str, Any]) -> list[Point] | None:
    points = entry.get("points")
    if not isinstance(points, list) or not all(
            isinstance(p, list) and len(p) == 3 and all(isinstance(v, str) for v in p)
            for p in points):
        return None
    return [Point(*p) for p in points]


def _write(path: Path, entries: list[Any]) -> None:
    import json
    import tempfile

    body = json.dumps({"version": CACHE_VERSION, "entries": entries[:MAX_ENTRIES]},
                      separators=(",", ":"))
    try:
        _make_directories(path.parent)
        if not _usable(path):
            return  # another user's directory (sudo -E): nothing is written through it
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".entry-points-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(body)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        return  # a cache that cannot be written only costs the next run a search


def _make_directories(directory: Path) -> None:
    """Create ``directory`` and its missing parents (mode 0700), only below a directory of
    this user's alone."""
    missing: list[Path] = []
    existing = directory
    while not existing.exists():
        missing.append(existing)
        if existing.parent == existing:
            return
        existing = existing.parent
    if missing and not _ours(str(existing)):
        return
    for part in reversed(missing):
        part.mkdir(mode=0o700)


def find(group: str, *, fresh: bool = False) -> tuple[list[Point], bool]:
    """Return the group's entry points, and whether they came from the cache.

    They come from the cache where its key still holds; ``fresh`` searches and rewrites
    the cache whatever it holds.
    """
    path = cache_file()
    key = _path_key() if path is not None else None
    if path is None or key is None:
        return search(group), False
    entries = _entries(path)
    if not fresh:
        for entry in entries:
            if entry.get("group") == group and entry.get("key") == key:
                cached = _points(entry)
                if cached is not None:
                    return cached, True
    points = search(group)
    kept = [e for e in entries if not (e.get("group") == group and e.get("key") == key)]
    _write(path, [{"group": group, "key": key, "points": [list(p) for p in points]}, *kept])
    return points, False


def load(value: str) -> object:
    """Import what an entry point's value (``module:attr.attr [extras]``) names."""
    import importlib

    module, _, attrs = value.partition("[")[0].partition(":")
    found: object = importlib.import_module(module.strip())
    for attr in filter(None, attrs.strip().split(".")):
        found = getattr(found, attr)
    return found
