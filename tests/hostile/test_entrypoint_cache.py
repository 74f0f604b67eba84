"""The entry-point cache belongs to the user running the tool, or is not used.

A cache that names one check instead of twenty is planted where the tool would look: in
another user's HOME (as ``sudo -E`` keeps it), as a symlink, writable by others, and as a
FIFO. Each run must still list every check (and return: a FIFO never hangs it), and write
nothing into the other user's HOME. The control shows the planted cache is obeyed where
it is the running user's own, so each refusal is the ownership rule at work.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import audit_cmd, run_limited
from tests.support.fixkit import tree_hash

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's HOME needs root")


def env_with(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "HOST_AUDITOR_NO_CACHE")}
    env["HOME"] = str(home)
    return env


def listed(home: Path) -> int:
    result = run_limited(audit_cmd("checks", "--format", "json"), env=env_with(home),
                         timeout=60)
    assert result.code == 0, result.err
    return len(json.loads(result.out))


def one_check_cache(home: Path) -> Path:
    """Let the tool write its real cache under ``home``; cut it down to one check."""
    total = listed(home)
    cache = home / ".cache" / "host-auditor" / "entry-points.json"
    data = json.loads(cache.read_text())
    for entry in data["entries"]:
        entry["points"] = entry["points"][:1]
    cache.write_text(json.dumps(data))
    assert total >= 20
    return cache


def test_the_running_users_own_cache_is_obeyed(tmp_path: Path) -> None:
    """The control: the cut-down cache, ours, is used (one check)."""
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    one_check_cache(home)
    assert listed(home) == 1


def test_a_cache_in_another_users_home_is_neither_read_nor_written(tmp_path: Path) -> None:
    own = tmp_path / "root-home"
    own.mkdir(mode=0o700)
    one_check_cache(own)
    alice = tmp_path / "alice"
    shutil.copytree(own, alice)
    for path in [alice, *alice.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    before = tree_hash(alice)
    assert listed(alice) >= 20  # sudo -E: HOME is alice's, the run is root's
    assert tree_hash(alice) == before
    # Not even a cache of root's own is written into alice's HOME.
    shutil.rmtree(alice / ".cache")
    assert listed(alice) >= 20
    assert list(alice.iterdir()) == []


def test_a_symlinked_or_group_writable_cache_is_not_used(tmp_path: Path) -> None:
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    cache = one_check_cache(home)
    elsewhere = tmp_path / "planted.json"
    shutil.copy(cache, elsewhere)
    cache.unlink()
    cache.symlink_to(elsewhere)
    planted = elsewhere.read_bytes()
    assert listed(home) >= 20
    # The link was replaced by a fresh cache (a rename), never written through.
    assert elsewhere.read_bytes() == planted and not cache.is_symlink()
    cache.unlink()
    shutil.copy(elsewhere, cache)
    cache.chmod(0o664)
    assert listed(home) >= 20


def test_a_fifo_in_place_of_the_cache_never_hangs_a_run(tmp_path: Path) -> None:
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    cache = one_check_cache(home)
    cache.unlink()
    os.mkfifo(cache)
    assert listed(home) >= 20  # run_limited fails the test past its timeout
    assert cache.exists()


def test_a_cache_directory_writable_by_another_group_is_not_used(tmp_path: Path) -> None:
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    one_check_cache(home)
    base = home / ".cache"
    base.chmod(0o775)
    # The user's own private group (root's "root"), as umask 002 leaves it: still ours.
    os.chown(base, 0, 0)
    assert listed(home) == 1
    # Another group: its members could swap the cache's directory.
    os.chown(base, 0, NOBODY)
    assert listed(home) >= 20
