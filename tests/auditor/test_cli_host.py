"""``audit host`` end to end against real sshd instances: reports, fleets, faults, inventories."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from auditor.cli import main
from auditor.hosts import LocalHost
from auditor.hosts.ssh import SshTarget
from auditor.inventory import expand_range, load_inventory, parse_ini, parse_yaml
from auditor.model import CheckResult, Report, Status
from auditor.render import render_fleet_table
from tests.auditor.conftest import NOPY, NOSUDO, SUDO, SshEnv
from tests.support.factories import make_finding
from tests.support.fixkit import tree_hash
from tests.support.hostgen import FIXED_BY_SCRIPT, build_host
from tests.support.sshd import SilentListener, Sshd, free_port, netns, netns_available

ssh = pytest.mark.ssh


def run_audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def findings_without_host(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in f.items() if k != "host"} for f in document["findings"]]


@ssh
def test_replay_equals_audit_local(ssh_env: SshEnv, capsys: pytest.CaptureFixture[str]) -> None:
    """Over SSH (root through sudo) the findings are those of ``audit local`` here."""
    code, out, _ = run_audit(capsys, "host", ssh_env.server.target, *ssh_env.cli_args(),
                             "--sudo", "--format", "json")
    local_code, local_out, _ = run_audit(capsys, "local", "--format", "json")
    remote, local = json.loads(out), json.loads(local_out)
    assert code == local_code
    assert remote["target"] == f"ssh://{SUDO}@127.0.0.1:{ssh_env.server.port}"
    assert findings_without_host(remote) == findings_without_host(local)
    assert [c["check"] for c in remote["checks"]] == [c["check"] for c in local["checks"]]
    assert remote["facts"] == local["facts"]
    # A remote audit's time is all of it: connecting and collecting, not the checks alone.
    timing = remote["timing"]
    assert set(timing) == {"connect_s", "collect_s", "checks_s"} and "timing" not in local
    assert timing["connect_s"] > 0 and timing["collect_s"] > 0
    assert remote["duration_s"] >= timing["connect_s"] + timing["collect_s"] + timing[
        "checks_s"] - 0.001
    _, text, _ = run_audit(capsys, "host", ssh_env.server.target, *ssh_env.cli_args())
    assert re.search(r"\d+\.\d\d s \(connect \d+\.\d\d s, collect \d+\.\d\d s, "
                     r"checks \d+\.\d\d s\)$", text.splitlines()[0])


@ssh
def test_host_without_python_gives_the_same_findings(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    _, python_out, _ = run_audit(capsys, "host", ssh_env.server.target,
                                 *ssh_env.cli_args(NOSUDO), "--format", "json")
    _, sh_out, _ = run_audit(capsys, "host", ssh_env.server.target,
                             *ssh_env.cli_args(NOPY), "--format", "json")
    assert findings_without_host(json.loads(sh_out)) == findings_without_host(
        json.loads(python_out))


@ssh
def test_sudo_without_password_is_noted_in_the_report(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_audit(capsys, "host", ssh_env.server.target,
                               *ssh_env.cli_args(NOSUDO), "--sudo", "--format", "json")
    assert code in (0, 1)
    # said once on stderr, and in the report
    assert err == (f"audit: warning: {ssh_env.server.target}: --sudo: sudo -n asked for a "
                   "password; audited without root\n")
    document = json.loads(out)
    assert document["facts"]["privilege"] == "sudo -n asked for a password"
    skips = [f for f in document["findings"] if "needs root" in f["message"]]
    if LocalHost().glob("/sys/bus/pci/devices/*/config") and skips:
        assert all(f["status"] == "skip" and f["message"].endswith(
            "(needs root: sudo -n asked for a password)") for f in skips)
    for fmt in ("text", "markdown", "html", "junit", "prometheus"):
        _, out, _ = run_audit(capsys, "host", ssh_env.server.target, *ssh_env.cli_args(NOSUDO),
                              "--sudo", "--format", fmt)
        head = out[:out.find("STATUS")] if fmt == "text" else out
        assert "sudo -n asked for a password" in head, fmt


@ssh
def test_fleet_with_unreachable_hosts(
    ssh_env: SshEnv, fleet: list[Sshd], capsys: pytest.CaptureFixture[str]
) -> None:
    """Dead hosts get one line each and exit 3; every live host is still audited."""
    dead = f"127.0.0.1:{free_port()}"
    silent = SilentListener()
    try:
        targets = [s.target for s in fleet] + [dead, f"127.0.0.1:{silent.port}"]
        code, out, err = run_audit(capsys, "host", *targets, *ssh_env.cli_args(),
                                   "--timeout", "1.5", "--format", "json")
    finally:
        silent.close()
    document = json.loads(out)
    assert code == 3
    assert document["summary"]["hosts"] == 5 and document["summary"]["unreachable"] == 2
    by_target = {h["target"].rsplit("@", 1)[1]: h for h in document["hosts"]}
    for server in fleet:
        assert "error" not in by_target[server.target]
        assert by_target[server.target]["findings"]
    assert "refused" in by_target[dead]["error"]
    assert "timed out" in by_target[f"127.0.0.1:{silent.port}"]["error"]
    # Not a terminal: one line per host, an error line for each that could not be audited.
    lines = err.strip().splitlines()
    assert len(lines) == 5
    errors = [line for line in lines if line.startswith("audit: error: ")]
    assert len(errors) == 2 and any(dead in line and "refused" in line for line in errors)
    # Each names the target asked for and the hostname it turned out to have.
    assert sorted(line.split()[2] for line in lines if re.match(
        r"audit: \[\d/5\] \S+ \(fleet-\d\): (pass|warn|fail) ", line)) == sorted(
        server.target for server in fleet)


@ssh
def test_fleet_text_has_a_hosts_by_checks_table(
    ssh_env: SshEnv, fleet: list[Sshd], capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, out, _ = run_audit(capsys, "host", fleet[0].target, fleet[1].target, dead,
                             *ssh_env.cli_args())
    assert code == 3
    table = out[out.index("Fleet: 3 hosts"):]
    assert "numa.balancing" in table.splitlines()[2]
    rows = table.splitlines()[3:]
    assert sum(1 for row in rows if dead in row and "unreachable" in row) == 1
    assert sum(1 for row in rows if fleet[0].target in row and "fleet-0" in row) == 1


@ssh
def test_inventory_ini_reaches_hosts_by_ansible_vars(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "# GPU fleet\n[gpu]\n"
        f"gpu-a ansible_host=127.0.0.1 ansible_port={fleet[0].port}\n"
        f"gpu-b ansible_host=127.0.0.1 ansible_port={fleet[1].port} ansible_user={NOSUDO}\n"
        f"[gpu:vars]\nansible_user={SUDO}\n"
    )
    code, out, err = run_audit(capsys, "host", "-i", str(inventory), "--identity",
                               str(ssh_env.lab.client_key), "--known-hosts",
                               str(ssh_env.known_hosts), "--format", "json")
    document = json.loads(out)
    assert "error" not in err and code in (0, 1)
    assert sorted(h["target"] for h in document["hosts"]) == sorted([
        f"ssh://{SUDO}@127.0.0.1:{fleet[0].port}",
        f"ssh://{NOSUDO}@127.0.0.1:{fleet[1].port}",
    ])


@ssh
def test_host_keys_from_home_known_hosts(
    ssh_env: SshEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown key: refused; --accept-new-host-keys records it; a changed key: refused."""
    monkeypatch.setenv("HOME", str(tmp_path))
    base = ["host", ssh_env.server.target, "--user", SUDO, "--identity",
            str(ssh_env.lab.client_key)]
    code, _, err = run_audit(capsys, *base)
    assert code == 3 and "not in known_hosts" in err and err.count("\n") == 1
    code, _, err = run_audit(capsys, *base, "--accept-new-host-keys")
    assert code in (0, 1) and err == ""
    known = tmp_path / ".ssh" / "known_hosts"
    assert known.read_text() == ssh_env.server.known_hosts_line
    code, _, err = run_audit(capsys, *base)
    assert code in (0, 1) and err == ""
    other = ssh_env.lab.root / "other_host_key"
    if not other.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                       check=True)
    changed = ssh_env.lab.start(host_key=other)
    try:
        key = ssh_env.server.known_hosts_line.split(" ", 1)[1]
        known.write_text(f"[127.0.0.1]:{changed.port} {key}")
        code, _, err = run_audit(capsys, "host", changed.target, *base[2:],
                                 "--accept-new-host-keys")
    finally:
        changed.stop()
    assert code == 3 and "CHANGED" in err
    assert known.read_text() == f"[127.0.0.1]:{changed.port} {key}"


@ssh
@pytest.mark.netns
def test_namespace_hosts_dead_and_alive(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a namespace: a live sshd is audited while a silent address and a closed port fail."""
    if not netns_available():
        pytest.skip("network namespaces are not available (needs root and iproute2)")
    with netns(202) as ns:
        server = ssh_env.lab.start(address=ns.address, port=2222, netns=ns.name)
        known = ssh_env.known_hosts.parent / "known_hosts_ns"
        ssh_env.lab.known_hosts(known, [server])
        try:
            silent = f"10.200.{ns.index}.3:22"  # nobody answers ARP: packets go nowhere
            closed = f"{ns.address}:2223"
            code, out, err = run_audit(
                capsys, "host", server.target, silent, closed, "--user", SUDO,
                "--identity", str(ssh_env.lab.client_key), "--known-hosts", str(known),
                # 3 s: the live host's whole audit must fit, on a machine that runs the
                # suite on every CPU at once.
                "--timeout", "3", "--format", "json")
        finally:
            server.stop()
    document = json.loads(out)
    assert code == 3
    errors = {h["target"].rsplit("@", 1)[1]: h.get("error", "") for h in document["hosts"]}
    assert errors[server.target] == ""
    assert "refused" in errors[closed]
    assert "timed out" in errors[silent] or "unreachable" in errors[silent]
    assert len([line for line in err.splitlines() if line.startswith("audit: error:")]) == 2


@pytest.mark.parametrize("args", [
    ["host"],
    ["host", "not a host"],
    ["host", "-i", "/nonexistent/inventory"],
    ["host", "gpu-01", "--check", "no.such"],
    ["host", "gpu-01", "--root", "images/gpu-01"],
    ["host", "gpu-01", "--root", "/srv/../etc"],
])
def test_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_audit(capsys, *args)
    assert code == 2 and err.startswith("audit: error:")


def test_audit_local_does_not_import_ssh_libraries() -> None:
    probe = ("import sys, auditor.cli; "
             "bad = [m for m in ('fabric', 'paramiko', 'invoke', 'rich') if m in sys.modules]; "
             "print(*bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_fleet_table_lists_every_host_and_check() -> None:
    ok = Report("gpu-01", "ssh://root@gpu-01:22", "", 0.1, (
        CheckResult("numa.balancing", 0.0, (make_finding(status=Status.FAIL),)),
        CheckResult("cpu.governor", 0.0, (make_finding(check="cpu.governor",
                                                       status=Status.PASS),)),
    ))
    down = Report("gpu-02", "ssh://root@gpu-02:22", "", 0.1, (),
                  error="gpu-02: connection timed out after 10 s")
    text = render_fleet_table([ok, down])
    lines = text.splitlines()
    assert lines[0].startswith("Fleet: 2 hosts") and "1 unreachable" in lines[0]
    header = next(line for line in lines if "HOST" in line)
    assert header.split()[2:] == ["numa.balancing", "cpu.governor"]
    assert next(line for line in lines if "gpu-01" in line).split()[2:] == ["fail", "pass"]
    assert "unreachable: gpu-02: connection timed out" in text
    assert not [line for line in lines if line != line.rstrip()]


# -- inventories ------------------------------------------------------------------------


def test_plain_inventory(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# comment\ngpu-01\nops@gpu-02:2222  # inline\n\n[fd00::7]:22\n")
    assert load_inventory(str(path)) == [
        SshTarget("gpu-01", None, None, "gpu-01"),
        SshTarget("gpu-02", "ops", 2222, "ops@gpu-02:2222"),
        SshTarget("fd00::7", None, 22, "[fd00::7]:22"),
    ]


def test_ansible_ini_inventory_groups_vars_children_and_ranges() -> None:
    text = """
[all:vars]
ansible_user=admin

[gpu]
gpu[01:03].dc ansible_port=2200
lone ansible_host=10.0.0.9 ansible_user=root ansible_port=2022

[cpu]
cpu-a

[infer:children]
gpu
cpu

[cpu:vars]
ansible_port=2300
"""
    targets = {t.label: t for t in parse_ini(text)}
    assert sorted(targets) == ["cpu-a", "gpu01.dc", "gpu02.dc", "gpu03.dc", "lone"]
    assert targets["gpu02.dc"] == SshTarget("gpu02.dc", "admin", 2200, "gpu02.dc")
    assert targets["lone"] == SshTarget("10.0.0.9", "root", 2022, "lone")
    assert targets["cpu-a"] == SshTarget("cpu-a", "admin", 2300, "cpu-a")


def test_ansible_yaml_inventory() -> None:
    text = """---
all:
  vars:
    ansible_user: admin
  hosts:
    edge-1:
  children:
    gpu:
      hosts:
        gpu-a:
          ansible_host: 10.1.0.1
          ansible_port: "2201"
        gpu-[b:c]:
      vars:
        ansible_user: 'ops'   # group wins over all
"""
    targets = {t.label: t for t in parse_yaml(text)}
    assert targets["edge-1"] == SshTarget("edge-1", "admin", None, "edge-1")
    assert targets["gpu-a"] == SshTarget("10.1.0.1", "ops", 2201, "gpu-a")
    assert targets["gpu-c"] == SshTarget("gpu-c", "ops", None, "gpu-c")


def test_yaml_inventory_is_detected_without_extension(tmp_path: Path) -> None:
    path = tmp_path / "inventory"
    path.write_text("all:\n  hosts:\n    a:\n    b:\n")
    assert [t.host for t in load_inventory(str(path))] == ["a", "b"]


def test_expand_range_keeps_zero_padding() -> None:
    assert expand_range("n[08:10]") == ["n08", "n09", "n10"]
    assert expand_range("r[a:b]n[1:2]") == ["ran1", "ran2", "rbn1", "rbn2"]


def test_inventory_garbage_is_a_usage_error(tmp_path: Path) -> None:
    from auditor.errors import UsageError

    path = tmp_path / "bad.ini"
    path.write_text("[gpu]\nhost ansible_port=twenty\n")
    with pytest.raises(UsageError, match="ansible_port"):
        load_inventory(str(path))
    path.write_text("# nothing\n")
    with pytest.raises(UsageError, match="names no hosts"):
        load_inventory(str(path))
    os.chmod(path, 0o000)


@ssh
def test_fix_script_for_one_remote_host(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The fix and its rollback are written for the audited host, and are valid bash."""
    fix = tmp_path / "fix.sh"
    code, _out, err = run_audit(capsys, "host", ssh_env.server.target,
                                *ssh_env.cli_args(SUDO), "--sudo", "--fix-script",
                                str(fix))
    assert code in (0, 1), err
    rollback = tmp_path / "fix.rollback.sh"
    assert fix.is_file() and rollback.is_file()
    assert "dry run: nothing changed" in err
    for script in (fix, rollback):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert socket.gethostname() in script.read_text()


@ssh
def test_fix_options_take_exactly_one_host(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _out, err = run_audit(capsys, "host", ssh_env.server.target, ssh_env.server.target,
                                *ssh_env.cli_args(SUDO), "--fix-script",
                                str(tmp_path / "fix.sh"))
    assert code == 2 and "exactly one host" in err


def test_ssh_config_alias(ssh_env: SshEnv, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """An alias from an ssh config supplies HostName, Port, User and IdentityFile."""
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host gpu-alias\n    HostName 127.0.0.1\n"
        f"    Port {ssh_env.server.port}\n    User {NOSUDO}\n"
        f"    IdentityFile {ssh_env.lab.client_key}\n"
    )
    code, out, err = run_audit(capsys, "host", "gpu-alias", "--ssh-config", str(config),
                               "--known-hosts", str(ssh_env.known_hosts), "--format", "json")
    assert err == "" and code in (0, 1)
    assert json.loads(out)["target"] == f"ssh://{NOSUDO}@gpu-alias:{ssh_env.server.port}"


@ssh
def test_proxyjump_checks_the_jump_hosts_key_too(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jump\n    HostName 127.0.0.1\n    Port {ssh_env.server.port}\n"
        f"    User {NOSUDO}\n    IdentityFile {ssh_env.lab.client_key}\n"
        f"Host behind\n    HostName 127.0.0.1\n    Port {fleet[0].port}\n"
        f"    User {SUDO}\n    IdentityFile {ssh_env.lab.client_key}\n    ProxyJump jump\n"
    )
    both = tmp_path / "both"
    ssh_env.lab.known_hosts(both, [ssh_env.server, fleet[0]])
    code, out, err = run_audit(capsys, "host", "behind", "--ssh-config", str(config),
                               "--known-hosts", str(both), "--format", "json")
    assert err == "" and code in (0, 1)
    assert json.loads(out)["findings"]
    only_target = tmp_path / "only-target"
    ssh_env.lab.known_hosts(only_target, [fleet[0]])
    code, _, err = run_audit(capsys, "host", "behind", "--ssh-config", str(config),
                             "--known-hosts", str(only_target))
    assert code == 3
    assert f"[127.0.0.1]:{ssh_env.server.port} is not in known_hosts" in err


@ssh
def test_progress_bar_on_a_terminal_and_lines_off_one(
    ssh_env: SshEnv, fleet: list[Sshd]
) -> None:
    """stderr a terminal: rich's bar, no per-host lines; a pipe: one line per host."""
    command = [str(Path(sys.executable).parent / "audit"), "host", fleet[0].target,
               fleet[1].target, *ssh_env.cli_args(), "--check", "numa.balancing"]
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=terminal, env={**os.environ, "TERM": "xterm",
                                                         "COLUMNS": "120"})
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.communicate(timeout=120)
    finally:
        os.close(controller)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert process.returncode in (0, 1), shown
    assert "auditing" in shown and "2/2" in shown and "\x1b[" in shown
    assert "audit: [" not in shown
    piped = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    lines = piped.stderr.splitlines()
    assert len(lines) == 2 and all(re.match(r"audit: \[[12]/2\] \S+ \(fleet-[01]\): "
                                            r"(pass|warn|fail) "
                                            r"\(\d+\.\d\d s: connect \d+\.\d\d s, "
                                            r"collect \d+\.\d\d s\)$", line)
                                   for line in lines), lines


# -- applying a fix over SSH: to a sysroot on the host (--root), so nothing here changes ------


@pytest.fixture
def image() -> Iterator[Path]:
    """The 8-GPU Proxmox host with all six problems, in a directory every test user can read."""
    parent = Path(tempfile.mkdtemp(prefix="ha-image-"))
    os.chmod(parent, 0o755)
    try:
        yield build_host().write_dir(parent / "pve-gpu-01")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def apply_args(ssh_env: SshEnv, root: Path, user: str = SUDO) -> list[str]:
    """Return the arguments of ``audit`` that apply the fix to ``root`` on the lab's sshd."""
    return ["host", ssh_env.server.target, *ssh_env.cli_args(user), "--sudo", "--root",
            str(root), "--apply"]


def check_statuses(document: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for finding in document["findings"]:
        found.setdefault(finding["check"], set()).add(finding["status"])
    return found


@ssh
def test_apply_asks_on_a_terminal_then_fixes_and_audits_again(
    ssh_env: SshEnv, image: Path
) -> None:
    """No changes without a yes; with one, the fix runs under sudo and before/after is shown."""
    before = tree_hash(image)
    for answer in ("n", "y"):
        controller, terminal = pty.openpty()
        try:
            process = subprocess.Popen([str(Path(sys.executable).parent / "audit"),
                                        *apply_args(ssh_env, image)], stdin=terminal,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            os.write(controller, f"{answer}\n".encode())
            out, err = process.communicate(timeout=120)
        finally:
            os.close(controller)
            os.close(terminal)
        text = err.decode()
        if answer == "n":
            assert process.returncode == 1, text
            assert b"? [y/N]" in out and "not applied" in text
            assert tree_hash(image) == before
    assert process.returncode == 1, text  # the kernel still needs its reboot
    for check in FIXED_BY_SCRIPT:
        assert re.search(rf"^\s+{re.escape(check)}\s+fail -> pass$", text, re.M), text
    assert re.search(r"^\s+kernel\.version\s+fail -> fail", text, re.M)
    # The rollback is kept on the host, outside the sysroot (the fix ran as root there).
    [kept] = re.findall(rf"undo on {re.escape(ssh_env.server.target)} with: sudo bash "
                        r"(/var/lib/host-auditor/sysroots/\S+/rollback\.sh)$", text, re.M)
    assert not (image / "var/lib/host-auditor").exists()
    assert tree_hash(image) != before
    undone = subprocess.run(["bash", kept], capture_output=True, text=True, check=False,
                            env=without_state_dir())
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(image) == before and not Path(kept).exists()


def without_state_dir() -> dict[str, str]:
    """Return this environment without the tests' state directory for sysroot fixes: a fix
    run under sudo on the host keeps its state where root keeps it."""
    from auditor.shipped.sysroot_fix import STATE_ENV

    return {k: v for k, v in os.environ.items() if k != STATE_ENV}


@ssh
def test_apply_with_yes_then_again_then_the_rollback(
    ssh_env: SshEnv, image: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The report after the fix passes; a second apply has nothing to do; undo restores all."""
    before = tree_hash(image)
    undo = tmp_path / "undo.sh"
    code, out, err = run_audit(capsys, *apply_args(ssh_env, image), "--yes",
                               "--format", "json", "--rollback-script", str(undo))
    assert code == 1, err
    after = json.loads(out)
    assert after["target"] == f"ssh://{SUDO}@127.0.0.1:{ssh_env.server.port}:{image}"
    assert after["host"] == "pve-gpu-01"
    statuses = check_statuses(after)
    assert all(statuses[check] == {"pass"} for check in FIXED_BY_SCRIPT), statuses
    assert "fail" in statuses["kernel.version"]
    fixed = tree_hash(image)
    code, _out, err = run_audit(capsys, *apply_args(ssh_env, image), "--yes")
    assert code == 1 and "nothing to apply" in err
    assert tree_hash(image) == fixed
    undone = subprocess.run(["bash", str(undo)], capture_output=True, text=True, check=False,
                            env=without_state_dir())
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(image) == before


@ssh
def test_missing_remote_root_is_one_line_and_exit_3(
    ssh_env: SshEnv, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _out, err = run_audit(capsys, "host", ssh_env.server.target, *ssh_env.cli_args(),
                                "--root", str(tmp_path / "absent"))
    assert code == 3
    assert err.startswith("audit: error:") and "absent: no such directory" in err
    assert len(err.strip().splitlines()) == 1


@ssh
def test_apply_needs_yes_off_a_terminal_and_sudo_on_the_host(
    ssh_env: SshEnv, image: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_hash(image)
    code, _out, err = run_audit(capsys, *apply_args(ssh_env, image))
    assert code == 2 and "confirm with --yes" in err
    code, _out, err = run_audit(capsys, *apply_args(ssh_env, image, NOSUDO), "--yes")
    assert code == 1
    assert "password is required" in err and "the fix script exited 1" in err
    assert tree_hash(image) == before


@pytest.mark.parametrize("option", ["--identity", "--ssh-config"])
def test_a_bad_identity_or_ssh_config_is_a_usage_error_naming_it(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 before any host is tried (an unresolvable host would be exit 3)."""
    hosts = ["gpu-01.invalid", "gpu-02.invalid"]
    missing = tmp_path / "absent"
    code, out, err = run_audit(capsys, "host", *hosts, option, str(missing))
    assert (code, out) == (2, "")
    assert err.startswith(f"audit: error: {missing}: no such ") and err.count("\n") == 1
    code, _, err = run_audit(capsys, "host", *hosts, option, str(tmp_path))
    assert code == 2 and f"{tmp_path}: " in err and "not a regular file" in err
    code, _, err = run_audit(capsys, "snapshot", "gpu-01.invalid", "-o", str(tmp_path / "s"),
                             option, str(missing))
    assert code == 2 and str(missing) in err


def test_an_ssh_config_that_does_not_parse_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu\n    HostName\n")
    code, _, err = run_audit(capsys, "host", "gpu", "--ssh-config", str(config))
    assert code == 2
    assert err.startswith(f"audit: error: {config}: not a valid ssh config (") and \
        err.count("\n") == 1


@ssh
def test_html_for_several_hosts_is_the_fleet_page(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """audit host -f html with several hosts writes the page audit merge -f html makes."""
    dead = f"127.0.0.1:{free_port()}"
    page = tmp_path / "fleet.html"
    code, _, _ = run_audit(capsys, "host", fleet[0].target, fleet[1].target, dead,
                           *ssh_env.cli_args(), "-o", str(page))
    assert code == 3
    html = page.read_text()
    assert html.count('class="host-row') == 3 and 'class="grid"' in html
    assert '<p class="summary" id="summary">' in html and "<h2>Tuning fingerprints</h2>" in html
    # Each row names the target asked for and the hostname it turned out to have.
    rows = re.findall(r'<tr class="host-row (\w+)[^"]*" data-host="([^"]+)"', html)
    live = sorted(host for _, host in rows if "(fleet-" in host)
    assert live == sorted(f"{server.target} (fleet-{n})" for n, server in enumerate(fleet[:2]))
    # an error keeps its case: no upper-casing style on it
    assert re.search(r'class="muted error-text">127\.0\.0\.1:\d+: connection refused<', html)
