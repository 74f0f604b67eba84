"""The audit command: exit codes, one-line errors, outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.cli import COMMANDS, app, main
from tests.support.sysroot import CAPTURES, Sysroot


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args], capture_output=True, text=True, timeout=120
    )


def test_local_on_this_machine_gives_valid_json() -> None:
    result = run("local", "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert data["target"] == "local"
    assert data["findings"]
    assert "Traceback" not in result.stderr


def test_capture_of_a_healthy_host_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "--root", str(CAPTURES["h200"]), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host"] == "gpu-h200-vm"
    assert data["summary"]["fail"] == 0


def test_problem_exits_one_and_fail_on_levels(h200: Sysroot, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    h200.write("/sys/devices/system/node/node1/cpulist", "8-15\n")
    h200.write("/proc/sys/kernel/numa_balancing", "1\n")
    assert main(["local", "--root", str(h200.root), "--check", "numa.balancing"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "numa.balancing" in out
    every = [line.split()[0] for line in run("checks").stdout.splitlines()]
    skip_all = [arg for check_id in every for arg in ("--skip", check_id)]
    assert main(["local", "--root", str(h200.root), *skip_all]) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["local", "--check", "no.such"], "unknown check id 'no.such'"),
        (["local", "--format", "yaml"], "unknown format 'yaml'"),
        (["local", "--root", "/nonexistent/root"], "no such sysroot"),
        (["local", "--policy", "/nonexistent.toml"], "cannot read policy file"),
        (["explain", "no.such"], "unknown check id"),
    ],
)
def test_usage_errors_exit_two_with_one_line(args: list[str], needle: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_bad_option_exits_two() -> None:
    assert run("local", "--fail-on", "sometimes").returncode == 2


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ("[checks.\"numa.balancing\"]\nnope = 1\n", "has no option 'nope'"),
        ("[checks.\"no.such\"]\nx = 1\n", "unknown check id 'no.such'"),
        ("this is = = not toml", "not valid TOML"),
        ("profile = \"fastest\"\n", "unknown profile 'fastest'"),
    ],
)
def test_bad_policy_file_exits_two(tmp_path: Path, policy: str, needle: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    result = run("local", "--root", str(CAPTURES["virtio"]), "--policy", str(path))
    assert result.returncode == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_output_file_and_formats(tmp_path: Path) -> None:
    for fmt in ("text", "json", "markdown", "html", "junit"):
        out = tmp_path / f"report.{fmt}"
        result = run("local", "--root", str(CAPTURES["virtio"]), "--format", fmt, "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        assert "vm-virtio" in out.read_text()


def test_checks_and_explain_list_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    listing = run("checks")
    assert listing.returncode == 0
    ids = [line.split()[0] for line in listing.stdout.splitlines()]
    assert "numa.balancing" in ids
    explained = run("explain", ids[0])  # the command as it runs, once
    assert explained.returncode == 0 and "Why it matters for inference:" in explained.stdout
    for check_id in ids:  # every check's explanation, in this process
        assert main(["explain", check_id]) == 0
        out = capsys.readouterr().out
        assert "Why it matters for inference:" in out, check_id
        assert "How it is fixed:" in out, check_id


# -- command-line conventions ----------------------------------------------------------------


def test_version_and_short_help() -> None:
    from auditor import __version__

    version = run("--version")
    assert version.returncode == 0 and version.stdout == f"audit (host-auditor) {__version__}\n"
    for command in ("local", "host", "merge", "watch", "checks", "snapshot", "fingerprint"):
        short, long = run(command, "-h"), run(command, "--help")
        assert short.returncode == 0 and short.stdout == long.stdout, command
        assert "<str>" not in short.stdout and "<int" not in short.stdout, short.stdout


def test_choices_are_shown_as_choices_in_help() -> None:
    local = " ".join(run("local", "-h").stdout.split())
    assert "[text|json|markdown|html|junit|prometheus|line|nfd|nagios|problems]" in local
    assert "--fail-on [warn|fail]" in local
    assert "--profile [gpu-inference|latency|throughput]" in local
    assert "--source [auto|udev|kernel]" in " ".join(run("watch", "-h").stdout.split())
    assert "[text|json|html|prometheus|line]" in " ".join(run("merge", "-h").stdout.split())


def test_fail_on_warn_and_its_alias_warning(h200: Sysroot,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # a downtrained link is a warning: pass at --fail-on fail, exit 1 at warn
    h200.write("/etc/hostname", "gpu-01\n")
    base = ["local", "--root", str(h200.root), "--check", "pcie.mrrs"]
    from tests.checks.test_pcie_mrrs import GPU, setpci

    setpci(h200, GPU, "CAP_EXP+12.w=0085:03ff")  # Link Status: 32GT/s x8 of x16
    assert main([*base]) == 0
    assert main([*base, "--fail-on", "warn"]) == 1
    assert main([*base, "--fail-on", "warning"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize(("name", "check"), [
    ("r.json", lambda text: json.loads(text)["host"] == "vm-virtio"),
    ("r.html", lambda text: text.startswith("<!DOCTYPE html>")),
    ("r.md", lambda text: text.startswith("# host-auditor: vm-virtio")),
    ("r.xml", lambda text: text.startswith("<?xml") and "<testsuites" in text),
    ("r.prom", lambda text: "# TYPE host_auditor_up gauge" in text),
    ("r.txt", lambda text: text.startswith("host-auditor  vm-virtio")),
    ("r.out", lambda text: text.startswith("host-auditor  vm-virtio")),
])
def test_output_extension_names_the_format(tmp_path: Path, name: str, check: object) -> None:
    out = tmp_path / name
    result = run("local", "--root", str(CAPTURES["virtio"]), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert check(out.read_text())  # type: ignore[operator]
    # --format still wins over the extension
    assert run("local", "--root", str(CAPTURES["virtio"]), "-o", str(out), "-f",
               "text").returncode == 0
    assert out.read_text().startswith("host-auditor  vm-virtio")


def test_checks_as_json_lists_what_each_check_declares() -> None:
    listing = run("checks", "--format", "json")
    assert listing.returncode == 0
    checks = {c["id"]: c for c in json.loads(listing.stdout)}
    text_ids = [line.split()[0] for line in run("checks").stdout.splitlines()]
    assert list(checks) == text_ids
    mrrs = checks["pcie.mrrs"]
    assert mrrs["fixable"] is True and "pci" in mrrs["events"]
    assert mrrs["options"]["min_read_request_bytes"]["default"] == 4096
    assert 3000 not in mrrs["options"]["min_read_request_bytes"]["choices"]
    assert checks["cpu.cstates"]["options"]["max_exit_latency_us"]["profiles"]["latency"] == 2


@pytest.mark.parametrize("args", [
    ["local", "--format", "yaml"],
    ["local", "--fail-on", "sometimes"],
    ["local", "--profile", "fastest"],
    ["local", "--bogus"],
    ["nosuch"],
    ["merge", "-f", "markdown", "x.json"],
    ["watch", "--source", "dbus"],
    ["checks", "-f", "xml"],
])
def test_a_bad_command_line_is_one_line_and_exit_2(args: list[str]) -> None:
    result = run(*args)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("audit: error: ") and line.endswith(" -h)"), line


def test_a_directory_that_is_no_sysroot_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "photos" / "2024").mkdir(parents=True)
    for root in (tmp_path / "empty", tmp_path / "photos"):
        for command in (["local"], ["fingerprint"]):
            result = run(*command, "--root", str(root))
            assert result.returncode == 2, result.stdout
            assert result.stderr == (f"audit: error: {root}: does not look like a sysroot "
                                     "(no proc, sys or etc in it)\n")
    # one of the three is enough: a bare image's etc is audited (its checks skip)
    (tmp_path / "photos" / "etc").mkdir()
    assert run("local", "--root", str(tmp_path / "photos")).returncode == 0


def test_an_internal_error_is_one_line_and_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import auditor.render

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("renderer\nbroke")

    monkeypatch.setattr(auditor.render, "render_reports", broken)
    assert main(["local", "--root", str(CAPTURES["h200"])]) == 4
    err = capsys.readouterr().err
    assert err == ("audit: internal error: RuntimeError: renderer broke "
                   "(run with --debug for the traceback)\n")
    with pytest.raises(RuntimeError, match="renderer"):
        main(["local", "--root", str(CAPTURES["h200"]), "--debug"])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_named_first_has_the_same_help_and_options_alone(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``audit NAME`` runs from a command line holding only NAME (typer builds each
    command's options on every start): what it accepts and says is the same."""
    assert main([name, "-h"]) == 0
    alone = capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        app(args=[name, "-h"], prog_name="audit")
    assert done.value.code == 0
    assert alone == capsys.readouterr().out
    assert alone.startswith(f"Usage: audit {name} ")


def test_the_whole_command_line_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-h"]) == 0
    listed = capsys.readouterr().out.split("Commands:", 1)[1].split()
    assert set(COMMANDS) <= set(listed)
    assert main(["locl"]) == 2
    assert "Did you mean 'local'?" in capsys.readouterr().err
