"""Check registration: validated at load."""

from __future__ import annotations

import pytest

from auditor.checks.numa_balancing import NumaBalancing
from auditor.errors import UsageError
from auditor.model import Severity
from auditor.registry import RegistryError, load_checks, select, validate


def test_builtin_checks_are_valid_and_unique() -> None:
    checks = load_checks()
    ids = [c.id for c in checks]
    assert "numa.balancing" in ids
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"id": "NoDot"}, "not of the form"),
        ({"id": "numa.balancing"}, "already taken"),
        ({"__doc__": None}, "docstring"),
        ({"severity": "high"}, "Severity"),
        ({"reads": ("relative/path",)}, "absolute"),
        ({"reads": ()}, "reads"),
    ],
)
def test_validation_rejects_bad_declarations(attrs: dict[str, object], message: str) -> None:
    namespace: dict[str, object] = {
        "__doc__": "A check.", "id": "test.ok", "severity": Severity.LOW,
        "reads": ("/proc/devices",), "rationale": "", "remedy": "",
    }
    namespace.update(attrs)
    bad = type("Bad", (NumaBalancing,), namespace)
    with pytest.raises(RegistryError, match=message):
        validate([NumaBalancing, bad])


def test_select_rejects_unknown_ids() -> None:
    checks = load_checks()
    assert [c.id for c in select(checks, only=["numa.balancing"])] == ["numa.balancing"]
    assert "numa.balancing" not in [c.id for c in select(checks, skip=["numa.balancing"])]
    with pytest.raises(UsageError, match="unknown check id 'nope'"):
        select(checks, only=["nope"])
