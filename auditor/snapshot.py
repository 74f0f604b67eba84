"""``audit snapshot``: capture exactly what the checks read, as a sysroot ``.tar.gz``.

The capture is made by the collector (:mod:`auditor.hosts.collect`) from the selected
checks' ``reads`` patterns, so ``audit local --root capture.tar.gz`` replays the
audit as it ran on the host. Device entries keep their major and minor; the
collector never takes a secret (process environments, memory, keys).
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.check import CheckClass
from auditor.errors import SnapshotError, UsageError

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
        return (f"snapshot of {self.host} ({self.target}) for {self.checks} checks: "
                f"{self.entries} entries, {self.devices} device nodes, {len(self.data)} bytes "
                f"-> {where}" + (f" ({self.note})" if self.note else ""))


def write_capture(output: str, data: bytes) -> None:
    """Write a capture to ``output`` atomically (``-``: stdout)."""
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    directory = os.path.dirname(os.path.abspath(output))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".snapshot-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"{output}: cannot write capture ({exc.strerror})") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, output)
    except OSError as exc:
        os.unlink(temporary)
        raise UsageError(f"{output}: cannot write capture ({exc.strerror})") from exc


def capture_local(checks: Sequence[CheckClass]) -> bytes:
    """Return a gzip tar sysroot of every path the checks read on this machine."""
    from auditor.hosts.collect import collect_tar
    from auditor.registry import collected_paths

    return collect_tar(collected_paths(checks), compress=True)


def capture_remote(target: str, checks: Sequence[CheckClass],
                   options: SshOptions | None = None) -> tuple[bytes, str]:
    """Return a gzip tar sysroot of what the checks read on a host over SSH, and a note.

    The note says why root-only files may be missing ("" when the collector ran as root).
    """
    from auditor.hosts.ssh import SshHost, parse_target
    from auditor.registry import collected_paths

    host = SshHost(parse_target(target), options)
    try:
        host.connect()
        host.collect(collected_paths(checks))
    finally:
        host.close()
    assert host.collection is not None  # collect() sets it or raises
    tar = host.collection.tar
    return (tar if tar[:2] == b"\x1f\x8b" else gzip.compress(tar, 6)), host.privilege_note


def snapshot(target: str, checks: Sequence[CheckClass],
             ssh_options: SshOptions | None = None) -> Capture:
    """Capture the checks' reads on ``target`` (``local`` or an SSH host)."""
    from auditor.hosts.archive import ArchiveHost

    note = ""
    if target == "local":
        data = capture_local(checks)
    else:
        data, note = capture_remote(target, checks, ssh_options)
    try:
        capture = ArchiveHost(data, target)
    except SnapshotError as exc:  # the collector wrote something ArchiveHost cannot read
        raise SnapshotError(f"{target}: the capture is not a readable sysroot ({exc})") from exc
    members = capture.members()
    devices = sum(1 for m in members if (e := capture.lstat(m)) and e.kind in ("chr", "blk"))
    return Capture(data, capture.name, target, len(checks), len(members), devices, note)
