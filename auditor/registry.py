"""The check registry: every check, built-in or plug-in, from one entry-point group.

host-auditor registers its own checks in the ``host_auditor.checks`` group, as any
other distribution registers a plug-in (flake8 loads its built-ins the same way).
Each check class is validated when it is loaded; what the rest of the program needs
to know about the checks (which can be fixed, which paths a fix reads, which device
events re-run which checks) is derived here from the classes' declarations.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from auditor import entrypoints
from auditor.check import Check, CheckClass, CheckOptions, Trigger
from auditor.errors import PolicyError, RegistryError, UsageError
from auditor.model import Severity
from auditor.parsing import lazy_re

ENTRY_POINT_GROUP = "host_auditor.checks"
#: The distribution whose checks are the built-ins (listed before plug-ins).
DISTRIBUTION = "host-auditor"
#: Profiles a check may set option values for; the defaults are ``gpu-inference``'s.
PROFILES = ("gpu-inference", "latency", "throughput")
DEFAULT_PROFILE = PROFILES[0]
_ID_PATTERN = lazy_re(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
#: ``version_added``: a release number, ``N.N`` or ``N.N.N``.
_VERSION_PATTERN = lazy_re(r"^(0|[1-9][0-9]{0,5})(\.(0|[1-9][0-9]{0,5})){1,2}$")


def _release(version: str) -> tuple[int, ...]:
    """Return a release number as a tuple of ints, padded to three parts for comparison."""
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def _validate_one(cls: Any, name: str) -> None:
    check_id = getattr(cls, "id", None)
    if not isinstance(check_id, str) or not _ID_PATTERN.match(check_id):
        raise RegistryError(f"{name}: id {check_id!r} is not of the form area.name")
    if not (cls.__doc__ or "").strip():
        raise RegistryError(f"{name}: a check needs a docstring")
    if not isinstance(getattr(cls, "severity", None), Severity):
        raise RegistryError(f"{name}: severity must be a Severity")
    reads = getattr(cls, "reads", None)
    if not isinstance(reads, tuple) or not reads or not all(
        isinstance(r, str) and r.startswith("/") for r in reads
    ):
        raise RegistryError(f"{name}: reads must be a tuple of absolute path patterns")
    fix_reads = getattr(cls, "fix_reads", ())
    if not isinstance(fix_reads, tuple) or not all(
        isinstance(r, str) and r.startswith("/") for r in fix_reads
    ):
        raise RegistryError(f"{name}: fix_reads must be a tuple of absolute path patterns")
    if fix_reads and not cls.fixable():
        raise RegistryError(f"{name}: declares fix_reads but no remediate()")
    for attr in ("rationale", "remedy"):
        if not isinstance(getattr(cls, attr, None), str):
            raise RegistryError(f"{name}: {attr} must be declared")
    version: object = getattr(cls, "version_added", "")
    if not isinstance(version, str) or (version and not _VERSION_PATTERN.match(version)):
        raise RegistryError(f"{name}: version_added must be a release number such as 0.1.0, "
                            f"got {version!r}")
    daemons: object = getattr(cls, "daemons", frozenset())
    if not isinstance(daemons, frozenset) or not all(isinstance(d, str) for d in daemons):
        raise RegistryError(f"{name}: daemons must be a frozenset of process names")
    events: object = getattr(cls, "events", frozenset())
    if not isinstance(events, frozenset) or not all(isinstance(e, Trigger) for e in events):
        raise RegistryError(f"{name}: events must be a frozenset of Trigger")
    options_type = getattr(cls, "options_type", None)
    if not (isinstance(options_type, type) and issubclass(options_type, CheckOptions)):
        raise RegistryError(f"{name}: options_type must be a CheckOptions dataclass")
    try:
        options_type.specs()
    except TypeError as exc:
        raise RegistryError(f"{name}: {exc}") from exc
    profiles = getattr(cls, "profiles", {})
    if not isinstance(profiles, Mapping):
        raise RegistryError(f"{name}: profiles must map profile names to option values")
    for profile, values in profiles.items():
        if profile not in PROFILES:
            raise RegistryError(f"{name}: profile {profile!r} is not one of "
                                f"{', '.join(PROFILES)}")
        try:
            options_type.build(values, f"profile {profile}", check_id)
        except PolicyError as exc:
            raise RegistryError(f"{name}: {exc}") from exc


def validate(checks: Iterable[Any]) -> list[CheckClass]:
    """Validate check classes: id format, unique ids, docstring, severity, reads, options."""
    seen: dict[str, CheckClass] = {}
    for cls in checks:
        name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)!s}"
        if not (isinstance(cls, type) and issubclass(cls, Check)):
            raise RegistryError(f"{name}: not a Check class")
        _validate_one(cls, name)
        if cls.id in seen:
            raise RegistryError(f"{name}: id {cls.id!r} is already taken by {seen[cls.id]}")
        seen[cls.id] = cls
    return list(seen.values())


def _entry_point_checks() -> list[CheckClass]:
    points, cached = entrypoints.find(ENTRY_POINT_GROUP)
    try:
        return _load_points(points)
    except RegistryError:
        if not cached:
            raise
    # A remembered entry point may name what was since changed: search before saying so.
    points, _ = entrypoints.find(ENTRY_POINT_GROUP, fresh=True)
    return _load_points(points)


def _load_points(points: Sequence[entrypoints.Point]) -> list[CheckClass]:
    builtin = [p for p in points if p.distribution == DISTRIBUTION]
    plugins = [p for p in points if p.distribution != DISTRIBUTION]
    if not builtin:
        raise RegistryError(
            f"no built-in checks are registered: install {DISTRIBUTION} (pip install .) so "
            f"its {ENTRY_POINT_GROUP} entry points exist"
        )
    found: list[CheckClass] = []
    # Report order: the built-ins by id, then plug-ins by distribution and id.
    for point in sorted(builtin, key=lambda p: p.name) + sorted(
            plugins, key=lambda p: (p.distribution, p.name)):
        try:
            loaded = entrypoints.load(point.value)
        except Exception as exc:
            raise RegistryError(f"entry point {point.name} ({point.value}) cannot be loaded: "
                                f"{type(exc).__name__}: {exc}") from exc
        if not (isinstance(loaded, type) and issubclass(loaded, Check)):
            raise RegistryError(f"entry point {point.name}: {loaded!r} is not a Check class")
        if loaded.id != point.name:
            raise RegistryError(f"entry point {point.name} names check {loaded.id!r}: the entry "
                                "point's name must be the check's id")
        if point.distribution == DISTRIBUTION:
            _builtin_version(loaded)
        found.append(loaded)
    return found


def _builtin_version(cls: CheckClass) -> None:
    """Hold a built-in check's ``version_added`` to no later than this release.

    A built-in without one still loads (a check landed beside this rule must not stop
    every command); ``tests/auditor/test_registry.py`` holds every built-in to declaring it.
    """
    from auditor import __version__

    added = cls.version_added
    if added and _release(added) > _release(__version__):
        raise RegistryError(f"built-in check {cls.id}: version_added {added} is later than "
                            f"this release, {__version__}")


_LOADED: list[CheckClass] | None = None


def load_checks() -> list[CheckClass]:
    """Return every registered check class, built-ins first, validated (loaded once)."""
    global _LOADED
    if _LOADED is None:
        _LOADED = validate(_entry_point_checks())
    return list(_LOADED)


def load_local(specs: Sequence[tuple[str, str]], paths: Sequence[str],
               where: str) -> list[CheckClass]:
    """Load a site's own checks, ``(id, "module:Class")``, from modules in ``paths``.

    Each class is held to what an entry point's is (a Check class whose id is the name it
    was listed under; ``validate`` does the rest). A module is imported only from the
    listed directories, and only where neither the directory nor the module's file can be
    written by another user: as root, a check is code run as root.
    """
    import importlib.machinery
    import os

    for directory in paths:
        _trusted(directory, where, directory=True)
    for directory in reversed(paths):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    found: list[CheckClass] = []
    for check_id, value in specs:
        module = value.partition(":")[0].strip()
        top = module.partition(".")[0]
        spec = importlib.machinery.PathFinder.find_spec(top, list(paths))
        if spec is None or spec.origin is None:
            raise RegistryError(f"{where}: {check_id}: no module {top!r} in "
                                f"{', '.join(paths) or 'its paths (none given)'}")
        _trusted(spec.origin, where, directory=False)
        loaded_module = sys.modules.get(top)
        if loaded_module is not None and os.path.realpath(
                getattr(loaded_module, "__file__", "") or "") != os.path.realpath(spec.origin):
            raise RegistryError(f"{where}: {check_id}: module {top!r} is already imported "
                                "from elsewhere; rename the plug-in's module")
        try:
            loaded = entrypoints.load(value)
        except Exception as exc:
            raise RegistryError(f"{where}: {check_id} ({value}) cannot be loaded: "
                                f"{type(exc).__name__}: {exc}") from exc
        if not (isinstance(loaded, type) and issubclass(loaded, Check)):
            raise RegistryError(f"{where}: {check_id}: {loaded!r} is not a Check class")
        if loaded.id != check_id:
            raise RegistryError(f"{where}: {check_id} names check {loaded.id!r}: the name it "
                                "is listed under must be the check's id")
        found.append(loaded)
    return found


def _trusted(path: str, where: str, *, directory: bool) -> None:
    """Refuse a plug-in path that is missing, or that another user could write to."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise RegistryError(f"{where}: {path}: {exc.strerror}") from exc
    if directory and not stat.S_ISDIR(st.st_mode):
        raise RegistryError(f"{where}: {path} is not a directory")
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RegistryError(f"{where}: {path} can be written by another user: refused")


def reset() -> None:
    """Forget the loaded checks, so the next load sees newly installed plug-ins."""
    global _LOADED
    _LOADED = None


def select(
    checks: Sequence[CheckClass], only: Sequence[str] = (), skip: Sequence[str] = ()
) -> list[CheckClass]:
    """Filter checks by ``--check`` and ``--skip``: ids, or shell patterns of ids (``pcie.*``).

    An id that is not registered, or a pattern that matches none, is a usage error.
    """
    import fnmatch

    known = [c.id for c in checks]
    for wanted in [*only, *skip]:
        if not fnmatch.filter(known, wanted):
            raise UsageError(
                f"unknown check id {wanted!r} (known: {', '.join(sorted(known))})"
            )

    def named(check_id: str, patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(check_id, p) for p in patterns)

    return [c for c in checks if (not only or named(c.id, only)) and not named(c.id, skip)]


# -- what the registry derives --------------------------------------------------------------


def fixable(checks: Iterable[CheckClass]) -> list[CheckClass]:
    """Return the checks that can write a fix."""
    return [c for c in checks if c.fixable()]


def collected_paths(checks: Iterable[CheckClass], *, fix: bool = False) -> list[str]:
    """Return what a collection of these checks fetches: their reads, the base facts, and
    with ``fix`` the paths their remediations read too (each pattern once)."""
    from auditor.hosts.collect import BASE_READS

    chosen = list(checks)
    patterns: dict[str, None] = {}
    for cls in chosen:
        patterns.update(dict.fromkeys(cls.reads))
    patterns.update(dict.fromkeys(BASE_READS))
    if fix:
        patterns.update(dict.fromkeys(fix_reads(chosen)))
    return list(patterns)


def fix_reads(checks: Iterable[CheckClass]) -> tuple[str, ...]:
    """Return the paths the checks' remediations read beyond their ``reads``."""
    from auditor.remediations.boot import BOOT_READS
    from auditor.remedy import GUARD_READS

    found: dict[str, None] = dict.fromkeys(GUARD_READS)
    chosen = fixable(checks)
    for cls in chosen:
        found.update(dict.fromkeys(cls.fix_reads))
    if chosen:
        found.update(dict.fromkeys(BOOT_READS))
    return tuple(found)


def watched(checks: Iterable[CheckClass], trigger: Trigger | None = None) -> list[CheckClass]:
    """Return the checks a device event re-runs (those ``trigger`` re-runs, if given)."""
    return [c for c in checks if c.events and (trigger is None or trigger in c.events)]
