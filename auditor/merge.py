"""``audit merge`` at fleet scale: two streaming passes over the result files, on every core.

A fleet's results are read twice, in chunks of files spread over worker processes:

1. **Index**: each file is decoded and checked, and each host report in it is reduced to
   a few numbers (who it is, where it is), packed in arrays (:class:`Index`). The parent
   resolves hosts reported more than once (:func:`auditor.model.pick_report`, on the two
   reports read again), names the hosts whose names collide, and finds the golden host.
2. **Reduce**: each chunk is decoded again and reduced to what the chosen format needs.
   For ``text`` that is a :class:`Partial`: counts, and bounded lists (the first hosts of
   each problem and fingerprint group, the first differing hosts), merged in the parent,
   so memory is bounded by what is reported, not by the fleet. For the formats that
   hold every host (``json``, ``html``, ``line``, ``prometheus``) each chunk renders its
   hosts with the same renderers as a single audit, and the parent spools the pieces to
   an unnamed file and writes them out in order.

Files are decoded with msgspec into typed structures (only the fields a merge reads; the
rest is skipped without building objects); a document that does not fit them goes the
tolerant way of :meth:`auditor.model.Report.from_dict`. JSON is read strictly (RFC 8259:
no NaN or Infinity, no lone surrogates, numbers in range), so every number merged is
finite. Chunks are cut in file order and merged in chunk order, so the result is the
same byte for byte whatever the number of processes.

A host is one machine: reports with the same machine id (``facts.machine_id``) and host
name are one host (the same machine reached under two names is said once, in a note);
reports without a machine id are known by host name, as before. Two machines with one
host name stay two hosts, shown as ``name (target)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import os
import secrets
import tempfile
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec

from auditor.fleet import TextView
from auditor.model import (
    FINGERPRINT_LENGTH,
    FINGERPRINT_VERSION,
    CheckResult,
    FailOn,
    Finding,
    Report,
    Severity,
    Status,
    pick_report,
)
from auditor.results import MAX_RESULT, Unreadable, read_result
from auditor.text import printable

if TYPE_CHECKING:
    from auditor.fleet import Cell
    from auditor.prom import Exposition, Machine

StatusText = Literal["pass", "skip", "warn", "fail", "error"]
SeverityText = Literal["info", "low", "medium", "high", "critical"]

_STATUS = {s.value: s for s in Status}
_SEVERITY = {s.value: s for s in Severity}
_ORDER = {s.value: s.order for s in Status}
_RANK = {s.value: s.rank for s in Status}
#: How many files one task reads: large enough to keep a process busy, small enough that
#: a chunk's reports (what a task holds at once) stay a few megabytes.
CHUNK_FILES = 64
#: Text views list this many hosts of a group, and four times as many groups.
LIMIT = 10


class FindingDoc(msgspec.Struct, gc=False):
    """A finding as ``audit`` writes it (the fields a merge reads)."""

    check: str
    status: StatusText
    severity: SeverityText = "info"
    subject: str = ""
    aspect: str = ""
    observed: str = ""
    expected: str = ""
    message: str = ""
    fix: str = ""
    host: str = ""
    evidence: dict[str, str] = {}
    waived: bool = False
    waiver: str = ""


class CheckDoc(msgspec.Struct, gc=False):
    """A check's line in a report's ``checks``."""

    check: str
    duration_s: float = 0.0


class ToolDoc(msgspec.Struct, gc=False):
    """The ``tool`` of a report."""

    version: str = ""


class ReportDoc(msgspec.Struct, gc=False):
    """A host's report as ``audit`` writes it (the fields a merge reads)."""

    host: str
    target: str | None = None
    started: str = ""
    duration_s: float = 0.0
    facts: dict[str, str] = {}
    checks: list[CheckDoc] = []
    findings: list[FindingDoc] = []
    error: str = ""
    timing: dict[str, float] = {}
    tool: ToolDoc | None = None
    policy: dict[str, str] = {}
    name: str = ""
    aliases: list[str] = []


_STRICT = msgspec.json.Decoder(ReportDoc)
_ANY = msgspec.json.Decoder()


class IdentityDoc(msgspec.Struct, gc=False):
    """What the index pass reads of a host's report: the fields that name it."""

    host: str
    target: str | None = None
    facts: dict[str, str] = {}
    name: str = ""


#: The index pass's decoder: a report's names, its findings skipped (a third of a full
#: decode). A file read so is checked whole before it decides anything (:func:`_check`).
_NAMES = msgspec.json.Decoder(IdentityDoc)
#: A report as the identity functions read it.
Named = ReportDoc | IdentityDoc


_TOO_DEEP = "not a report: JSON nested too deeply"


def _json_error(exc: msgspec.DecodeError, raw: bytes) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    text = " ".join(str(exc).split())
    if "truncated" in text and raw.strip() and not raw.rstrip().endswith(b"}"):
        return f"truncated JSON: {text}"
    # Also a number out of range (RFC 8259 leaves the range to us: a float's), NaN,
    # Infinity and a lone surrogate: what is merged and written is strict JSON.
    return f"not valid JSON: {text}"


def _doc_of(report: Report) -> ReportDoc:
    """Return the typed form of a report read the tolerant way."""
    return msgspec.convert(report.to_dict(), ReportDoc)


def decode(raw: bytes) -> list[ReportDoc] | str:
    """Return the host reports a result file holds, or why it holds none (one line)."""
    try:
        return [_STRICT.decode(raw)]
    except msgspec.ValidationError:
        pass  # valid JSON of another shape: the tolerant way below says what it is
    except msgspec.DecodeError as exc:
        return _json_error(exc, raw)
    except RecursionError:
        return _TOO_DEEP
    try:
        data = _ANY.decode(raw)
    except msgspec.DecodeError as exc:
        return _json_error(exc, raw)
    except RecursionError:
        return _TOO_DEEP
    from auditor.results import documents

    try:
        return [_doc_of(Report.from_dict(doc)) for doc in documents(data)]
    except (ValueError, RecursionError, msgspec.ValidationError) as exc:
        return printable(" ".join(str(exc).split()))[:300]


# -- identity ------------------------------------------------------------------------------


def machine_id(doc: Named) -> str:
    """Return the machine id the report carries ('' for reports without one)."""
    return doc.facts.get("machine_id", "").strip()


def target_of(doc: Named) -> str:
    """Return the target the report was audited as (the host name where none is kept)."""
    return doc.host if doc.target is None else doc.target


def _hash(salt: bytes, *parts: str) -> int:
    text = "\0".join(parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8, key=salt).digest(), "big",
                          signed=True)


def _identity(doc: Named) -> tuple[str, ...]:
    mid = machine_id(doc)
    return ("m", mid, doc.host) if mid else ("h", doc.host)


def shown(doc: Named) -> str:
    """Return the name a host is listed by (:attr:`auditor.model.Report.identity`)."""
    if doc.name and doc.name != doc.host:
        return f"{doc.name} ({doc.host})"
    return doc.name or doc.host


def display_names(doc: ReportDoc, salt: bytes, names: frozenset[int],
                  pairs: frozenset[int]) -> str:
    """Return the name a host is shown by, made unique where two machines share one
    (:func:`auditor.fleet.row_names`: the connection, then the machine id, beside it)."""
    name = shown(doc)
    if _hash(salt, name) not in names:
        return name
    target = target_of(doc)
    if _hash(salt, name, target) not in pairs:
        return f"{name} [{target}]"
    mid = machine_id(doc)
    return f"{name} [{target}, {mid[:12]}]" if mid else f"{name} [{target}]"


def _matches_golden(doc: Named, golden: str | None) -> bool:
    if golden is None:
        return False
    name = shown(doc)
    return golden in (doc.host, doc.name, name, f"{name} [{target_of(doc)}]")


# -- the index pass ------------------------------------------------------------------------


#: Per host report, the index pass keeps three hashes: who it is, its name, its name and
#: target (:data:`KEYS` numbers in :attr:`Index.keys`, report by report).
KEYS = 3
IDENTITY, NAME, NAME_TARGET = range(KEYS)


class ChunkIndex(NamedTuple):
    """What the index pass found in a chunk of files, packed (a few dozen bytes a report)."""

    #: Per file, how many host reports it holds.
    counts: array[int]
    #: Per report, its :data:`KEYS` hashes.
    keys: array[int]
    #: Per report, 1 where it names the golden host.
    golden: bytearray
    #: Per file, 1 where the whole file was decoded (else only its names: :data:`_NAMES`).
    checked: bytearray
    #: The files (their place in the chunk) that hold no report, and why.
    reasons: dict[int, str]


def _index_file(path: str, whole: bool) -> tuple[Sequence[Named] | str, bool]:
    raw = read_result(path)
    if isinstance(raw, OSError):
        return f"cannot read ({raw.strerror})", True
    docs: Sequence[Named] | str
    try:
        if whole:
            raise msgspec.ValidationError
        docs = [_NAMES.decode(raw)]
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        docs = decode(raw)  # the whole file, and the reason it holds no report
        whole = True
    return docs, whole


def _index_chunk(args: tuple[Sequence[str], bytes, str | None, bool]) -> ChunkIndex:
    paths, salt, golden, whole = args
    out = ChunkIndex(array("q"), array("q"), bytearray(), bytearray(), {})
    for number, path in enumerate(paths):
        docs, checked = _index_file(path, whole)
        out.checked.append(checked)
        if isinstance(docs, str):
            out.reasons[number] = docs
            out.counts.append(0)
            continue
        out.counts.append(len(docs))
        for doc in docs:
            name = shown(doc)
            out.keys.extend((_hash(salt, *_identity(doc)), _hash(salt, name),
                             _hash(salt, name, target_of(doc))))
            out.golden.append(_matches_golden(doc, golden))
    return out


def _twice(values: Iterable[int]) -> set[int]:
    """Return the values that occur more than once (sorted: a list of ints, not a set of
    every value, is what a hundred thousand of them cost)."""
    ordered = sorted(values)
    return {a for a, b in pairwise(ordered) if a == b}


class Index:
    """The index pass's findings over every file, packed in arrays: the parent holds a few
    dozen bytes a host report, whatever the fleet's size."""

    def __init__(self) -> None:
        #: Per file, its first report's number; one more at the end (the reports' count).
        self.starts = array("q", [0])
        self.keys = array("q")
        self.golden = bytearray()
        self.checked = bytearray()
        self.reasons: dict[int, str] = {}

    @property
    def files(self) -> int:
        return len(self.checked)

    @property
    def reports(self) -> int:
        return self.starts[-1]

    def add(self, chunk: ChunkIndex) -> None:
        """Add the next chunk's findings."""
        base = self.files
        for count in chunk.counts:
            self.starts.append(self.starts[-1] + count)
        self.keys.extend(chunk.keys)
        self.golden += chunk.golden
        self.checked += chunk.checked
        self.reasons.update((base + n, reason) for n, reason in chunk.reasons.items())

    def replace(self, numbers: Sequence[int], chunk: ChunkIndex) -> None:
        """Put what a whole read of files ``numbers`` found in place of their entries."""
        rebuild = False
        for at, number in enumerate(numbers):
            self.checked[number] = chunk.checked[at]
            if at in chunk.reasons:
                self.reasons[number] = chunk.reasons[at]
            rebuild = rebuild or at in chunk.reasons or (
                chunk.counts[at] != self.starts[number + 1] - self.starts[number])
        if not rebuild:  # the same reports as read by their names: new keys in place
            for at, number in enumerate(numbers):
                first = self.starts[number]
                self.keys[first * KEYS:(first + 1) * KEYS] = chunk.keys[at * KEYS:(at + 1) * KEYS]
                self.golden[first] = chunk.golden[at]
            return
        # A file that now holds no report or another number of them: lay the arrays out
        # again, once (a file read by its names holds one report).
        replaced: dict[int, tuple[array[int], bytearray]] = {}
        first = 0
        for at, number in enumerate(numbers):
            count = chunk.counts[at]
            replaced[number] = (chunk.keys[first * KEYS:(first + count) * KEYS],
                                chunk.golden[first:first + count])
            first += count
        starts, keys, golden = array("q", [0]), array("q"), bytearray()
        for number in range(self.files):
            if number in replaced:
                its_keys, its_golden = replaced[number]
            else:
                a, b = self.starts[number], self.starts[number + 1]
                its_keys, its_golden = self.keys[a * KEYS:b * KEYS], self.golden[a:b]
            keys.extend(its_keys)
            golden += its_golden
            starts.append(len(golden))
        self.starts, self.keys, self.golden = starts, keys, golden

    def key(self, report: int, which: int) -> int:
        """Return one of a report's :data:`KEYS` hashes."""
        return self.keys[report * KEYS + which]

    def file_reports(self, number: int) -> range:
        """Return the numbers of file ``number``'s reports."""
        return range(self.starts[number], self.starts[number + 1])

    def deciding(self) -> list[int]:
        """Return the files read only by their names that decide something: a machine or a
        name another report also has, or the golden host. They are read whole before the
        decision, so a file that holds no report never makes one."""
        shared = [_twice(self.keys[which::KEYS]) for which in range(KEYS)]
        return [number for number in range(self.files) if not self.checked[number] and any(
            self.golden[r] or any(self.key(r, w) in shared[w] for w in range(KEYS))
            for r in self.file_reports(number))]


# -- the reduce pass -----------------------------------------------------------------------


def grouped(doc: ReportDoc) -> dict[str, list[FindingDoc]]:
    """Return the findings by check, in the report's check order (as Report.from_dict)."""
    groups: dict[str, list[FindingDoc]] = {c.check: [] for c in doc.checks}
    for finding in doc.findings:
        groups.setdefault(finding.check, []).append(finding)
    return groups


State = dict[tuple[str, str, str], tuple[str, str]]


def state_of(doc: ReportDoc) -> State:
    """Return what the golden diff compares (:func:`auditor.fleet.golden_diff`'s state)."""
    state: State = {}
    for finding in doc.findings:
        raw = finding.status
        if raw == "pass" and finding.evidence:
            held = finding.evidence.get("waived", "")
            raw = held if held in _ORDER else raw  # type: ignore[assignment]
        value = (raw, finding.observed)
        key = (finding.check, finding.subject, finding.aspect)
        if key not in state or _ORDER[value[0]] > _ORDER[state[key][0]]:
            state[key] = value
    return state


def differences(reference: State, state: State) -> list[tuple[str, ...]]:
    """Return (check, subject, golden status, golden observed, status, observed, aspect)
    for every key where a host differs from the golden host, in key order."""
    found: list[tuple[str, ...]] = []
    for key in sorted(reference.keys() | state.keys()):
        want = reference.get(key, ("", ""))
        have = state.get(key, ("", ""))
        if want != have:
            found.append((key[0], key[1], want[0], want[1], have[0], have[1], key[2]))
    return found


SortKey = tuple[int, str]


def _top(items: Iterable[SortKey], limit: int) -> list[SortKey]:
    return heapq.nsmallest(limit, items)


@dataclass
class Partial:
    """What a chunk of hosts adds to a text fleet report; partials merge in any order."""

    hosts: int = 0
    host_counts: Counter[str] = field(default_factory=Counter)
    skipped_hosts: int = 0
    check_counts: dict[str, Counter[str]] = field(default_factory=dict)
    #: A check's place in the report: the first host (worst first) that has it, and where.
    check_order: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    finding_counts: Counter[str] = field(default_factory=Counter)
    waived: int = 0
    unreachable: list[tuple[str, str]] = field(default_factory=list)
    #: (status, check, label) -> [how many hosts, the first hosts in report order].
    problems: dict[tuple[str, str, str], list[Any]] = field(default_factory=dict)
    #: fingerprint -> [how many hosts, the first hosts in report order].
    groups: dict[str, list[Any]] = field(default_factory=dict)
    compared: int = 0
    #: (host, how many differences, the first differences) of the first differing hosts.
    differ: list[tuple[str, int, list[tuple[str, ...]]]] = field(default_factory=list)
    differ_total: int = 0
    unaudited: bool = False
    trips: bool = False
    #: How many hosts of each fingerprint group are kept (the HTML page lists 50).
    keep: int = LIMIT

    def merge(self, other: Partial) -> None:
        """Add another chunk's partial to this one."""
        self.hosts += other.hosts
        self.host_counts.update(other.host_counts)
        self.skipped_hosts += other.skipped_hosts
        for check, counts in other.check_counts.items():
            self.check_counts.setdefault(check, Counter()).update(counts)
        for check, place in other.check_order.items():
            if check not in self.check_order or place < self.check_order[check]:
                self.check_order[check] = place
        self.finding_counts.update(other.finding_counts)
        self.waived += other.waived
        self.unreachable.extend(other.unreachable)
        _merge_groups(self.problems, other.problems, LIMIT)
        _merge_groups(self.groups, other.groups, self.keep)
        self.compared += other.compared
        self.differ = heapq.nsmallest(4 * LIMIT, self.differ + other.differ)
        self.differ_total += other.differ_total
        self.unaudited = self.unaudited or other.unaudited
        self.trips = self.trips or other.trips


def _merge_groups(into: dict[Any, list[Any]], other: dict[Any, list[Any]], keep: int) -> None:
    for key, (count, first) in other.items():
        mine = into.get(key)
        if mine is None:
            into[key] = [count, first]
        else:
            mine[0] += count
            mine[1] = _top(mine[1] + first, keep)


def _add_to_group(groups: dict[Any, list[Any]], key: Any, sort_key: SortKey,
                  keep: int = LIMIT) -> None:
    entry = groups.get(key)
    if entry is None:
        groups[key] = [1, [sort_key]]
        return
    entry[0] += 1
    first = entry[1]
    if len(first) < keep:
        first.append(sort_key)
    elif sort_key < max(first):
        first.remove(max(first))
        first.append(sort_key)


_BY_ORDER = [s.value for s in Status]


class Summary(NamedTuple):
    """One host's report reduced to what fleet reports show of it."""

    status: str
    cells: dict[str, str]
    any_skip: bool
    counts: Counter[str]
    waived: int
    #: (status, check, label) of each finding that counts as a problem.
    problems: list[tuple[str, str, str]]
    trips: bool
    stamp: str
    #: The differences from the golden host (None: not compared).
    found: list[tuple[str, ...]] | None


def summarize(doc: ReportDoc, golden: State | None, is_golden: bool,
              fail_on: FailOn) -> Summary:
    """Reduce one host's report in one walk over its findings.

    The roll-ups are :func:`auditor.model.worst` of each check's counted statuses, the
    fingerprint :func:`auditor.model.fingerprint`'s, the differences
    :func:`auditor.fleet.golden_diff`'s: the tests hold them to the model's functions.
    """
    judged: dict[str, int] = {c.check: -1 for c in doc.checks}
    skipped: set[str] = set()
    counts: Counter[str] = Counter()
    waived = 0
    any_skip = False
    problems: list[tuple[str, str, str]] = []
    items: list[tuple[str, str, str, str, str]] = []
    compare = golden is not None and not is_golden and not doc.error
    state: State = {}
    trips = False
    threshold = fail_on.trips
    order, rank = _ORDER, _RANK
    status: str
    raw: str
    for f in doc.findings:
        status, check = f.status, f.check
        if f.waived:
            waived += 1
            counted = "pass"
        else:
            counts[status] += 1
            counted = status
        if status == "skip":
            any_skip = True
        if counted == "skip":
            skipped.add(check)
            judged.setdefault(check, -1)
        elif order[counted] > judged.get(check, -1):
            judged[check] = order[counted]
        raw = status
        if status == "pass" and f.evidence:
            held = f.evidence.get("waived")
            if held in order:
                raw = held
        items.append((check, f.subject, f.aspect, raw, f.observed))
        if compare:
            key = (check, f.subject, f.aspect)
            seen = state.get(key)
            if seen is None or order[raw] > order[seen[0]]:
                state[key] = (raw, f.observed)
        if rank[counted]:
            label = f"{f.subject} [{f.aspect}]" if f.aspect else f.subject
            problems.append((status, check, label))
            if not trips and threshold(_STATUS[counted]):
                trips = True
    cells = {check: (_BY_ORDER[value] if value >= 0 else "skip" if check in skipped
                     else "pass") for check, value in judged.items()}
    if doc.error:
        status = "error"
    else:
        judged_cells = [order[c] for c in cells.values() if c != "skip"]
        status = (_BY_ORDER[max(judged_cells)] if judged_cells
                  else "skip" if cells else "pass")
    stamp = "" if doc.error else _stamp(sorted(set(items)), sorted(judged))
    found = differences(golden, state) if compare and golden is not None else None
    return Summary(status, cells, any_skip, counts, waived, problems, trips, stamp, found)


def _stamp(findings: list[tuple[str, str, str, str, str]], checks: list[str]) -> str:
    canonical = msgspec.json.encode({"checks": checks, "findings": findings,
                                     "version": FINGERPRINT_VERSION})
    # auditor.model.fingerprint hashes json.dumps(sort_keys, compact, ensure_ascii): msgspec
    # writes the same bytes for ASCII text (keys given sorted here); other text is escaped.
    if not canonical.isascii():
        import json

        canonical = json.dumps(msgspec.json.decode(canonical), sort_keys=True,
                               separators=(",", ":"), ensure_ascii=True).encode()
    return hashlib.sha256(canonical).hexdigest()[:FINGERPRINT_LENGTH]


def _tally(partial: Partial, doc: ReportDoc, summary: Summary) -> None:
    """Count one host in a partial: what the exit code and a format that holds every host
    need of the fleet view (:func:`reduce_text` adds the rest)."""
    partial.hosts += 1
    partial.host_counts[summary.status] += 1
    partial.trips = partial.trips or summary.trips
    partial.unaudited = partial.unaudited or bool(doc.error)


def reduce_text(partial: Partial, doc: ReportDoc, name: str, golden: State | None,
                is_golden: bool, fail_on: FailOn) -> Summary:
    """Add one host's report to a text partial; return its summary."""
    summary = summarize(doc, golden, is_golden, fail_on)
    status = summary.status
    sort_key: SortKey = (-_ORDER[status], name)
    _tally(partial, doc, summary)
    partial.skipped_hosts += summary.any_skip
    check_counts, check_order = partial.check_counts, partial.check_order
    for position, (check, cell) in enumerate(summary.cells.items()):
        counter = check_counts.get(check)
        if counter is None:
            counter = check_counts[check] = Counter()
        counter[cell] += 1
        place = (sort_key[0], name, position)
        if check not in check_order or place < check_order[check]:
            check_order[check] = place
    partial.finding_counts.update(summary.counts)
    partial.waived += summary.waived
    for key in summary.problems:
        _add_to_group(partial.problems, key, sort_key)
    if doc.error:
        partial.unreachable.append((name, doc.error))
        return summary
    _add_to_group(partial.groups, summary.stamp, sort_key, partial.keep)
    found = summary.found
    if found is not None:
        partial.compared += 1
        if found:
            partial.differ_total += 1
            entry = (name, len(found), found[:LIMIT])
            if len(partial.differ) < 4 * LIMIT:
                partial.differ.append(entry)
                partial.differ.sort()
            elif entry < partial.differ[-1]:
                partial.differ[-1] = entry
                partial.differ.sort()
    return summary


# -- typed documents back to reports -------------------------------------------------------


def report_of(doc: ReportDoc, name: str | None = None) -> Report:
    """Return the report a typed document holds (listed as ``name``, where given)."""
    findings_by_check = grouped(doc)
    durations = {c.check: c.duration_s for c in doc.checks}
    results = []
    for check, items in findings_by_check.items():
        findings = []
        for f in items:
            finding = object.__new__(Finding)
            finding.__dict__.update(
                check=f.check, status=_STATUS[f.status], severity=_SEVERITY[f.severity],
                subject=f.subject, message=f.message, observed=f.observed,
                expected=f.expected, fix=f.fix, host=f.host, evidence=tuple(f.evidence.items()),
                aspect=f.aspect, waived=f.waived, waiver=f.waiver)
            findings.append(finding)
        results.append(CheckResult(check, durations.get(check, 0.0), tuple(findings)))
    return Report(
        host=doc.host if name is None else name, target=target_of(doc), started=doc.started,
        duration_s=doc.duration_s, name="" if name is not None else doc.name,
        aliases=tuple(doc.aliases),
        results=tuple(results), facts=tuple(doc.facts.items()), error=doc.error,
        timing=tuple((k.removesuffix("_s"), v) for k, v in doc.timing.items()),
        version=doc.tool.version if doc.tool is not None else "",
        policy=tuple(doc.policy.items()),
    )


def machine_of_doc(doc: ReportDoc, summary: Summary) -> Machine:
    """Return what the Prometheus exposition says of a typed document: the same as
    :func:`auditor.prom.machine_of` of its :func:`report_of` (the tests hold them so), without
    making the report."""
    from auditor.prom import Machine, comment_line

    facts = doc.facts
    machine_id = facts.get("machine_id", "")
    who = [("host", doc.host)]
    if doc.name:
        who.append(("target", doc.name))
    if machine_id:
        who.append(("machine_id", machine_id))
    counts = summary.counts
    name = doc.name
    identity = f"{name} ({doc.host})" if name and name != doc.host else name or doc.host
    return Machine(
        who=who,
        findings=list(chain.from_iterable(grouped(doc).values())),
        checks=summary.cells.items(),
        counts=[*((status, counts.get(status, 0)) for status in _BY_ORDER),
                ("waived", summary.waived)],
        error=doc.error, started=doc.started, duration_s=doc.duration_s,
        fingerprint=summary.stamp,
        comment=comment_line(doc.tool.version if doc.tool is not None else "", identity,
                             doc.aliases, facts.get("privilege", "")))


def json_body(doc: ReportDoc, summary: Summary) -> dict[str, Any]:
    """Return a host's entry of the merged JSON: :meth:`Report.to_dict` of its
    :func:`report_of` with its fingerprint (the tests hold them so), without making the
    report."""
    by_check = grouped(doc)
    durations = {c.check: c.duration_s for c in doc.checks}
    counts = summary.counts
    data: dict[str, Any] = {
        "host": doc.host,
        "target": target_of(doc),
        **({"name": doc.name} if doc.name else {}),
        **({"aliases": doc.aliases} if doc.aliases else {}),
        "started": doc.started,
        "duration_s": round(doc.duration_s, 4),
        "summary": {**{status: counts.get(status, 0) for status in _BY_ORDER},
                    "waived": summary.waived},
        "facts": doc.facts,
        "checks": [{"check": check, "status": status,
                    "duration_s": round(durations.get(check, 0.0), 4)}
                   for check, status in summary.cells.items()],
        "findings": [_finding_body(f) for items in by_check.values() for f in items],
    }
    if doc.timing:
        data["timing"] = {f"{key.removesuffix('_s')}_s": round(value, 4)
                          for key, value in doc.timing.items()}
    version = doc.tool.version if doc.tool is not None else ""
    if version:
        data["tool"] = {"name": "host-auditor", "version": version}
    if doc.policy:
        data["policy"] = doc.policy
    if doc.error:
        data["error"] = doc.error
    data["fingerprint"] = summary.stamp
    return data


def _finding_body(f: FindingDoc) -> dict[str, Any]:
    data: dict[str, Any] = {
        "check": f.check, "host": f.host, "status": f.status, "severity": f.severity,
        "subject": f.subject, "aspect": f.aspect, "observed": f.observed,
        "expected": f.expected, "message": f.message, "fix": f.fix, "evidence": f.evidence,
        "waived": f.waived,
    }
    if f.waived:
        data["waiver"] = f.waiver
    return data


# -- the passes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the reduce pass needs to know: which documents to take, and how to name hosts."""

    fmt: str
    salt: bytes
    golden: str | None
    golden_state: State | None
    fail_on: FailOn
    names: frozenset[int]
    pairs: frozenset[int]
    #: The page's columns (html: known after a first reduce pass; None in that pass).
    checks: tuple[str, ...] | None = None


class Task(NamedTuple):
    """One chunk of files for the reduce pass, with the documents of each file to skip."""

    paths: tuple[str, ...]
    #: Per file, the documents to leave out (None: the whole file, unreadable in the index).
    skip: tuple[frozenset[int] | None, ...]
    golden: tuple[int, int]  # (file in this chunk, document) of the golden host, or (-1, -1)
    #: Per file, whether the index pass read it whole (else a reduce pass says why not).
    checked: tuple[bool, ...] = ()


class HostPiece(NamedTuple):
    """A host's rendered piece for a format that holds every host, and where it sorts."""

    sort_key: SortKey
    name: str
    data: bytes


@dataclass
class Reduced:
    """What one chunk of the reduce pass returns."""

    partial: Partial
    #: Hosts whose file changed between the two passes (left out, with the reason).
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    #: The rendered hosts (json, html, line) or blocks (prometheus) of the chunk.
    pieces: list[HostPiece] = field(default_factory=list)
    #: html: each differing host's rows of the golden-diff table.
    diffs: list[HostPiece] = field(default_factory=list)
    blocks: dict[str, bytes] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


_PLAN: Plan | None = None


def _reduce_chunk(task: Task) -> Reduced:
    assert _PLAN is not None
    plan = _PLAN
    out = Reduced(Partial(keep=50 if plan.fmt == "html" else LIMIT))
    exposition: Exposition | None = None
    if plan.fmt == "prometheus":
        from auditor.prom import Exposition

        exposition = Exposition()
    for index, (path, skip) in enumerate(zip(task.paths, task.skip, strict=True)):
        if skip is None:
            continue
        raw = read_result(path)
        docs = raw if isinstance(raw, OSError) else decode(raw)
        if isinstance(docs, (OSError, str)):
            read_whole = not task.checked or task.checked[index]
            out.unreadable.append((index, "changed while it was being merged" if read_whole
                                   or isinstance(docs, OSError) else docs))
            continue
        for number, doc in enumerate(docs):
            if number in skip:
                continue
            name = display_names(doc, plan.salt, plan.names, plan.pairs)
            is_golden = (index, number) == task.golden
            if plan.fmt == "text" or (plan.fmt == "html" and plan.checks is None):
                reduce_text(out.partial, doc, name, plan.golden_state, is_golden, plan.fail_on)
            elif plan.fmt == "html":
                _render_row(out, doc, name, plan, is_golden)
            elif exposition is not None:
                # The exposition has no golden diff (compare nothing) and no fleet view:
                # the host is counted, not reduced.
                summary = summarize(doc, None, is_golden, plan.fail_on)
                _tally(out.partial, doc, summary)
                exposition.add(machine_of_doc(doc, summary))
            else:
                _reduce_rendered(out, doc, name, plan, is_golden)
    if exposition is not None and exposition.comments:
        comments, blocks = exposition.comments, exposition.blocks
        out.blocks = {"": _lines(comments), **{name: _lines(lines)
                                               for name, lines in blocks.items()}}
    return out


def _lines(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _reduce_rendered(out: Reduced, doc: ReportDoc, name: str, plan: Plan,
                     is_golden: bool) -> None:
    """Add one host to a chunk of json or line output (formats that hold every host)."""
    summary = reduce_text(out.partial, doc, name, plan.golden_state, is_golden, plan.fail_on)
    sort_key: SortKey = (-_ORDER[summary.status], name)
    if plan.fmt == "line":
        from auditor.engines import report_line

        line = report_line(report_of(doc, name), prefix=name) + "\n"
        out.pieces.append(HostPiece(sort_key, name, line.encode("utf-8", "surrogatepass")))
        return
    out.extra.setdefault("hosts", []).append((sort_key, name, summary.stamp, summary.cells,
                                              summary.found, not doc.error))
    out.pieces.append(HostPiece(sort_key, name, msgspec.json.encode(json_body(doc, summary))))


_PARTS: Any = None


def _render_row(out: Reduced, doc: ReportDoc, name: str, plan: Plan, is_golden: bool) -> None:
    """Render one host's row of the fleet page (and its golden-diff rows)."""
    global _PARTS
    from markupsafe import Markup

    from auditor.fleet import Cell, Difference

    if _PARTS is None:
        from auditor.render import make_environment

        _PARTS = make_environment("html").get_template("fleet_parts.html.j2").module
    assert plan.checks is not None
    summary = summarize(doc, plan.golden_state, is_golden, plan.fail_on)
    report = report_of(doc, name)
    differs = {d[0] for d in summary.found or ()}
    row = {r.check: Cell(status=summary.cells[r.check], findings=r.findings,
                         differs=r.check in differs) for r in report.results}
    cells = "".join([_cell_html(check, row.get(check)) for check in plan.checks])
    html = str(_PARTS.row_frame(report, summary.status, summary.stamp, plan.golden,
                                caller=lambda: Markup(cells)))  # noqa: S704 - rendered
    sort_key: SortKey = (-_ORDER[summary.status], name)
    out.pieces.append(HostPiece(sort_key, name, html.encode("utf-8", "surrogatepass")))
    if summary.found:
        rows = str(_PARTS.diff_rows(name, [Difference(*d) for d in summary.found]))
        out.diffs.append(HostPiece((0, name), name, rows.encode("utf-8", "surrogatepass")))


#: Cells rendered in this worker, by what they show: a fleet's hosts share most of their
#: cells (the same check passing the same way), and a cell is most of a row's rendering.
_CELLS: dict[tuple[Any, ...], str] = {}
_CELLS_KEPT = 4096


def _cell_html(check: str, cell: Cell | None) -> str:
    """Return a grid cell as the page's ``check_cell`` macro renders it, from the cache
    where a cell that shows the same was rendered before (the finding's host is not
    shown in a cell, so it is not in the key)."""
    key: tuple[Any, ...] = (check,) if cell is None else (check, cell.status, cell.differs, *(
        (f.status, f.waived, f.waiver, f.subject, f.aspect, f.message, f.observed,
         f.expected, f.fix) for f in cell.findings))
    html = _CELLS.get(key)
    if html is None:
        if len(_CELLS) >= _CELLS_KEPT:
            _CELLS.clear()
        html = _CELLS[key] = str(_PARTS.check_cell(check, cell))
    return html


def _init(plan: Plan) -> None:
    global _PLAN
    _PLAN = plan


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def default_jobs() -> int:
    """Return how many processes a merge uses: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _one_thread() -> bool:
    """Say whether this process runs one thread, counting threads Python did not start."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        import threading

        return threading.active_count() == 1


def _start_worker(initializer: Callable[..., None] | None = None, *initargs: Any) -> None:
    """Start a worker: SIGTERM ends it, and what it holds now (imports, the plan) stays
    out of the cycle collector's walks, which otherwise go over it again and again as
    documents are decoded (a merge makes no cycles: what a file gave is freed when the next
    is read)."""
    import gc
    import signal

    # The parent stops a worker with SIGTERM when the work is done or interrupted (and
    # hears Ctrl-C itself): a handler a forked worker inherits from the command would
    # print a traceback as it went.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)
    gc.freeze()


class Pool:
    """Runs a function over tasks in order: in worker processes, or here for one job."""

    def __init__(self, jobs: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = ()) -> None:
        self.jobs = jobs
        self._pool: Any = None
        if initializer is not None:
            initializer(*initargs)
        if jobs > 1:
            import multiprocessing

            if _one_thread():
                # fork: the workers share the parent's imports and the plan set just above.
                self._pool = multiprocessing.get_context("fork").Pool(jobs, _start_worker)
            else:
                # A process with other threads (an embedding program, a test runner) must not
                # fork: a lock another thread held is held for ever in the child, and the
                # child shares that thread's pipes. A fork server's clean process forks the
                # workers instead, and they get the plan from the initializer.
                self._pool = multiprocessing.get_context("forkserver").Pool(
                    jobs, _start_worker, (initializer, *initargs))

    def map(self, func: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Yield ``func(task)`` for each task, in the tasks' order."""
        if self._pool is None:
            return map(func, tasks)
        result: Iterator[Any] = self._pool.imap(func, tasks, chunksize=1)
        return result

    def close(self) -> None:
        """Stop the workers."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


# -- the merge -----------------------------------------------------------------------------


class MergeError(Exception):
    """A merge that cannot go on (no readable result, an unknown golden host)."""

    def __init__(self, message: str, unreadable: Sequence[Unreadable] = ()) -> None:
        super().__init__(message)
        self.unreadable = list(unreadable)


class Extents:
    """(offset, length) pairs of spooled output, packed: a large fleet's Prometheus output
    is a block per metric family per chunk, tens of thousands of them."""

    def __init__(self) -> None:
        self._pairs = array("q")

    def append(self, extent: tuple[int, int]) -> None:
        """Add one extent (an empty one adds nothing)."""
        if extent[1]:
            self._pairs.extend(extent)

    def extend(self, extents: Iterable[tuple[int, int]]) -> None:
        """Add extents in order."""
        for extent in extents:
            self.append(extent)

    def __len__(self) -> int:
        return len(self._pairs) // 2

    def __iter__(self) -> Iterator[tuple[int, int]]:
        pairs = self._pairs
        return ((pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2))


@dataclass
class Merged:
    """A merged fleet: the text view's figures, and the rendered output of other formats."""

    fmt: str
    partial: Partial
    checks: list[str]
    unreadable: list[Unreadable]
    notes: list[str]
    golden: str | None
    hosts: int
    exit_code: int
    spool: IO[bytes] | None = None
    extents: Extents = field(default_factory=Extents)

    def chunks(self) -> Iterator[bytes]:
        """Yield the rendered output (formats other than text) from the spool."""
        if self.spool is None:
            return
        for offset, length in self.extents:
            done = 0
            while done < length:
                piece = os.pread(self.spool.fileno(), min(length - done, 1 << 20),
                                 offset + done)
                if not piece:
                    return
                done += len(piece)
                yield piece

    def close(self) -> None:
        """Drop the spool."""
        if self.spool is not None:
            self.spool.close()
            self.spool = None


def merge(paths: Sequence[str], fmt: str, *, golden: str | None = None,
          fail_on: FailOn = FailOn.FAIL, jobs: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> Merged:
    """Merge per-host result files into one fleet report in format ``fmt``."""
    salt = secrets.token_bytes(16)
    n_chunks = (len(paths) + CHUNK_FILES - 1) // CHUNK_FILES
    jobs = max(1, min(jobs or default_jobs(), n_chunks))
    index = Index()
    pool = Pool(jobs)
    try:
        for found in pool.map(_index_chunk, ((c, salt, golden, False)
                                             for c in _chunks(paths, CHUNK_FILES))):
            index.add(found)
            if progress is not None:
                progress(index.files, len(paths) * (3 if fmt == "html" else 2))
        deciding = index.deciding()
        checked = pool.map(_index_chunk, (([paths[n] for n in numbers], salt, golden, True)
                                          for numbers in _chunks(deciding, CHUNK_FILES)))
        for numbers, found in zip(_chunks(deciding, CHUNK_FILES), checked, strict=True):
            index.replace(numbers, found)
    finally:
        pool.close()
    # Where each unreadable file is: a reduce pass finds those read by their names only.
    unreadable_at = dict(index.reasons)
    unreadable = [Unreadable(paths[i], reason) for i, reason in sorted(unreadable_at.items())]
    if not index.reports:
        raise MergeError("no readable results to merge", unreadable)
    try:
        skip, notes, golden_at, names, pairs = _resolve(paths, index, salt, golden)
    except MergeError as exc:
        raise MergeError(str(exc), unreadable) from None
    golden_state = None
    if golden is not None:
        try:
            golden_state = _golden_state(paths, golden_at, golden)
        except MergeError as exc:
            raise MergeError(str(exc), unreadable) from None
    plan = Plan(fmt, salt, golden, golden_state, fail_on, frozenset(names), frozenset(pairs))

    def tasks() -> Iterator[Task]:
        for number in range(n_chunks):
            start = number * CHUNK_FILES
            files = range(start, min(start + CHUNK_FILES, len(paths)))
            at = (golden_at[0] - start, golden_at[1]) if golden_at[0] in files else (-1, -1)
            yield Task(tuple(paths[start:files.stop]), tuple(
                None if f in index.reasons else skip.get(f, frozenset()) for f in files),
                at, tuple(bool(index.checked[f]) for f in files))

    total = Partial(keep=50 if fmt == "html" else LIMIT)
    assembler = _Assembler(fmt, golden)
    passes = [plan]
    if fmt == "html":  # a first pass finds the page's columns, the second renders its rows
        passes.append(plan)
    for number, this in enumerate(passes):
        if number:
            checks = sorted(total.check_order, key=total.check_order.__getitem__)
            this = dataclasses.replace(this, checks=tuple(checks))
        pool = Pool(jobs, _init, (this,))
        try:
            for at_chunk, reduced in enumerate(pool.map(_reduce_chunk, tasks())):
                start = at_chunk * CHUNK_FILES
                for at, reason in reduced.unreadable:
                    unreadable_at.setdefault(start + at, reason)
                if number == 0:
                    total.merge(reduced.partial)
                assembler.add(reduced)
                if progress is not None:
                    progress(len(paths) * (1 + number) + min(start + CHUNK_FILES, len(paths)),
                             len(paths) * (1 + len(passes)))
        finally:
            pool.close()
        unreadable = [Unreadable(paths[i], unreadable_at[i]) for i in sorted(unreadable_at)]
        if not total.hosts:
            raise MergeError("no readable results to merge", unreadable)
    checks = sorted(total.check_order, key=total.check_order.__getitem__)
    code = 3 if total.unaudited else (1 if total.trips else 0)
    merged = Merged(fmt, total, checks, unreadable, notes, golden, total.hosts, code)
    if fmt != "text":
        assembler.finish(merged)
    return merged


def _resolve(paths: Sequence[str], index: Index, salt: bytes,
             golden: str | None) -> tuple[dict[int, frozenset[int]], list[str],
                                          tuple[int, int], set[int], set[int]]:
    """Pick one report per host, find the golden host, and the names that collide.

    Only what repeats is held in a dictionary: the machines reported twice, the names that
    two kept reports share; the rest of the fleet stays in the index's arrays."""
    repeated = _twice(index.keys[IDENTITY::KEYS])
    first: dict[int, tuple[int, int]] = {}
    dropped: set[int] = set()
    skip: dict[int, set[int]] = {}
    notes: list[str] = []
    for file_number in range(index.files):
        reports = index.file_reports(file_number)
        for doc_number, report in enumerate(reports):
            identity = index.key(report, IDENTITY)
            if identity not in repeated:
                continue
            seen = first.get(identity)
            if seen is None:
                first[identity] = (file_number, doc_number)
                continue
            keep, drop, note = _pick(paths, seen, (file_number, doc_number))
            notes.append(note)
            first[identity] = keep
            skip.setdefault(drop[0], set()).add(drop[1])
            dropped.add(index.starts[drop[0]] + drop[1])

    def kept(which: int) -> Iterator[int]:
        keys = index.keys
        return (keys[r * KEYS + which] for r in range(index.reports) if r not in dropped)

    golden_at = []
    at = index.golden.find(1)
    while at >= 0:
        if at not in dropped:
            golden_at.append(at)
        at = index.golden.find(1, at + 1)
    if golden is not None:
        if not golden_at:
            raise MergeError(f"golden host {golden!r} is not among the merged results (a host "
                             "is named by its report's host or target, not its file)")
        if len(golden_at) > 1:
            raise MergeError(f"golden host {golden!r} names {len(golden_at)} machines: name "
                             "one as 'HOST (TARGET)'")
    where = (-1, -1)
    if golden_at:
        file_number = bisect_right(index.starts, golden_at[0]) - 1
        where = (file_number, golden_at[0] - index.starts[file_number])
    return ({f: frozenset(d) for f, d in skip.items()}, notes, where,
            _twice(kept(NAME)), _twice(kept(NAME_TARGET)))


def _load(path: str, number: int) -> ReportDoc:
    raw = read_result(path)
    docs = raw if isinstance(raw, OSError) else decode(raw)
    if isinstance(docs, (OSError, str)) or number >= len(docs):
        raise MergeError(f"{printable(path)}: changed while it was being merged")
    return docs[number]


def _pick(paths: Sequence[str], kept: tuple[int, int], other: tuple[int, int]
          ) -> tuple[tuple[int, int], tuple[int, int], str]:
    """Return which of two reports of one machine to keep, the other, and the note."""
    ours, theirs = _load(paths[kept[0]], kept[1]), _load(paths[other[0]], other[1])
    mine = report_of(ours)
    chosen, why = pick_report(mine, report_of(theirs))
    keep, drop = (kept, other) if chosen is mine else (other, kept)
    a, b = paths[kept[0]], paths[other[0]]
    if ours.host == theirs.host and target_of(ours) == target_of(theirs):
        what = f"{ours.host}: reported by {a} and {b}"
    else:
        what = (f"{ours.host} ({target_of(ours)}) and {theirs.host} ({target_of(theirs)}) are "
                f"the same machine (machine id {machine_id(ours)[:12]}): reported by {a} and {b}")
    return keep, drop, printable(f"{what}; keeping {paths[keep[0]]} ({why})")


def _golden_state(paths: Sequence[str], at: tuple[int, int], golden: str) -> State:
    doc = _load(paths[at[0]], at[1])
    if doc.error:
        raise MergeError(f"golden host {golden!r} could not be audited: pick another")
    return state_of(doc)


# -- formats that hold every host ----------------------------------------------------------


class _Assembler:
    """Spools the rendered pieces of each chunk and lays them out in the format's order."""

    def __init__(self, fmt: str, golden: str | None) -> None:
        self.fmt = fmt
        self.golden = golden
        # An unnamed file (O_TMPFILE where the file system has it): nobody else can open it.
        self.spool: IO[bytes] = tempfile.TemporaryFile(prefix="host-auditor-merge-")
        self.size = 0
        #: (sort key, name, offset, length) per host.
        self.pieces: list[tuple[SortKey, str, int, int]] = []
        #: Prometheus: the extents of each block, chunk by chunk.
        self.blocks: dict[str, Extents] = {}
        self.hosts: list[tuple[Any, ...]] = []
        #: html: (host, offset, length) of each differing host's golden-diff rows.
        self.diffs: list[tuple[str, int, int]] = []

    def _put(self, data: bytes) -> tuple[int, int]:
        offset = self.size
        self.spool.write(data)
        self.size += len(data)
        return offset, len(data)

    def add(self, reduced: Reduced) -> None:
        """Spool one chunk's pieces."""
        for piece in reduced.pieces:
            offset, length = self._put(piece.data)
            self.pieces.append((piece.sort_key, piece.name, offset, length))
        for name, data in reduced.blocks.items():
            self.blocks.setdefault(name, Extents()).append(self._put(data))
        for piece in reduced.diffs:
            offset, length = self._put(piece.data)
            self.diffs.append((piece.name, offset, length))
        self.hosts.extend(reduced.extra.get("hosts", ()))

    def finish(self, merged: Merged) -> None:
        """Write the output's parts to the spool in order and hand it to ``merged``."""
        extents = Extents()
        if self.fmt == "prometheus":
            from auditor.prom import family_header

            extents.extend(self.blocks.get("", ()))
            for name, parts in self.blocks.items():
                if not name or not parts:
                    continue
                extents.append(self._put(family_header(name).encode()))
                extents.extend(parts)
        elif self.fmt == "line":
            self.pieces.sort()
            extents.extend((offset, length) for _, _, offset, length in self.pieces)
        elif self.fmt == "json":
            extents.extend(self._json(merged))
        else:
            extents.extend(self._html(merged))
        self.spool.flush()
        merged.spool = self.spool
        merged.extents = extents

    def _summary(self, merged: Merged) -> dict[str, Any]:
        partial = merged.partial
        counts = {s.value: partial.finding_counts.get(s.value, 0) for s in Status}
        counts["waived"] = partial.waived
        return {
            "hosts": partial.hosts,
            "unreachable": len(partial.unreachable),
            "hosts_by_status": {s.value: partial.host_counts.get(s.value, 0) for s in Status},
            "checks": {check: {s.value: partial.check_counts[check].get(s.value, 0)
                               for s in Status} for check in merged.checks},
            "findings": counts,
        }

    def _fingerprint_groups(self) -> list[tuple[str, list[str]]]:
        ordered = sorted(self.hosts, key=lambda h: h[0])
        groups: dict[str, list[str]] = {}
        for _, name, stamp, _, _, audited in ordered:
            if audited:
                groups.setdefault(stamp, []).append(name)
        return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))

    def _json(self, merged: Merged) -> list[tuple[int, int]]:
        head: dict[str, Any] = {
            "summary": self._summary(merged),
            "unreadable": [{"path": u.path, "reason": u.reason} for u in merged.unreadable],
            "notes": list(merged.notes),
            "fingerprints": dict(self._fingerprint_groups()),
            "grid": {name: cells for _, name, _, cells, _, _ in self.hosts},
        }
        if self.golden is not None:
            found = {name: diff for _, name, _, _, diff, _ in self.hosts if diff is not None}
            head["golden"] = {
                "host": self.golden,
                "same": sorted(h for h, d in found.items() if not d),
                "differ": {h: [_difference_dict(d) for d in diffs]
                           for h, diffs in sorted(found.items()) if diffs},
            }
        text = _dumps_indented(head)
        self.pieces.sort()
        extents = [self._put(text[:-2].encode("utf-8", "surrogatepass") + b',\n "hosts": [\n')]
        for number, (_, _, offset, length) in enumerate(self.pieces):
            if number:
                extents.append(self._put(b",\n"))
            extents.append((offset, length))
        extents.append(self._put(b"\n ]\n}\n"))
        return extents

    def _html(self, merged: Merged) -> list[tuple[int, int]]:
        from auditor.render import make_environment

        parts: Any = make_environment("html").get_template("fleet_parts.html.j2").module
        view = text_view(merged, None)

        def put(html: Any) -> tuple[int, int]:
            return self._put(str(html).encode("utf-8", "surrogatepass"))

        extents = [put(parts.head(view.hosts, view.host_counts, view.skipped_hosts,
                                  len(view.unreadable), view.golden, view.checks))]
        self.pieces.sort()
        extents.extend((offset, length) for _, _, offset, length in self.pieces)
        extents.append(put(parts.grid_end()))
        if self.golden is not None:
            self.diffs.sort()
            extents.append(put(parts.diff_head(self.golden, view.differ_total, view.compared)))
            extents.extend((offset, length) for _, offset, length in self.diffs)
            extents.append(put(parts.diff_end(view.differ_total)))
        extents.append(put(parts.tail(view.groups, view.unreadable, view.notes)))
        return extents


def _difference_dict(d: Sequence[str]) -> dict[str, Any]:
    return {"check": d[0], "subject": d[1], "aspect": d[6],
            "golden": {"status": d[2], "observed": d[3]},
            "host": {"status": d[4], "observed": d[5]}}


def _dumps_indented(data: Any) -> str:
    # json.dumps(indent=1)'s bytes for what the head holds (text, whole numbers), in C.
    return msgspec.json.format(msgspec.json.encode(data), indent=1).decode()


def text_view(merged: Merged, groups_shown: int | None = LIMIT) -> TextView:
    """Return the text report's view of a merge, with its ``groups_shown`` largest
    fingerprint groups (None: all, as the HTML page lists them)."""
    from auditor.fleet import Difference

    partial = merged.partial
    every = [s.value for s in Status]
    problems = sorted(
        ((status, check, label, count, [name for _, name in sorted(first)])
         for (status, check, label), (count, first) in partial.problems.items()),
        key=lambda p: (-_ORDER[p[0]], -p[3], p[:3]))
    # The largest groups only: a fleet can hold as many fingerprints as hosts.
    largest = heapq.nsmallest(len(partial.groups) if groups_shown is None else groups_shown,
                              partial.groups.items(), key=lambda item: (-item[1][0], item[0]))
    groups = [(stamp, count, [name for _, name in sorted(first)])
              for stamp, (count, first) in largest]
    return TextView(
        hosts=partial.hosts,
        host_counts={s: partial.host_counts.get(s, 0) for s in every},
        skipped_hosts=partial.skipped_hosts,
        checks=merged.checks,
        check_counts={c: {s: partial.check_counts[c].get(s, 0) for s in every}
                      for c in merged.checks},
        unreachable=sorted(partial.unreachable),
        problems=problems,
        groups=groups,
        group_count=len(partial.groups),
        golden=merged.golden,
        compared=partial.compared,
        differ_total=partial.differ_total,
        differ=[(host, count, [Difference(*d) for d in found])
                for host, count, found in sorted(partial.differ)],
        unreadable=merged.unreadable,
        notes=merged.notes,
    )


__all__ = ["MAX_RESULT", "MergeError", "Merged", "merge", "text_view"]
