"""The result-file helpers of ``audit merge``: the packed list of a fleet's file names."""

from __future__ import annotations

import os
import sys

import pytest

from auditor.results import Paths


def test_paths_give_back_each_name_as_given_and_index_as_a_list_does() -> None:
    # A file name that is not UTF-8 comes in from argv or a directory listing as
    # surrogate escapes: it goes back to the same bytes.
    odd = os.fsdecode(b"/results/caf\xe9.json")
    names = ["/results/a.json", "", "/results/b c.json", odd, "/r\u00e9sultats/d.json"]
    paths = Paths(names)
    assert len(paths) == len(names)
    assert list(paths) == names and paths[3] == odd
    assert os.fsencode(paths[3]) == b"/results/caf\xe9.json"
    assert paths[-1] == names[-1] and paths[1:4] == names[1:4] and paths[::2] == names[::2]
    assert paths[10:] == [] and not Paths() and paths
    for bad in (len(names), -len(names) - 1):
        with pytest.raises(IndexError):
            paths[bad]


def test_a_hundred_thousand_paths_take_their_bytes_not_an_object_each() -> None:
    names = [f"/srv/fleet/results/gpu-{n:06d}.json" for n in range(100_000)]
    paths = Paths(names)
    packed = sys.getsizeof(paths._data) + sys.getsizeof(paths._ends)
    as_strings = sum(sys.getsizeof(n) for n in names) + sys.getsizeof(names)
    assert packed < as_strings / 2
    assert paths[54_321] == names[54_321]
