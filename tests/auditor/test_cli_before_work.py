"""What the command line says is checked before the first host is touched; what only the
end of the work can tell (a full disk) still leaves every host's result on disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.cli import main
from tests.auditor.conftest import SUDO, SshEnv
from tests.support.sshd import free_port
from tests.support.sysroot import Sysroot

ssh = pytest.mark.ssh
AUDIT = str(Path(sys.executable).parent / "audit")


class CountingListener:
    """A TCP listener that counts the connections made to it (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    server = CountingListener()
    yield server
    server.sock.close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("extra", "says"), [
    (["-o", "{tmp}/missing/dir/fleet.json"], "directory {tmp}/missing/dir does not exist"),
    (["-o", "{tmp}"], "is a directory"),
    (["--format", "nfd"], "--format nfd labels one node; 2 hosts"),
    (["--fix-script", "{tmp}/nowhere/fix.sh"], "exactly one host"),
    (["--policy", "{tmp}/no-policy.toml"], "no-policy.toml"),
])
def test_a_fleet_run_that_cannot_end_well_fails_before_any_connection(
    listener: CountingListener, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    extra: list[str], says: str,
) -> None:
    args = [a.format(tmp=tmp_path) for a in extra]
    code, out, err = run(capsys, "host", listener.target, f"127.0.0.2:{listener.port}",
                         "--timeout", "30", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says.format(tmp=tmp_path) in err, err
    assert listener.connections() == 0


def test_a_script_path_of_one_host_is_checked_before_the_connection(
    listener: CountingListener, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "host", listener.target, "--fix-script",
                       str(tmp_path / "nowhere" / "fix.sh"))
    assert code == 2 and "cannot write the fix script" in err
    code, _, err = run(capsys, "host", listener.target, "--fix-script", str(tmp_path / "f.sh"),
                       "--rollback-script", str(tmp_path / "nowhere" / "undo.sh"))
    assert code == 2 and "cannot write the rollback script" in err
    code, _, err = run(capsys, "host", listener.target, "--apply")
    assert code == 2 and "--yes" in err
    assert listener.connections() == 0


def test_local_checks_its_output_before_the_audit(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "local", "--root", str(h200.root), "-o",
                         str(tmp_path / "missing" / "report.json"))
    assert code == 2 and out == "" and "does not exist" in err
    assert run(capsys, "merge", str(tmp_path), "-o", str(tmp_path / "no" / "m.txt"))[0] == 2
    assert run(capsys, "fingerprint", "-o", str(tmp_path / "no" / "f.txt"))[0] == 2


def full_disk_run(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run ``audit ARGS -o FULL/report`` where FULL is a tmpfs (of a mount namespace of the
    run's own) filled up: the report's write fails with ENOSPC."""
    full = tmp_path / "full"
    full.mkdir()
    script = ('mount -t tmpfs -o size=16k tmpfs "$1" && '
              '{ head -c 65536 /dev/zero > "$1/filler" 2>/dev/null; shift; exec "$@"; }')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           "sh", str(full), AUDIT, *args, "-o", str(full / "report.out")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOST_AUDITOR_UNSAVED_DIR": str(tmp_path / "kept")})
    return proc.returncode, proc.stderr


def test_a_full_disk_keeps_the_report_of_one_host(h200: Sysroot, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting the small tmpfs needs root")
    code, err = full_disk_run(tmp_path, "local", "--root", str(h200.root), "--format", "json")
    assert code == 2 and "No space left on device" in err and err.count("\n") == 1, err
    [kept] = (tmp_path / "kept").iterdir()
    assert str(kept) in err and (kept.stat().st_mode & 0o777) == 0o600
    report = json.loads(kept.read_text())
    assert report["target"] == f"sysroot:{h200.root}" and report["findings"]


def test_a_refused_output_keeps_nothing(h200: Sysroot, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Only a write error the checks before the work could not foresee keeps the reports."""
    monkeypatch.setenv("HOST_AUDITOR_UNSAVED_DIR", str(tmp_path / "kept"))
    code, _, err = run(capsys, "local", "--root", str(h200.root), "-o", "/dev/null")
    assert code == 2 and "kept in" not in err
    assert not (tmp_path / "kept").exists()


@ssh
def test_a_full_disk_after_a_fleet_keeps_every_hosts_result(
    ssh_env: SshEnv, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, err = full_disk_run(tmp_path, "host", ssh_env.server.target, dead,
                              *ssh_env.cli_args(SUDO), "--timeout", "2", "--check",
                              "numa.balancing", "--format", "json")
    assert code == 2, err
    [line] = [x for x in err.splitlines() if "cannot write report" in x]
    assert "No space left on device" in line and "the 2 hosts' results are kept in" in line
    [kept] = (tmp_path / "kept").iterdir()
    hosts = json.loads(kept.read_text())["hosts"]
    assert [h["name"] for h in hosts] == [ssh_env.server.target, dead]
    assert hosts[0]["findings"] and "error" in hosts[1]
