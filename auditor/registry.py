"""The check registry: built-ins from an explicit list, plug-ins from an entry-point group."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from auditor.check import Check
from auditor.errors import AuditorError, UsageError
from auditor.model import Severity

ENTRY_POINT_GROUP = "host_auditor.checks"
_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


class RegistryError(AuditorError):
    """A check class does not declare what the registry needs."""


def validate(checks: Iterable[type[Check]]) -> list[type[Check]]:
    """Validate check classes: id format, unique ids, docstring, severity, reads."""
    seen: dict[str, type[Check]] = {}
    for cls in checks:
        name = f"{cls.__module__}.{cls.__qualname__}"
        check_id = getattr(cls, "id", None)
        if not isinstance(check_id, str) or not _ID_PATTERN.match(check_id):
            raise RegistryError(f"{name}: id {check_id!r} is not of the form area.name")
        if check_id in seen:
            raise RegistryError(f"{name}: id {check_id!r} is already taken by {seen[check_id]}")
        if not (cls.__doc__ or "").strip():
            raise RegistryError(f"{name}: a check needs a docstring")
        if not isinstance(getattr(cls, "severity", None), Severity):
            raise RegistryError(f"{name}: severity must be a Severity")
        reads = getattr(cls, "reads", None)
        if not isinstance(reads, tuple) or not reads or not all(r.startswith("/") for r in reads):
            raise RegistryError(f"{name}: reads must be a tuple of absolute path patterns")
        for attr in ("rationale", "remedy"):
            if not isinstance(getattr(cls, attr, None), str):
                raise RegistryError(f"{name}: {attr} must be declared")
        seen[check_id] = cls
    return list(seen.values())


def _plugin_checks() -> list[type[Check]]:
    from importlib.metadata import entry_points

    found: list[type[Check]] = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()
        items = loaded if isinstance(loaded, (list, tuple)) else [loaded]
        for item in items:
            if not (isinstance(item, type) and issubclass(item, Check)):
                raise RegistryError(f"entry point {point.name}: {item!r} is not a Check class")
            found.append(item)
    return found


def load_checks(plugins: bool = True) -> list[type[Check]]:
    """Return every registered check class, built-ins first, validated."""
    from checks import BUILTIN_CHECKS

    classes = list(BUILTIN_CHECKS)
    if plugins:
        classes.extend(_plugin_checks())
    return validate(classes)


def select(
    checks: Sequence[type[Check]], only: Sequence[str] = (), skip: Sequence[str] = ()
) -> list[type[Check]]:
    """Filter checks by ``--check`` and ``--skip`` ids; an unknown id is a usage error."""
    known = {c.id for c in checks}
    for check_id in [*only, *skip]:
        if check_id not in known:
            raise UsageError(
                f"unknown check id {check_id!r} (known: {', '.join(sorted(known))})"
            )
    return [c for c in checks if (not only or c.id in only) and c.id not in skip]
