"""``audit snapshot``: capture exactly what the checks read, as a sysroot ``.tar.gz``.

The capture is made by the collector (:mod:`auditor.collect`) from the selected
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
from typing import TYPE_CHECKING

from auditor.check import Check
from auditor.errors import SnapshotError, UsageError

if TYPE_CHECKING:
    from auditor.hosts.ssh import SshOptions


def _write_atomically(output: str, data: bytes) -> None:
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


def capture_local(checks: Sequence[type[Check]]) -> bytes:
    """Return a gzip tar sysroot of every path the checks read on this machine."""
    from auditor.collect import collect_tar, patterns_for

    return collect_tar(patterns_for(checks), compress=True)


def capture_remote(target: str, checks: Sequence[type[Check]],
                   options: SshOptions | None = None) -> tuple[bytes, str]:
    """Return a gzip tar sysroot of what the checks read on a host over SSH, and a note.

    The note says why root-only files may be missing ("" when the collector ran as root).
    """
    from auditor.collect import patterns_for
    from auditor.hosts.ssh import SshHost, parse_target

    host = SshHost(parse_target(target), options)
    try:
        host.connect()
        host.collect(patterns_for(checks))
    finally:
        host.close()
    assert host.collection is not None  # collect() sets it or raises
    tar = host.collection.tar
    return (tar if tar[:2] == b"\x1f\x8b" else gzip.compress(tar, 6)), host.privilege_note


def snapshot(target: str, checks: Sequence[type[Check]], output: str,
             ssh_options: SshOptions | None = None) -> str:
    """Capture the checks' reads on ``target`` into ``output``; return a one-line summary."""
    from auditor.hosts.archive import ArchiveHost

    note = ""
    if target == "local":
        data = capture_local(checks)
    else:
        data, note = capture_remote(target, checks, ssh_options)
    try:
        capture = ArchiveHost(data, output)
    except SnapshotError as exc:  # the collector wrote something ArchiveHost cannot read
        raise SnapshotError(f"{target}: the capture is not a readable sysroot ({exc})") from exc
    members = capture.members()
    devices = sum(1 for m in members if (e := capture.lstat(m)) and e.kind in ("chr", "blk"))
    _write_atomically(output, data)
    where = "stdout" if output == "-" else output
    return (f"snapshot of {capture.name} ({target}) for {len(checks)} checks: "
            f"{len(members)} entries, {devices} device nodes, {len(data)} bytes -> {where}"
            + (f" ({note})" if note else ""))
