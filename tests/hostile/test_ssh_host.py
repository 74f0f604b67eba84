"""A hostile SSH host: a real sshd on loopback whose user answers the collecting command
with bombs, trickles, floods, hostile archive members and garbage (a ForceCommand script),
audited beside a healthy host in the same run.

Each run is a real ``audit host`` process under an address-space limit; each asserts the
exit code (3: a host could not be audited), one printable error line for the hostile host,
bounded wall time and memory, and that the healthy host was still audited.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.conftest import Finished, audit_cmd, run_limited
from tests.support.factories import tar_of_members
from tests.support.sshd import Sshd, SshLab

pytestmark = pytest.mark.ssh

HOSTILE = f"ha-hostile{os.getpid() % 100000:05d}"
HEADER = b"audit-collect 1 sudo=off\npython uid=0\n"
#: Address space and peak memory a run may use with one hostile and one healthy host.
LIMIT = 2 << 30
RSS = 500 << 20

SCRIPT = r"""#!/bin/sh
lab=$(dirname "$0")
mode=$(cat "$lab/mode")
case $mode in
    trickle) printf 'audit-collect 1 sudo=off\npython uid=0\n'
             while :; do printf x; sleep 0.3; done ;;
    flood) printf 'audit-collect 1 sudo=off\npython uid=0\n'; exec cat /dev/zero ;;
    stderr) printf 'fine\n\033[2J\033]0;owned\007 \033[31mred\n' >&2; exit 7 ;;
    stderr-flood) while :; do printf 'noise noise noise noise noise noise\n' >&2; done ;;
    *) exec cat "$lab/answer" ;;
esac
"""


@dataclass
class HostileLab:
    lab: SshLab
    server: Sshd
    known_hosts: Path

    def answer(self, mode: str, data: bytes = b"") -> None:
        (self.lab.root / "answer").write_bytes(data)
        (self.lab.root / "mode").write_text(mode)

    def audit(self, *extra: str, timeout: float = 10.0) -> Finished:
        healthy = f"root@{self.server.target}"
        hostile = f"{HOSTILE}@{self.server.target}"
        return run_limited(audit_cmd(
            "host", healthy, hostile, "--identity", str(self.lab.client_key),
            "--known-hosts", str(self.known_hosts), "--timeout", f"{timeout:g}",
            "--format", "json", "--workers", "1", *extra), memory=LIMIT, timeout=120)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileLab]:
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        pytest.skip("the hostile host needs root and openssh-server")
    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-hostile-")))
    try:
        script = lab.root / "hostile.sh"
        script.write_text(SCRIPT)
        os.chmod(script, 0o755)
        lab.add_user(HOSTILE)
        server = lab.start(extra=[f"Match User {HOSTILE}", f"    ForceCommand sh {script}"])
        known = lab.known_hosts(lab.root / "known_hosts", [server])
        yield HostileLab(lab, server, known)
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)


def by_user(result: Finished) -> dict[str, dict[str, object]]:
    document = json.loads(result.out)
    return {str(h["target"]).split("://", 1)[1].split("@", 1)[0]: h for h in document["hosts"]}


def assert_contained(result: Finished, wanted: str, *, wall: float = 30) -> None:
    """The hostile host failed with one printable line naming why; the healthy one passed."""
    assert result.code == 3, result.err
    hosts = by_user(result)
    assert "error" not in hosts["root"] and hosts["root"]["findings"]
    assert wanted in str(hosts[HOSTILE]["error"]), hosts[HOSTILE]["error"]
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert all(line.isprintable() for line in lines), lines  # progress lines too
    errors = [line for line in lines if line.startswith("audit: error:")]
    assert len(errors) == 1 and wanted in errors[0], lines
    assert result.wall < wall, result.wall
    assert result.max_rss < RSS, result.max_rss


def test_a_gzip_bomb_nobody_asked_for_is_refused(hostile: HostileLab) -> None:
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb", compresslevel=9) as writer:
        for _ in range(512):
            writer.write(b"\0" * (1 << 20))
    hostile.answer("answer", HEADER + bomb.getvalue())
    assert_contained(hostile.audit(), "gzip-compressed, which was not asked for")


def test_a_trickle_meets_the_deadline(hostile: HostileLab) -> None:
    """One byte every 0.3 s never idles a read for long: only a deadline ends it."""
    hostile.answer("trickle")
    result = hostile.audit(timeout=3)
    assert_contained(result, "timed out after 3 s", wall=12)


def test_a_flood_is_cut_at_the_cap(hostile: HostileLab) -> None:
    hostile.answer("flood")
    assert_contained(hostile.audit(timeout=30), "exceeded 64 MiB", wall=60)


def test_garbage_is_one_line(hostile: HostileLab) -> None:
    hostile.answer("answer", b"\x1b[2J\x00\xff garbage " * 5000)
    assert_contained(hostile.audit(), "the collector did not start")


def test_an_sh_record_flood_is_cut(hostile: HostileLab) -> None:
    hostile.answer("answer", b"audit-collect 1 sudo=off\nsh uid=0\n"
                   + b"".join(b"D/x%d\0" % i for i in range(150_000)))
    assert_contained(hostile.audit(timeout=60), "records from the sh collector", wall=60)


def test_the_last_stderr_line_is_printable(hostile: HostileLab) -> None:
    hostile.answer("stderr")
    result = hostile.audit()
    assert_contained(result, "the collecting command exited 7")
    assert "\x1b" not in result.err and "\\x1b[31mred" in result.err


def test_a_stderr_flood_meets_the_deadline_in_bounded_memory(hostile: HostileLab) -> None:
    hostile.answer("stderr-flood")
    assert_contained(hostile.audit(timeout=4), "timed out after 4 s", wall=15)


def test_hostile_members_are_read_inside_the_archive_and_left_out_of_a_snapshot(
    hostile: HostileLab, tmp_path: Path
) -> None:
    """../ and absolute names, a FIFO, a block device as /etc/os-release, a symlink to
    /etc/shadow as the host name, a device outside /dev, a huge file: the audit reads the
    archive as a tree of its own, and a snapshot of the host keeps none of these."""
    def info(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
        made = tarfile.TarInfo(name)
        made.type = kind
        for key, value in fields.items():
            setattr(made, key, value)
        return made

    answer = tar_of_members([
        (info("../../../etc/cron.d/evil"), b"* * * * * root touch /tmp/pwned\n"),
        (info("/etc/passwd"), b"root:x:0:0::/root:/bin/sh\n"),
        (info("etc/hostname", tarfile.SYMTYPE, linkname="/etc/shadow"), None),
        (info("etc/shadow"), b"root:$6$SECRET-HASH:1::::::\n"),
        (info("etc/os-release", tarfile.BLKTYPE, devmajor=8, devminor=0), None),
        (info("proc/sys/kernel/osrelease", tarfile.FIFOTYPE), None),
        (info("sys/class/x", tarfile.CHRTYPE, devmajor=1, devminor=1), None),
        (info("proc/sys/kernel/hostname"), b"evil\x1b[2J-host\n"),
        (info("proc/4242/comm"), b"secret-process\n"),
        (info("proc/4243/comm"), b"tuned\n"),
        (info("etc/machine-id"), b"0123456789abcdef0123456789abcdef\n"),
    ], fmt=tarfile.GNU_FORMAT)
    hostile.answer("answer", HEADER + answer)
    result = hostile.audit()
    assert result.code in (0, 1), result.err
    hosts = by_user(result)
    assert "error" not in hosts[HOSTILE]
    # /etc/hostname leads to /etc/shadow, never read from an answer: the kernel's name is
    # used, one printable token (as SSH host names are cleaned).
    assert hosts[HOSTILE]["host"] == "evil[2J-host"
    assert "SECRET-HASH" not in result.out and "0123456789abcdef" not in result.out
    assert not Path("/tmp/pwned").exists()
    out = tmp_path / "evil.tar.gz"
    snapshot = run_limited(audit_cmd("snapshot", f"{HOSTILE}@{hostile.server.target}", "-o",
                                     str(out), "--identity", str(hostile.lab.client_key),
                                     "--known-hosts", str(hostile.known_hosts)), timeout=60)
    assert snapshot.code == 0, snapshot.err
    assert "\x1b" not in snapshot.err
    with tarfile.open(out) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert not any(name.startswith(("/", "..")) or "/../" in name for name in members)
    assert "etc/shadow" not in members and "etc/hostname" not in members  # the link led there
    assert "etc/os-release" not in members and "sys/class/x" not in members
    assert "etc/machine-id" not in members
    assert "proc/4242/comm" not in members and "proc/4243/comm" in members
    assert all(m.isreg() or m.isdir() or m.issym() or m.ischr() or m.isblk()
               for m in members.values())


class TricklingBanner:
    """An SSH server that sends its banner one byte every 0.3 s, for ever."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(client,), daemon=True).start()

    def _trickle(self, client: socket.socket) -> None:
        try:
            for byte in b"SSH-2.0-" + b"x" * 100_000:
                client.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def test_a_banner_trickled_a_byte_at_a_time_meets_the_deadline(hostile: HostileLab) -> None:
    slow = TricklingBanner()
    try:
        result = run_limited(audit_cmd(
            "host", f"root@{hostile.server.target}", f"127.0.0.1:{slow.port}",
            "--identity", str(hostile.lab.client_key), "--known-hosts",
            str(hostile.known_hosts), "--timeout", "3", "--format", "json"), timeout=60)
    finally:
        slow.close()
    assert result.code == 3
    assert result.wall < 12
    line = result.one_error_line()
    assert "timed out after 3 s" in line
