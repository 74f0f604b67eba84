"""``audit host`` spread over worker processes: same reports, faults and Ctrl-C as threads."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.cli.options import AuditOptions, prepare
from auditor.hosts.ssh import parse_target
from auditor.model import FailOn, Report
from auditor.runner import FleetAudit, worker_count
from tests.auditor.conftest import SshEnv
from tests.support.sshd import SilentListener, Sshd, free_port

ssh = pytest.mark.ssh


def test_worker_count() -> None:
    assert worker_count(50, 2) == 1  # two CPUs: one process (measured as fast)
    assert worker_count(50, 16) == 3  # one per 16 hosts
    assert worker_count(1000, 16) == 16  # at most one per CPU
    assert worker_count(10, 64) == 1
    assert worker_count(3, 2, asked=8) == 3  # asked for: at most one per host


def test_reports_travel_between_processes() -> None:
    from auditor.hosts.archive import ArchiveHost
    from auditor.runner import audit
    from tests.support.sysroot import CAPTURES

    checks, policy = prepare(AuditOptions("json", None, (), (), FailOn.FAIL, None, None, False))
    report = audit(ArchiveHost.from_path(str(CAPTURES["h200"])), checks, policy)
    assert report.findings
    assert pickle.loads(pickle.dumps(report)) == report


@ssh
def test_workers_give_the_threads_reports_in_order(
    ssh_env: SshEnv, fleet: list[Sshd], capfd: pytest.CaptureFixture[str]
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    targets = [s.target for s in fleet] + [dead, ssh_env.server.target]
    documents = []
    for workers in ("1", "2"):
        code = main(["host", *targets, *ssh_env.cli_args(), "--format", "json",
                     "--workers", workers])
        out, err = capfd.readouterr()  # a worker's error line goes to the real stderr
        assert code == 3
        assert err.count("audit: error:") == 1 and dead in err
        documents.append(json.loads(out))
    threads, processes = documents
    assert [h["target"] for h in processes["hosts"]] == [h["target"] for h in threads["hosts"]]
    assert processes["summary"] == threads["summary"]
    for one, other in zip(threads["hosts"], processes["hosts"], strict=True):
        assert [f["check"] for f in one["findings"]] == [f["check"] for f in other["findings"]]
    assert "refused" in processes["hosts"][3]["error"]


@ssh
def test_a_dead_worker_fails_only_its_unfinished_hosts(
    ssh_env: SshEnv, fleet: list[Sshd], capsys: pytest.CaptureFixture[str]
) -> None:
    silent = SilentListener()
    try:
        # Two workers: hosts 0 and 2 go to the first, 1 and 3 (the silent one) to the second.
        targets = [parse_target(t) for t in (fleet[0].target, fleet[1].target,
                                             fleet[2].target, f"127.0.0.1:{silent.port}")]
        checks, policy = prepare(AuditOptions("json", None, (), (), FailOn.FAIL, None, None,
                                              False))
        options = ssh_env.options(timeout=30.0)
        errors: list[str] = []
        engine = FleetAudit(targets, options, checks, policy, workers=2, on_error=errors.append)
        engine.start()
        second = engine._processes[1][0]
        done: list[Report] = []
        time.sleep(2)  # the second worker has audited host 1 and waits on the silent one
        second.kill()
        started = time.monotonic()
        reports = engine.run(done.append)
    finally:
        silent.close()
    assert time.monotonic() - started < 10
    assert len(reports) == len(done) == 4
    assert [bool(r.error) for r in reports] == [False, False, False, True]
    assert "worker process auditing it ended" in str(reports[3].error)
    assert len(errors) == 1 and "worker process auditing it ended" in errors[0]
    assert capsys.readouterr().err == ""  # the engine reports through its callback only


@ssh
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_stops_and_keeps_what_was_finished(ssh_env: SshEnv, workers: str) -> None:
    """In one process or with workers, Ctrl-C ends at once and reports the finished hosts."""
    silent = SilentListener()
    command = [str(Path(sys.executable).parent / "audit"), "host", ssh_env.server.target,
               f"127.0.0.1:{silent.port}", *ssh_env.cli_args(), "--timeout", "30",
               "--workers", workers]
    try:
        # Its own process group, as a terminal's Ctrl-C signals every process in it.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        time.sleep(4)
        started = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=15)
    finally:
        silent.close()
    assert time.monotonic() - started < 5
    assert process.returncode == 130
    assert "interrupted (SIGINT): 1 of 2 hosts audited" in err
    assert "Traceback" not in err
    assert "numa.balancing" in out
    assert out.startswith("INCOMPLETE: stopped by SIGINT; 1 of 2 hosts audited; not audited: "
                          f"127.0.0.1:{silent.port}\n")
