"""``audit snapshot``: a capture of the live host replays to the same findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from auditor.check import Check, CheckOptions
from auditor.cli import main
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.snapshot import snapshot, write_capture
from tests.auditor.conftest import SUDO

AUDIT = str(Path(sys.executable).with_name("audit"))


def verdicts(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return sorted((f["check"], f["subject"], f["status"], f["observed"])
                  for f in report["findings"])


def audit_json(*args: str) -> dict[str, Any]:
    proc = subprocess.run([AUDIT, "local", "--format", "json", *args], capture_output=True,
                          text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_snapshot_of_this_machine_replays_to_the_same_findings(tmp_path: Path) -> None:
    capture = tmp_path / "host.tar.gz"
    proc = subprocess.run([AUDIT, "snapshot", "local", "-o", str(capture)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("audit: snapshot of ") and str(capture) in proc.stderr
    live = audit_json()
    replay = audit_json("--root", str(capture))
    assert verdicts(replay) == verdicts(live)
    assert [c["check"] for c in replay["checks"]] == [c["check"] for c in live["checks"]]
    assert replay["facts"]["kernel"] == live["facts"]["kernel"]


def test_check_and_skip_narrow_the_capture(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    capture = tmp_path / "numa.tar.gz"
    assert main(["snapshot", "local", "-o", str(capture), "--check", "numa.balancing"]) == 0
    with tarfile.open(capture) as archive:
        names = set(archive.getnames())
    assert "proc/sys/kernel/numa_balancing" in names
    assert "proc/devices" not in names  # read only by lxc.device_majors
    replay = tmp_path / "replay.json"
    main(["local", "--root", str(capture), "--check", "numa.balancing", "-f", "json",
          "-o", str(replay)])
    live = audit_json("--check", "numa.balancing")
    assert verdicts(json.loads(replay.read_text())) == verdicts(live)
    skipped = tmp_path / "skip.tar.gz"
    assert main(["snapshot", "local", "-o", str(skipped), "--skip", "numa.balancing"]) == 0
    with tarfile.open(skipped) as archive:
        assert "proc/sys/kernel/numa_balancing" not in archive.getnames()
    capsys.readouterr()


class Greedy(Check[CheckOptions]):
    """A check that asks for secrets and device nodes beside an ordinary file."""

    id: ClassVar[str] = "test.greedy"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = (
        "/proc/self/environ",
        "/proc/1/environ",
        "/etc/ssh/*key*",
        "/root/.ssh/*",
        "/dev/null",
        "/proc/sys/kernel/osrelease",
    )
    rationale: ClassVar[str] = "tests"
    remedy: ClassVar[str] = "none"

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self.passed("kernel", "ok")


def test_capture_keeps_device_entries_and_never_secrets(tmp_path: Path) -> None:
    capture = tmp_path / "greedy.tar.gz"
    taken = snapshot("local", [Greedy])
    write_capture(str(capture), taken.data)
    assert "1 device nodes" in taken.summary(str(capture))
    with tarfile.open(capture) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert "proc/sys/kernel/osrelease" in members
    null = members["dev/null"]
    assert null.ischr() and (null.devmajor, null.devminor) == (1, 3)
    assert not [n for n in members if n.endswith("environ")]
    assert not [n for n in members if n.startswith("etc/ssh/") and "key" in n]
    assert not [n for n in members if "/.ssh/" in n]
    assert oct(os.stat(capture).st_mode & 0o777) == "0o644"


def test_unwritable_output_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([AUDIT, "snapshot", "local", "-o", str(tmp_path / "no" / "x.tgz")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot write the capture" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.ssh
def test_snapshot_over_ssh_replays_to_the_same_findings(ssh_env: Any, tmp_path: Path) -> None:
    capture = tmp_path / "remote.tar.gz"
    server = ssh_env.server
    proc = subprocess.run(
        [AUDIT, "snapshot", f"{server.address}:{server.port}", "-o", str(capture), "--sudo",
         *ssh_env.cli_args(SUDO)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"({server.address}:{server.port})" in proc.stderr
    # sshd runs on this machine: the remote capture is this machine seen over SSH
    live = audit_json()
    replay = audit_json("--root", str(capture))
    assert verdicts(replay) == verdicts(live)
    with tarfile.open(capture) as archive:
        names = archive.getnames()
    assert not [n for n in names if n.endswith("environ") or "/.ssh/" in n]


@pytest.mark.ssh
def test_snapshot_of_an_unknown_host_key_is_refused(ssh_env: Any, tmp_path: Path) -> None:
    server = ssh_env.server
    proc = subprocess.run(
        [AUDIT, "snapshot", f"{server.address}:{server.port}", "-o", str(tmp_path / "x.tgz"),
         "--user", SUDO, "--identity", str(ssh_env.lab.client_key),
         "--known-hosts", str(tmp_path / "empty_known_hosts")],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("audit: error: ")
    assert not (tmp_path / "x.tgz").exists()
