"""``audit snapshot``: capture exactly what the checks read, as a sysroot ``.tar.gz``.

The capture is made by the collector (:mod:`auditor.hosts.collect`) from the selected
checks' ``reads`` patterns, so ``audit local --root capture.tar.gz`` replays the
audit as it ran on the host. Device entries keep their major and minor; the
collector never takes a secret (process environments, memory, keys). Each capture
carries its manifest (:mod:`auditor.manifest`), so a replay knows what was never
collected from what the host lacks.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
import tarfile
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.check import CheckClass
from auditor.errors import SnapshotError, UsageError
from auditor.hosts.base import MAX_PATH_PARTS, Entry, Host, printable

if TYPE_CHECKING:
    from auditor.hosts.ssh import SshOptions


@dataclass(frozen=True)
class Capture:
    """A snapshot: the gzip tar sysroot, and what it holds."""

    data: bytes
    host: str
    target: str
    checks: int
    entries: int
    devices: int
    note: str = ""

    def summary(self, where: str) -> str:
        """Return the one line that says what was captured and where it went."""
        return printable(
            f"snapshot of {self.host} ({self.target}) for {self.checks} checks: "
            f"{self.entries} entries, {self.devices} device nodes, {len(self.data)} bytes "
            f"-> {where}" + (f" ({self.note})" if self.note else ""))


def write_capture(output: str, data: bytes) -> None:
    """Write a capture to ``output`` atomically (``-``: stdout), never through another
    user's symlink or onto a device (:func:`auditor.outfile.write_file`)."""
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    from auditor.outfile import write_file

    try:
        write_file(output, data, 0o644)
    except OSError as exc:
        raise UsageError(f"{output}: cannot write capture ({exc.strerror})") from exc


#: Paths a snapshot never carries: the machine-id is confidential (machine-id(5)); a
#: report carries only its app-specific hash.
NEVER_KEPT = frozenset({"/etc/machine-id"})
_PROCESS = re.compile(r"/proc/([0-9]+)(?:/|$)")
_MAX_LINKS = 40
#: What is kept of pid 1 and of the reader: the paths below /proc/PID. ``mounts`` is the
#: mount table /proc/mounts names (ipc.shm reads /dev/shm's line in it): readable by
#: every user of the host, and no process's own data.
_PLACING = frozenset({"", "/ns", "/ns/pid", "/cgroup", "/uid_map", "/mounts"})


@dataclass(frozen=True)
class Rebuilt:
    """A snapshot rebuilt from what was parsed: the gzip tar and what it holds."""

    data: bytes
    entries: int
    devices: int


def rebuild(source: Host, patterns: Sequence[str], daemons: frozenset[str],
            tool_files: Mapping[str, bytes] | None = None) -> Rebuilt:
    """Return a gzip tar sysroot of what ``patterns`` reach in ``source``, and nothing else.

    The tar is written anew from what was parsed, never copied: names normalised, only
    directories, regular files (at most FILE_CAP bytes), symlinks, and character or block
    devices under /dev; nothing the collector never collects (keys, process memory); the
    machine-id left out; of the process list, only the processes named in ``daemons``;
    the secrets of what is kept withheld (:mod:`auditor.redact`).
    ``tool_files`` (path: bytes) are host-auditor's own files, written into its folder
    (``/host-auditor``: the manifest); nothing of the host's is ever kept there.
    """
    from auditor.hosts.collect import FILE_CAP
    from auditor.manifest import FOLDER
    from auditor.redact import redact
    from auditor.shipped.collector_script import denied

    kept: dict[str, Entry] = {}
    # Processes: a /proc/PID entry only where PID is a daemon a check looks for.
    processes = {m.group(1) for path in source.glob("/proc/[0-9]*/comm")
                 if (m := _PROCESS.match(path))
                 and (source.read_optional(path) or "") in daemons}
    # Of pid 1 and of the reader (/proc/self), only what tells where the files were read
    # (auditor.environment): their PID namespace, cgroup and UID map.
    placing = {"1"}
    self_link = source.lstat("/proc/self")
    if self_link is not None and self_link.kind == "link" and self_link.target.isdigit():
        placing.add(self_link.target)
    placing -= processes

    def never_kept(path: str) -> bool:
        return denied(path) or path in NEVER_KEPT or path == FOLDER \
            or path.startswith(FOLDER + "/")

    def allowed(path: str, entry: Entry) -> bool:
        if never_kept(path):
            return False
        pid = _PROCESS.match(path)
        if pid is not None and pid.group(1) in placing:
            return path[pid.end(1):] in _PLACING
        if pid is not None and pid.group(1) not in processes:
            return False
        if entry.kind in ("chr", "blk"):
            return path.startswith("/dev/")
        return entry.kind in ("file", "dir", "link")

    def add_path(path: str) -> None:
        pending = deque(p for p in path.split("/") if p)
        resolved = ""
        hops = 0
        links: list[str] = []
        while pending:
            part = pending.popleft()
            if part == ".":
                continue
            if part == "..":
                resolved = resolved.rpartition("/")[0]
                continue
            candidate = resolved + "/" + part
            entry = source.lstat(candidate)
            if (entry is None and never_kept(candidate)) or (
                    entry is not None and not allowed(candidate, entry)):
                for link in links:  # a symlink that leads to what is never kept goes too
                    kept.pop(link, None)
                return
            if entry is None:
                return
            if candidate not in kept:
                kept[candidate] = entry
                if entry.kind == "link":
                    links.append(candidate)
            if entry.kind == "link":
                hops += 1
                if hops > _MAX_LINKS:
                    return
                if entry.target.startswith("/"):
                    resolved = ""
                parts = [p for p in entry.target.split("/") if p]
                if len(parts) + len(pending) > MAX_PATH_PARTS:
                    for link in links:
                        kept.pop(link, None)
                    return
                pending.extendleft(reversed(parts))
                continue
            if pending and entry.kind != "dir":
                return
            resolved = candidate

    for pattern in patterns:
        for path in source.glob(pattern):
            add_path(path)
    # The GPU state the collector made from the driver's answers (auditor.hosts.gpustate)
    # is host-auditor's own file too, kept in its folder: nvidia-smi's XML without its
    # process lists (no command line), how the command ended, NVML's state, the Xid lines.
    own: dict[str, bytes] = {}
    for pattern in patterns:
        if gpu_state_read(pattern) and pattern not in (tool_files or {}):
            try:
                state = source.read_bytes(pattern, 8 << 20)
            except OSError:
                continue
            if pattern == "/host-auditor/nvidia-smi.xml":
                from auditor.hosts.gpustate import sanitise_xml

                state = sanitise_xml(state)
            own[pattern] = state
    own.update(tool_files or {})
    for path in own:
        if not path.startswith(FOLDER + "/"):
            raise ValueError(f"{path}: host-auditor's files go in {FOLDER}")
        parent = path.rpartition("/")[0]
        while parent and parent not in kept:
            kept[parent] = Entry("dir")
            parent = parent.rpartition("/")[0]
        kept[path] = Entry("file")
    buffer = io.BytesIO()
    devices = withheld = 0
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(kept):
            entry = kept[path]
            info = tarfile.TarInfo(path.lstrip("/"))
            data: bytes | None = None
            if entry.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif entry.kind == "link":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.target
            elif entry.kind in ("chr", "blk"):
                info.type = tarfile.CHRTYPE if entry.kind == "chr" else tarfile.BLKTYPE
                info.mode, info.devmajor, info.devminor = 0o600, entry.major, entry.minor
                devices += 1
            elif path in own:
                data = own[path]
                info.mode, info.size = 0o644, len(data)
            else:
                try:
                    data = redact(path, source.read_bytes(path, FILE_CAP))
                except OSError:
                    continue
                if data is None:  # a file that holds nothing a check reads but secrets
                    withheld += 1
                    continue
                info.mode, info.size = 0o644, len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return Rebuilt(buffer.getvalue(), len(kept) - withheld, devices)


def daemons_of(checks: Sequence[CheckClass]) -> frozenset[str]:
    """Return the process names the checks look for (``Check.daemons``)."""
    return frozenset().union(*(c.daemons for c in checks))


def manifest_files(checks: Sequence[CheckClass], patterns: Sequence[str]) -> dict[str, bytes]:
    """Return the capture's manifest (what it collects, for which checks, when) as a file."""
    from auditor.manifest import PATH, make_manifest

    return {PATH: make_manifest(checks, patterns, daemons_of(checks)).to_json()}


def capture_local(checks: Sequence[CheckClass]) -> Rebuilt:
    """Return a snapshot of every path the checks read on this machine."""
    from auditor.hosts.archive import ArchiveHost
    from auditor.hosts.collect import collect_tar
    from auditor.registry import collected_paths

    patterns = collected_paths(checks)
    extra: dict[str, bytes] = {}
    if any(gpu_state_read(p) for p in patterns):
        from auditor.hosts import gpustate

        # NVML's normalised state where the extra is installed (what a live audit judges);
        # the collector adds nvidia-smi's XML beside it, for any reader of the capture.
        if gpustate.nvidia_gpu_bound() and gpustate.nvml_available():
            extra = gpustate.run_nvml()
    collected = ArchiveHost(collect_tar(patterns, extra=extra), "local")
    return rebuild(collected, patterns, daemons_of(checks), manifest_files(checks, patterns))


def gpu_state_read(pattern: str) -> bool:
    """Return whether a pattern names the GPU state's virtual files (auditor.hosts.gpustate)."""
    return pattern == "/host-auditor" or pattern.startswith("/host-auditor/")


def capture_remote(target: str, checks: Sequence[CheckClass],
                   options: SshOptions | None = None) -> tuple[Rebuilt, str]:
    """Return a snapshot of what the checks read on a host over SSH, and a note.

    The note says why root-only files may be missing ("" when the collector ran as root).
    """
    from auditor.hosts.ssh import SshHost, parse_target
    from auditor.registry import collected_paths

    patterns = collected_paths(checks)
    host = SshHost(parse_target(target), options)
    try:
        host.connect()
        host.collect(patterns)
    finally:
        host.close()
    return (rebuild(host, patterns, daemons_of(checks), manifest_files(checks, patterns)),
            host.privilege_note)


def snapshot(target: str, checks: Sequence[CheckClass],
             ssh_options: SshOptions | None = None) -> Capture:
    """Capture the checks' reads on ``target`` (``local`` or an SSH host)."""
    from auditor.hosts.archive import ArchiveHost

    note = ""
    if target == "local":
        rebuilt = capture_local(checks)
    else:
        rebuilt, note = capture_remote(target, checks, ssh_options)
    try:
        capture = ArchiveHost(rebuilt.data, target)
    except SnapshotError as exc:  # pragma: no cover - written just above
        raise SnapshotError(f"{target}: the capture is not a readable sysroot ({exc})") from exc
    return Capture(rebuilt.data, capture.name, target, len(checks), rebuilt.entries,
                   rebuilt.devices, note)
