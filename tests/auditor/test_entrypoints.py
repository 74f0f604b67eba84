"""The entry-point cache: a key that any installed change alters, and a search on doubt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor import entrypoints, registry
from auditor.entrypoints import Point
from tests.support.factories import write_dist_info

GROUP = "host_auditor.test_group"


def _dist(site: Path, name: str, points: dict[str, str]) -> Path:
    return write_dist_info(site, name, name, {GROUP: points})


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path holding one distribution, and a cache of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(entrypoints.NO_CACHE_ENV, raising=False)
    site = tmp_path / "site"
    _dist(site, "first_plugin", {"one": "json:dumps"})
    sys.path.insert(0, str(site))
    try:
        yield site
    finally:
        sys.path.remove(str(site))


def test_the_second_search_is_the_cache_and_the_same(site: Path) -> None:
    points, cached = entrypoints.find(GROUP)
    assert points == [Point("first_plugin", "one", "json:dumps")] and not cached
    assert entrypoints.find(GROUP) == (points, True)
    assert entrypoints.load("json:dumps") is json.dumps
    stored = entrypoints.cache_file()
    assert stored is not None and stored.is_file()
    assert stored.stat().st_mode & 0o077 == 0


def test_a_distribution_installed_beside_is_found(site: Path) -> None:
    entrypoints.find(GROUP)
    _dist(site, "second_plugin", {"two": "json:loads"})
    points, cached = entrypoints.find(GROUP)
    assert not cached and Point("second_plugin", "two", "json:loads") in points
    assert entrypoints.find(GROUP)[1]


def test_an_entry_point_file_edited_in_place_is_read_again(site: Path) -> None:
    entrypoints.find(GROUP)
    points_file = site / "first_plugin-1.0.dist-info" / "entry_points.txt"
    points_file.write_text(f"[{GROUP}]\none = json:dumps\nthree = json:load\n")
    points, cached = entrypoints.find(GROUP)
    assert not cached and len(points) == 2


def test_a_removed_distribution_is_gone(site: Path) -> None:
    entrypoints.find(GROUP)
    info = site / "first_plugin-1.0.dist-info"
    for item in info.iterdir():
        item.unlink()
    info.rmdir()
    assert entrypoints.find(GROUP) == ([], False)


@pytest.mark.parametrize("content", [
    b"not json", b"[]", b'{"version": 1, "entries": {}}', b"\xff\xfe",
    b'{"version": 1, "entries": [{"group": "g", "key": 1, "points": [[1, 2, 3]]}]}',
    b"[" * 100000, b" " * (entrypoints.MAX_CACHE_BYTES + 10),
])
def test_a_damaged_cache_means_a_search_and_a_good_cache(site: Path, content: bytes) -> None:
    stored = entrypoints.cache_file()
    assert stored is not None
    stored.parent.mkdir(parents=True)
    stored.write_bytes(content)
    points, cached = entrypoints.find(GROUP)
    assert points == [Point("first_plugin", "one", "json:dumps")] and not cached
    assert entrypoints.find(GROUP)[1]


def test_a_cached_key_with_bad_points_is_not_used(site: Path) -> None:
    entrypoints.find(GROUP)
    stored = entrypoints.cache_file()
    assert stored is not None
    data = json.loads(stored.read_text())
    data["entries"][0]["points"] = [["x", "y"]]
    stored.write_text(json.dumps(data))
    assert entrypoints.find(GROUP) == ([Point("first_plugin", "one", "json:dumps")], False)


def test_no_cache_where_it_is_turned_off_or_has_no_home(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(entrypoints.NO_CACHE_ENV, "1")
    assert entrypoints.cache_file() is None
    assert entrypoints.find(GROUP)[1] is False and entrypoints.find(GROUP)[1] is False
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv(entrypoints.NO_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert entrypoints.cache_file() == tmp_path / "home/.cache/host-auditor/entry-points.json"
    monkeypatch.setenv("HOME", "")
    assert entrypoints.cache_file() is None


def test_an_unwritable_cache_only_costs_a_search(site: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where a directory goes
    assert entrypoints.find(GROUP) == ([Point("first_plugin", "one", "json:dumps")], False)


class _OtherFinder:
    """A finder that supplies distributions from somewhere the key cannot see."""

    @staticmethod
    def find_distributions(*args: object, **kwargs: object) -> list[object]:
        return []

    @staticmethod
    def find_spec(*args: object, **kwargs: object) -> None:
        return None


def test_another_distribution_finder_turns_the_cache_off(site: Path) -> None:
    entrypoints.find(GROUP)
    sys.meta_path.append(_OtherFinder())
    try:
        assert entrypoints.find(GROUP)[1] is False
    finally:
        sys.meta_path.pop()


def test_keys_of_several_interpreters_and_paths_are_kept(site: Path, tmp_path: Path) -> None:
    entrypoints.find(GROUP)
    other = tmp_path / "other"
    other.mkdir()
    sys.path.insert(0, str(other))
    try:
        assert entrypoints.find(GROUP)[1] is False
    finally:
        sys.path.remove(str(other))
    assert entrypoints.find(GROUP)[1] is True  # the first key is still remembered


def test_the_registry_searches_again_when_a_remembered_entry_point_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    registry.reset()
    expected = [c.id for c in registry.load_checks()]
    stored = entrypoints.cache_file()
    assert stored is not None
    data = json.loads(stored.read_text())
    for entry in data["entries"]:
        for point in entry["points"]:
            point[2] = "auditor.no_such_module:Gone"
    stored.write_text(json.dumps(data))
    registry.reset()
    try:
        assert [c.id for c in registry.load_checks()] == expected
        assert entrypoints.find(registry.ENTRY_POINT_GROUP)[1] is True  # rewritten
        assert "no_such_module" not in stored.read_text()
    finally:
        registry.reset()


def test_a_command_with_a_warm_cache_does_not_search(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = ("import sys; from auditor.registry import load_checks; n = len(load_checks()); "
            "print(n, 'importlib.metadata' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout.split()
            for _ in range(2)]
    assert runs[0][1] == "True" and runs[1] == [runs[0][0], "False"]
