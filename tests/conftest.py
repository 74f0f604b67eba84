"""Fixtures shared by every test: copies of the real host captures to plant problems in.

The suite runs on several processes (pytest-xdist: tests/run.sh). Test users, sshd ports,
network namespace and veth names, scratch directories and the entry-point cache are made
per process; what cannot be is named in :data:`SHARED`, and its tests take turns.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.sysroot import CAPTURES, Sysroot, extract_capture

# A suite started as a background job inherits SIGINT ignored (POSIX shells do so without job
# control), and so would every audit it starts: the Ctrl-C tests need it heard.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Test modules that use something of this machine that only one process may use at once,
#: by the lock they hold while each of their tests runs.
SHARED = {
    # The machine's udevd is started and stopped, and real uevents reach every listener.
    "tests/auditor/test_watch.py": "udev",
    # Fixes of this machine as root keep their state in its /var/lib/host-auditor (made and
    # removed by the fix and its rollback; test_fix checks it is left as it was).
    "tests/auditor/test_fix.py": "host-state",
    "tests/auditor/test_cli_host.py": "host-state",
    "tests/engines/test_ansible.py": "host-state",
}
#: Markers whose tests share something of this machine, by lock.
SHARED_MARKERS = {
    # Namespaces are joined to this one by 10.200.N.0/24 networks with fixed N.
    "netns": "netns",
}


@pytest.fixture(autouse=True)
def shared_part_of_the_machine(request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run a test that uses a shared part of the machine (:data:`SHARED`) alone in its group.

    Under pytest-xdist the test holds an exclusive lock, in the run's own temporary
    directory, named by its group: another process's test of the same group waits. (xdist's
    own ``--dist loadgroup`` silently stopped grouping with pytest 9.2, pytest-xdist issue
    1386; a lock holds whatever the scheduler does.)
    """
    node = request.node
    group = next((g for m, g in SHARED_MARKERS.items() if node.get_closest_marker(m)),
                 None) or SHARED.get(node.nodeid.partition("::")[0])
    if group is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    # Each worker's base is <run's base>/popen-gwN: the run's base is shared by its workers.
    lock = tmp_path_factory.getbasetemp().parent / f"shared-{group}.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    from auditor.shipped.sysroot_fix import STATE_ENV

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
