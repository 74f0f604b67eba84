"""The run's memory budget: hosts wait for room within their deadline, and never exceed it."""

from __future__ import annotations

import threading
import time

import pytest

from auditor.errors import HostUnreachable
from auditor.hosts.ssh import MemoryBudget


def test_a_host_waits_for_room_then_gets_it() -> None:
    budget = MemoryBudget(100)
    budget.acquire(80, time.monotonic() + 5, "a")
    got = threading.Event()

    def second() -> None:
        budget.acquire(50, time.monotonic() + 5, "b")
        got.set()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.2)
    assert not got.is_set() and budget.used == 80  # never over the budget
    budget.release(80)
    thread.join(5)
    assert got.is_set() and budget.used == 50


def test_waiting_ends_at_the_deadline_and_too_much_is_refused_at_once() -> None:
    budget = MemoryBudget(100)
    budget.acquire(100, time.monotonic() + 5, "a")
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="timed out waiting for memory"):
        budget.acquire(1, time.monotonic() + 0.3, "b")
    assert time.monotonic() - started < 2
    with pytest.raises(HostUnreachable, match="memory budget"):
        budget.acquire(101, time.monotonic() + 5, "c")
    budget.release(100)
    assert budget.used == 0
