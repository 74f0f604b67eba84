"""``audit probe HOST``: the probe program sent over SSH to the host's python3, for real."""

from __future__ import annotations

import json

import pytest

from auditor.cli import main
from tests.auditor.conftest import NOPY, NOSUDO, SshEnv


def test_probes_run_on_a_host_over_ssh(ssh_env: SshEnv,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["probe", ssh_env.server.target, *ssh_env.cli_args(NOSUDO), "--probe",
                 "h2d,wakeup,numa", "--wakeups", "100", "-f", "json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["target"] == f"ssh://{NOSUDO}@127.0.0.1:{ssh_env.server.port}"
    statuses = {f["check"]: f["status"] for f in report["findings"]}
    # This machine has no GPU driver: the GPU probe says so; the wake-up probe measured
    # as the login user, over the connection.
    assert statuses["probe.h2d"] == "skip"
    assert "no GPU driver" in report["findings"][0]["message"]
    wake = next(f for f in report["findings"] if f["check"] == "probe.wakeup")
    assert wake["status"] in ("pass", "warn", "fail")
    assert float(wake["evidence"]["measured.p99_us"]) >= 0
    assert code == (1 if wake["status"] == "fail" else 0)
    assert "probe wakeup: running (deadline 60 s)" in err


def test_a_host_that_cannot_run_the_program_skips_saying_why(
        ssh_env: SshEnv, capsys: pytest.CaptureFixture[str]) -> None:
    # NOPY's PATH holds a few tools: no python3, not even bash.
    assert main(["probe", ssh_env.server.target, *ssh_env.cli_args(NOPY), "--probe",
                 "wakeup", "-f", "json"]) == 0
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["status"] == "skip"
    assert finding["message"].startswith("skipped: the host could not start the probe program")
    assert "bash: not found" in finding["message"]
