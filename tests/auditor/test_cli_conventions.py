"""What operators expect of a command line: a default policy location, -q/-v, --color,
audit profiles, --retry-for and a Nagios/Icinga plugin output."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.cli import options as cli_options
from tests.auditor.conftest import SshEnv
from tests.support.hostgen import HostSpec, build_host
from tests.support.sshd import Sshd

AUDIT = str(Path(sys.executable).parent / "audit")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """The generated 8-GPU node with its six problems, as a sysroot directory."""
    return build_host(HostSpec()).write_dir(tmp_path / "node")


def test_the_policy_comes_from_the_environment_then_etc(
    node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site.toml"
    site.write_text('profile = "latency"\n')
    etc = tmp_path / "etc-policy.toml"
    etc.write_text('profile = "throughput"\n')
    monkeypatch.setattr(cli_options, "DEFAULT_POLICY", str(etc))
    monkeypatch.delenv("HOST_AUDITOR_POLICY", raising=False)
    _, out, _ = run(capsys, "local", "--root", str(node), "-f", "json")
    assert json.loads(out)["policy"]["file"] == str(etc)
    monkeypatch.setenv("HOST_AUDITOR_POLICY", str(site))
    _, out, _ = run(capsys, "local", "--root", str(node), "-f", "json")
    assert json.loads(out)["policy"] == {**json.loads(out)["policy"], "file": str(site),
                                         "profile": "latency"}
    _, out, _ = run(capsys, "local", "--root", str(node), "-f", "json", "--policy", str(etc))
    assert json.loads(out)["policy"]["file"] == str(etc)  # the command line wins
    monkeypatch.setenv("HOST_AUDITOR_POLICY", "")
    _, out, _ = run(capsys, "local", "--root", str(node), "-f", "json")
    assert "file" not in json.loads(out)["policy"]
    monkeypatch.setenv("HOST_AUDITOR_POLICY", str(tmp_path / "missing.toml"))
    code, out, err = run(capsys, "local", "--root", str(node))
    assert code == 2 and out == "" and "HOST_AUDITOR_POLICY=" in err and "no such" in err


def test_nagios_plugin_output_and_states(
    node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "local", "--root", str(node), "--format", "nagios")
    first, *rest = out.splitlines()
    assert code == 2  # CRITICAL: the node has failing checks
    assert first.startswith("HOST-AUDITOR CRITICAL - ") and " | pass=" in first
    perf = dict(item.split("=", 1) for item in first.split(" | ", 1)[1].split())
    assert set(perf) == {"pass", "warn", "fail", "error", "skip", "waived", "duration"}
    assert int(perf["fail"].split(";")[0]) >= 1 and perf["duration"].endswith("s;;;0")
    assert rest and all(line.startswith(("FAIL ", "WARN ", "ERROR ")) for line in rest)
    clean = build_host(HostSpec(bad_governor=False, deep_cstates=False, numa_balancing=False,
                                old_kernel=False, low_mrrs=False, stale_lxc_major=False)
                       ).write_dir(tmp_path / "clean")
    code, out, _ = run(capsys, "local", "--root", str(clean), "--format", "nagios",
                       "--check", "pcie.mrrs")
    assert code == 0 and out.startswith("HOST-AUDITOR OK - 1 checks pass | ")
    # Bad arguments are UNKNOWN (3), never CRITICAL.
    code, _, _ = run(capsys, "local", "--root", str(node), "-f", "nagios", "--check", "nope")
    assert code == 3


def test_color_always_and_never(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "local", "--root", str(node), "--color", "always")
    assert "\x1b[" in out
    _, out, _ = run(capsys, "local", "--root", str(node), "--color", "never")
    assert "\x1b[" not in out
    code, _, err = run(capsys, "local", "--root", str(node), "--color", "sometimes")
    assert code == 2 and "colour" in err


def test_quiet_and_verbose(node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "local", "--root", str(node), "-v", "--check", "pcie.*")
    assert "checks; profile gpu-inference; policy none" in err
    _, _, err = run(capsys, "local", "--root", str(node), "--check", "numa.balancing",
                    "--retry-for", "1", "-q")
    assert err == ""  # the retry's note is not an error
    code, _, err = run(capsys, "local", "--root", str(node), "-q", "-v")
    assert code == 2 and "contradict" in err


def test_profiles_lists_what_each_profile_sets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles")
    assert code == 0
    assert out.startswith("gpu-inference (default): ")
    assert "\nlatency: " in out and "\nthroughput: " in out
    _, out, _ = run(capsys, "profiles", "--format", "json")
    table = json.loads(out)
    assert table["latency"]["checks"]["cpu.cstates"] == {"max_exit_latency_us": 2}
    assert table["gpu-inference"]["default"] is True


def test_retry_for_waits_until_the_node_settles(node: Path) -> None:
    """A pre-flight right after boot: the audit is repeated until a late fix lands."""
    setting = node / "proc" / "sys" / "kernel" / "numa_balancing"
    assert setting.read_text().strip() == "1"
    process = subprocess.Popen([AUDIT, "local", "--root", str(node), "--check",
                                "numa.balancing", "--format", "line", "--retry-for", "60s",
                                "-v"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen = ""
    while "--retry-for: audit 1 not clean" not in seen:  # still failing, still trying
        line = process.stderr.readline()
        assert line, seen
        seen += line
    setting.write_text("0\n")
    out, err = process.communicate(timeout=60)
    err = seen + err
    assert process.returncode == 0, err
    # Clean by --fail-on (fail): what is left is a warning about the boot-time value.
    assert not out.startswith("FAIL") and "--retry-for: clean at audit" in err
    started = time.monotonic()
    setting.write_text("1\n")
    proc = subprocess.run([AUDIT, "local", "--root", str(node), "--check", "numa.balancing",
                           "--format", "line", "--retry-for", "3"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and time.monotonic() - started >= 3
    assert "still not clean after" in proc.stderr


def test_bash_completes_commands_and_options(tmp_path: Path) -> None:
    """The script ``audit completion bash`` prints, run by bash as complete(1) would."""
    script = subprocess.run([AUDIT, "completion", "bash"], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert "complete -o default -F _audit_completion audit" in script
    (tmp_path / "audit.bash").write_text(script)
    bin_dir = Path(AUDIT).parent

    def complete(*words: str) -> list[str]:
        program = (f'source {tmp_path / "audit.bash"}; COMP_WORDS=({" ".join(words)}); '
                   f'COMP_CWORD={len(words) - 1}; _audit_completion audit; '
                   'printf "%s\\n" "${COMPREPLY[@]}"')
        proc = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                              timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        return proc.stdout.split()

    assert complete("audit", "ex") == ["explain"]
    assert "profiles" in complete("audit", "pro")
    assert "--retry-for" in complete("audit", "local", "--re")


def test_problems_view_fits_the_width_and_groups_a_fleet() -> None:
    from auditor.model import Status
    from auditor.render import render_problems
    from tests.support.factories import make_finding, make_report

    reports = [make_report([make_finding(host=f"gpu-{n:03d}")], host=f"gpu-{n:03d}")
               for n in range(40)]
    reports.append(make_report([make_finding(host="gpu-100", status=Status.PASS)],
                               host="gpu-100"))
    reports.append(make_report([], host="gpu-down", error="gpu-down: connection refused"))
    text = render_problems(reports, width=60)
    lines = text.splitlines()
    assert lines[0] == "42 hosts: 1 clean, 0 warn, 40 fail, 1 not audited"
    assert lines[1].startswith("FAIL  numa.balancing kernel: gpu-000, gpu-001")
    assert lines[1].endswith(" more)") and len(lines[1]) <= 60
    assert lines[2] == "ERROR gpu-down: gpu-down: connection refused"
    assert len(lines) == 3 and all(len(line) <= 60 for line in lines)


@pytest.mark.ssh
def test_quiet_fleet_has_no_progress_lines(
    ssh_env: SshEnv, fleet: list[Sshd], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["host", fleet[0].target, fleet[1].target, *ssh_env.cli_args(), "--check",
            "numa.balancing", "--format", "line"]
    code, _out, err = run(capsys, *args)
    assert code in (0, 1) and len(err.splitlines()) == 2 and "audit: [" in err
    code, quiet_out, err = run(capsys, *args, "-q")
    assert code in (0, 1) and err == "" and len(quiet_out.splitlines()) == 2
