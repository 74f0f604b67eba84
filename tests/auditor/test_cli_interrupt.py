"""A fleet stopped by SIGINT or SIGTERM says so: the hosts finished are reported, the rest
are listed as not audited, the summary is marked incomplete, and the exit code names the
signal (130, 143)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.auditor.conftest import SshEnv
from tests.support.sshd import SilentListener, Sshd

AUDIT = str(Path(sys.executable).parent / "audit")


def stop_after_finished(command: list[str], finished: int, signum: int,
                        group: bool = False) -> tuple[int, str]:
    """Run ``command``; once ``finished`` hosts are done, send ``signum``; return the exit
    code and stderr."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while sum(1 for line in lines if line.startswith("audit: [")) < finished:
            assert time.monotonic() < deadline, lines
            line = process.stderr.readline()
            assert line, lines
            lines.append(line)
        time.sleep(0.3)  # the workers' hosts are in flight, waiting on silent listeners
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        rest = process.stderr.read()
        return process.wait(30), "".join(lines) + rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.ssh
@pytest.mark.parametrize(("signum", "code", "name", "workers", "group"), [
    (signal.SIGTERM, 143, "SIGTERM", "2", True),
    (signal.SIGINT, 130, "SIGINT", "1", False),
])
def test_a_stopped_fleet_reports_what_it_did_and_what_it_did_not(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path,
    signum: int, code: int, name: str, workers: str, group: bool,
) -> None:
    silent = [SilentListener(), SilentListener()]
    hanging = [f"127.0.0.1:{s.port}" for s in silent]
    report = tmp_path / "fleet.json"
    try:
        exit_code, err = stop_after_finished(
            [AUDIT, "host", fleet[0].target, *hanging, fleet[1].target, *ssh_env.cli_args(),
             "--check", "numa.balancing", "--timeout", "60", "--workers", workers,
             "-o", str(report)], 2, signum, group)
    finally:
        for listener in silent:
            listener.close()
    assert exit_code == code, err
    assert f"({name}): 2 of 4 hosts audited" in err
    assert "Traceback" not in err
    document = json.loads(report.read_text())
    summary = document["summary"]
    assert summary["incomplete"] is True and summary["stopped_by"] == name
    assert sorted(summary["not_audited"]) == sorted(hanging)
    hosts = {h["name"]: h for h in document["hosts"]}
    assert sorted(hosts) == sorted([fleet[0].target, fleet[1].target, *hanging])
    for target in hanging:
        assert hosts[target]["error"] == f"not audited: the run was stopped by {name}"
    for server in fleet[:2]:
        assert "error" not in hosts[server.target] and hosts[server.target]["findings"]


@pytest.mark.ssh
def test_a_stopped_fleets_text_report_opens_with_it(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path
) -> None:
    silent = SilentListener()
    report = tmp_path / "fleet.txt"
    try:
        exit_code, err = stop_after_finished(
            [AUDIT, "host", fleet[0].target, f"127.0.0.1:{silent.port}", *ssh_env.cli_args(),
             "--check", "numa.balancing", "--timeout", "60", "-o", str(report)],
            1, signal.SIGTERM)
    finally:
        silent.close()
    assert exit_code == 143, err
    first = report.read_text().splitlines()[0]
    assert first == (f"INCOMPLETE: stopped by SIGTERM; 1 of 2 hosts audited; not audited: "
                     f"127.0.0.1:{silent.port}")
