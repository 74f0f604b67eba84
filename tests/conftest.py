"""Fixtures shared by every test: copies of the real host captures to plant problems in."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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


@pytest.fixture(autouse=True, scope="session")
def sysroot_fix_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the state of the sysroot fixes the tests run in a directory of the test run.

    (A fix of a sysroot keeps it on the side of whoever runs it; as root, without this,
    below /var/lib/host-auditor/sysroots. One test checks that place.)
    """
    from auditor.hosts.sysroot_fix import STATE_ENV

    state = tmp_path_factory.mktemp("sysroot-fix-state")
    os.chmod(state, 0o700)
    before = os.environ.get(STATE_ENV)
    os.environ[STATE_ENV] = str(state / "sysroots")
    yield state / "sysroots"
    if before is None:
        os.environ.pop(STATE_ENV, None)
    else:
        os.environ[STATE_ENV] = before


@pytest.fixture(autouse=True, scope="session")
def entry_point_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the entry-point cache of every command the tests run inside the test run."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
