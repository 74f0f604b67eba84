"""Fixtures shared by every test: copies of the real host captures to plant problems in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.sysroot import CAPTURES, Sysroot, extract_capture


@pytest.fixture
def make_sysroot(tmp_path: Path) -> Callable[[str], Sysroot]:
    """Return a factory: ``make_sysroot("h200")`` copies that capture into tmp_path."""
    counter = iter(range(1000))

    def factory(name: str = "h200") -> Sysroot:
        return Sysroot(extract_capture(CAPTURES[name], tmp_path / f"{name}-{next(counter)}"))

    return factory


@pytest.fixture
def h200(make_sysroot: Callable[[str], Sysroot]) -> Sysroot:
    return make_sysroot("h200")


@pytest.fixture
def virtio(make_sysroot: Callable[[str], Sysroot]) -> Sysroot:
    return make_sysroot("virtio")
