"""Fixtures of the engine tests: generated hosts written as sysroot directories."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.hostgen import HostSpec, build_host

#: The generated 8-GPU node with none of the six problems planted.
CLEAN = HostSpec(bad_governor=False, deep_cstates=False, numa_balancing=False,
                 old_kernel=False, low_mrrs=False, stale_lxc_major=False)


def _host_factory() -> tuple[Path, Callable[..., Path]]:
    parent = Path(tempfile.mkdtemp(prefix="ha-engine-"))
    os.chmod(parent, 0o755)
    counter = iter(range(1000))

    def factory(spec: HostSpec | None = None, **fields: object) -> Path:
        chosen = spec or HostSpec(**fields)  # type: ignore[arg-type]
        return build_host(chosen).write_dir(parent / f"{chosen.hostname}-{next(counter)}")

    return parent, factory


@pytest.fixture
def make_host() -> Iterator[Callable[..., Path]]:
    """Return a factory writing a generated host (``HostSpec`` fields as keywords) to a
    directory every user can read (engines run audits as other users): for tests that
    change the host."""
    parent, factory = _host_factory()
    yield factory
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_hosts() -> Iterator[Callable[..., Path]]:
    parent, factory = _host_factory()
    yield factory
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def failing_host(shared_hosts: Callable[..., Path]) -> Path:
    """The 8-GPU node with its six problems (read only: tests that fix use make_host)."""
    return shared_hosts()


@pytest.fixture(scope="session")
def clean_host(shared_hosts: Callable[..., Path]) -> Path:
    """The 8-GPU node tuned (it still warns that NUMA balancing is on at boot); read only."""
    return shared_hosts(CLEAN)
