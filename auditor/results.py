"""Reading saved reports back: per-host JSON results (``audit merge``, ``--report``).

:func:`load_results` reads many result files fast and leaves out (with a one-line
reason) any file that is not a readable report; :meth:`auditor.model.Report.from_dict`
builds one report through the same fast path.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import stat
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from auditor.model import Report, pick_report
from auditor.text import printable


@dataclass(frozen=True)
class Unreadable:
    """An input file that could not be merged, and why (one line)."""

    path: str
    reason: str

    def line(self) -> str:
        """Return the one-line message naming the file."""
        return printable(f"{self.path}: {self.reason}; left out of the merge")


class Paths(Sequence[str]):
    """A list of file paths packed into one buffer: a fleet's hundred thousand result files
    take their bytes and eight more each, not a string object each (about a hundred)."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._data = bytearray()
        self._ends = array("Q")
        for path in paths:
            self.append(path)

    def append(self, path: str) -> None:
        """Add a path at the end."""
        self._data += os.fsencode(path)
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("path index out of range")
        start = self._ends[index - 1] if index else 0
        return os.fsdecode(bytes(self._data[start:self._ends[index]]))


@dataclass
class LoadedResults:
    """The reports read from result files, the files that could not be read, and notes."""

    reports: list[Report] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    unreadable: list[Unreadable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def documents(data: Any) -> list[Mapping[str, Any]]:
    """Return the host reports of a decoded result file (one report, or a merged fleet's)."""
    if isinstance(data, Mapping) and isinstance(data.get("hosts"), list):
        return list(data["hosts"])
    if isinstance(data, Mapping):
        return [data]
    raise ValueError("not an audit report (a JSON object with host and findings)")


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cycle collector while many acyclic objects are made.

    Reading 10,000 reports makes over a million objects; each collection walks all
    of them again, which tripled the load time. Nothing made here forms a cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was made lives until the command ends: leave it out of later
        # collections rather than walk it again at the next one.
        gc.freeze()
        if enabled:
            gc.enable()


def load_results(paths: Iterable[str]) -> LoadedResults:
    """Read per-host JSON reports; a file that cannot be read is noted and left out.

    A host reported by several files keeps the newest report, or where the start times
    tie the worse one (:func:`auditor.model.pick_report`), and a note says so.
    """
    with no_cycle_collection():
        return _load_results(paths)


#: The most bytes one result file may hold (a host's report is 20 to 100 KB; a merged
#: report of a thousand hosts fits; /dev/zero behind a ``*.json`` name does not).
MAX_RESULT = 64 << 20
#: The most bytes of files read ahead of the one being parsed.
READ_AHEAD_BYTES = 128 << 20


def read_result(path: str) -> bytes | OSError:
    """Read a regular file of at most MAX_RESULT bytes (a FIFO or device is never opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return OSError(errno.EINVAL, "not a regular file")
        if st.st_size > MAX_RESULT:
            return OSError(errno.EFBIG, f"larger than {MAX_RESULT >> 20} MiB")
        # Read with the file descriptor: a merge reads tens of thousands of files, and a
        # file object costs a third of a small file's read. A regular file reads short only
        # at its end; one that grows meanwhile is read on, to the bound.
        parts = [os.read(fd, st.st_size + 1)]
        size = len(parts[0])
        while size > st.st_size and size <= MAX_RESULT:
            part = os.read(fd, min(1 << 20, MAX_RESULT + 1 - size))
            if not part:
                break
            parts.append(part)
            size += len(part)
        if size > MAX_RESULT:
            return OSError(errno.EFBIG, f"larger than {MAX_RESULT >> 20} MiB")
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)


def _read_ahead(paths: Iterable[str], window: int = 256) -> Iterator[tuple[str, bytes | OSError]]:
    """Yield (path, bytes or the error) in order, reading a window of files ahead.

    Thousands of small files on a busy disk wait on I/O more than they parse: a few
    threads keep reads in flight while this thread decodes (read releases the GIL).
    """
    from concurrent.futures import ThreadPoolExecutor

    pending = list(paths)
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="read") as pool:
        start = 0
        while start < len(pending):
            # A window of files, and of bytes: large inputs are not all held at once.
            end, size = start, 0
            while end < len(pending) and end - start < window and size < READ_AHEAD_BYTES:
                try:
                    size += min(os.stat(pending[end]).st_size, MAX_RESULT)
                except OSError:
                    pass
                end += 1
            chunk = pending[start:end]
            yield from zip(chunk, pool.map(read_result, chunk), strict=True)
            start = end


def _load_results(paths: Iterable[str]) -> LoadedResults:
    loaded = LoadedResults()
    by_host: dict[str, int] = {}
    for path, raw in _read_ahead(paths):
        if isinstance(raw, OSError):
            loaded.unreadable.append(Unreadable(path, f"cannot read ({raw.strerror})"))
            continue
        try:
            data = json.loads(raw)
        except UnicodeDecodeError:
            loaded.unreadable.append(Unreadable(path, "not UTF-8 text"))
            continue
        except RecursionError:
            loaded.unreadable.append(Unreadable(path, "not a report: JSON nested too deeply"))
            continue
        except json.JSONDecodeError as exc:
            cut = exc.msg.startswith("Unterminated") or exc.pos >= len(raw.rstrip())
            what = "truncated JSON" if cut and raw.strip() else "not valid JSON"
            loaded.unreadable.append(
                Unreadable(path, f"{what}: {exc.msg} (line {exc.lineno} column {exc.colno})")
            )
            continue
        try:
            reports = [Report.from_dict(doc) for doc in documents(data)]
        except (ValueError, RecursionError) as exc:
            loaded.unreadable.append(Unreadable(path, printable(" ".join(str(exc).split()))[:300]))
            continue
        for report in reports:
            seen = by_host.get(report.host)
            if seen is None:
                by_host[report.host] = len(loaded.reports)
                loaded.reports.append(report)
                loaded.sources[report.host] = path
                continue
            chosen, why = pick_report(loaded.reports[seen], report)
            keep = path if chosen is report else loaded.sources[report.host]
            loaded.notes.append(printable(
                f"{report.host}: reported by {loaded.sources[report.host]} and {path}; "
                f"keeping {keep} ({why})"
            ))
            if chosen is report:
                loaded.reports[seen] = report
                loaded.sources[report.host] = path
    return loaded
