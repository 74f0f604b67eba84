"""SshHost against a real sshd on loopback (and in network namespaces for latency)."""

from __future__ import annotations

import io
import os
import socket
import tarfile
import time
from pathlib import Path

import pytest

from auditor.errors import AuthenticationFailed, HostKeyRejected, HostUnreachable, UsageError
from auditor.hosts import LocalHost
from auditor.hosts.ssh import SshContext, SshHost, SshTarget, parse_target
from auditor.registry import collected_paths, load_checks
from auditor.runner import audit
from tests.auditor.conftest import DROP, NOPY, NOSUDO, SUDO, SshEnv
from tests.support.sshd import (
    DelayProxy,
    SilentListener,
    keygen,
    netem_available,
    netns,
    netns_available,
)

pytestmark = pytest.mark.ssh

PCI_CONFIGS = "/sys/bus/pci/devices/*/config"
PATTERNS = [*collected_paths(load_checks()), PCI_CONFIGS, "/proc/devices"]
#: Patterns whose matches stay put between a collection and a look at the live host
#: (processes come and go, so their /proc entries are left out of comparisons, and so are
#: the files the kernel changes as time passes: the uptime, runtime PM time and state, the
#: free memory).
VOLATILE = {"/proc/uptime", "/sys/bus/pci/devices/*/power/runtime_suspended_time",
            "/sys/bus/pci/devices/*/power/runtime_status",
            # the kernel log grows, and who may read it depends on the user (dmesg_restrict)
            "/host-auditor/kmsg", "/proc/meminfo"}
# pid 1's entries differ by who reads them (its namespace links need ptrace access).
STABLE_PATTERNS = [p for p in PATTERNS if not p.startswith(("/proc/[0-9]", "/proc/1/"))
                   and p not in VOLATILE]


def open_host(env: SshEnv, user: str = SUDO, target: str | None = None,
              patterns: list[str] | None = None, **options: object) -> SshHost:
    return SshHost.open(parse_target(target or env.server.target), env.options(user, **options),
                        patterns or PATTERNS)


def config_sizes(host: SshHost) -> dict[str, int]:
    return {path: len(host.read_bytes(path)) for path in host.glob(PCI_CONFIGS)}


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu-01", SshTarget("gpu-01", None, None, "gpu-01")),
    ("root@10.0.0.7:2222", SshTarget("10.0.0.7", "root", 2222, "root@10.0.0.7:2222")),
    ("ops@[fe80::1%eth0]:22", SshTarget("fe80::1%eth0", "ops", 22, "ops@[fe80::1%eth0]:22")),
    ("ssh://a@b:23", SshTarget("b", "a", 23, "ssh://a@b:23")),
    ("fd00::5", SshTarget("fd00::5", None, None, "fd00::5")),
])
def test_parse_target(text: str, expected: SshTarget) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize("text", ["", "a b", "host:99999", "user@", "h:port", "@h"])
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_target(text)


def test_reads_match_the_live_host(ssh_env: SshEnv) -> None:
    """With sudo the remote collection reads exactly what this (root) process reads."""
    host = open_host(ssh_env, sudo=True)
    local = LocalHost()
    assert host.kind == "ssh"
    assert host.target == f"ssh://{SUDO}@127.0.0.1:{ssh_env.server.port}"
    assert host.name == (local.read_optional("/etc/hostname") or "").split()[0]
    assert host.collection is not None and host.collection.method == "python"
    assert host.collection.root and host.privilege_note == ""
    for pattern in STABLE_PATTERNS:
        assert host.glob(pattern) == local.glob(pattern), pattern
        for path in local.glob(pattern):
            entry = local.stat(path)
            if entry is not None and entry.kind == "file":  # device nodes are never read
                assert host.read_bytes(path) == local.read_bytes(path), path
            elif entry is not None and entry.kind in ("chr", "blk"):
                assert host.device_numbers(path) == local.device_numbers(path), path
    assert host.read_text("/proc/devices") == local.read_text("/proc/devices")


def test_tcp_nodelay_is_set(ssh_env: SshEnv) -> None:
    host = SshHost(parse_target(ssh_env.server.target), ssh_env.options())
    host.connect()
    try:
        assert host._conn is not None
        transport = host._conn.client.get_transport()
        assert transport is not None
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        host.close()


def test_sudo_reads_full_pci_config_and_without_it_64_bytes(ssh_env: SshEnv) -> None:
    if not LocalHost().glob(PCI_CONFIGS):
        pytest.skip("this machine has no PCI devices")
    full = config_sizes(open_host(ssh_env, SUDO, sudo=True))
    plain = config_sizes(open_host(ssh_env, SUDO, sudo=False))
    assert full and set(full) == set(plain)
    assert set(plain.values()) == {64}
    assert all(size > 64 for size in full.values())


def test_sudo_needing_a_password_falls_back_with_a_note(ssh_env: SshEnv) -> None:
    host = open_host(ssh_env, NOSUDO, sudo=True)
    assert host.collection is not None
    assert host.collection.sudo == "denied" and not host.collection.root
    assert host.privilege_note == "sudo -n asked for a password"
    assert host.read_text("/proc/devices") == LocalHost().read_text("/proc/devices")
    if LocalHost().glob(PCI_CONFIGS):
        assert set(config_sizes(host).values()) == {64}


def test_host_without_python_uses_sh_and_reads_the_same(ssh_env: SshEnv) -> None:
    python = open_host(ssh_env, NOSUDO)
    shell = open_host(ssh_env, NOPY)
    assert shell.collection is not None and python.collection is not None
    assert (python.collection.method, shell.collection.method) == ("python", "sh")
    for pattern in STABLE_PATTERNS:
        assert shell.glob(pattern) == python.glob(pattern), pattern
        for path in python.glob(pattern):
            entry = python.stat(path)
            if entry is not None and entry.kind == "file":  # device nodes are never read
                assert shell.read_bytes(path) == python.read_bytes(path), path
            elif entry is not None and entry.kind in ("chr", "blk"):
                assert shell.device_numbers(path) == python.device_numbers(path), path
    checks = load_checks()
    from auditor.policy import load_policy

    policy = load_policy(checks, None, None)
    python_report, shell_report = audit(python, checks, policy), audit(shell, checks, policy)
    found = [f.to_dict() for f in python_report.findings]
    assert [f.to_dict() for f in shell_report.findings] == found
    # /proc/self names whichever process reads it: both collectors record their own.
    namespace = LocalHost().readlink("/proc/self/ns/pid")
    assert python.readlink("/proc/self/ns/pid") == shell.readlink("/proc/self/ns/pid")
    assert shell.readlink("/proc/self/ns/pid") == namespace
    assert dict(shell_report.facts)["environment"] == dict(python_report.facts)["environment"]


def test_unknown_host_key_is_refused(ssh_env: SshEnv, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyRejected, match=r"not in known_hosts.*--accept-new-host-keys"):
        open_host(ssh_env, known_hosts=(str(empty),))


def test_accept_new_records_the_key_then_trusts_it(ssh_env: SshEnv, tmp_path: Path) -> None:
    record = tmp_path / "known_hosts"
    host = open_host(ssh_env, known_hosts=(str(record),), accept_new_host_keys=True)
    assert host.name
    assert record.read_text() == ssh_env.server.known_hosts_line
    again = open_host(ssh_env, known_hosts=(str(record),))
    assert again.collection is not None


def test_changed_host_key_is_refused_even_with_accept_new(ssh_env: SshEnv,
                                                          tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_key").with_suffix(".pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{ssh_env.server.port} {other[0]} {other[1]}\n")
    for accept in (False, True):
        with pytest.raises(HostKeyRejected, match="CHANGED"):
            open_host(ssh_env, known_hosts=(str(wrong),), accept_new_host_keys=accept)
    assert wrong.read_text().count("\n") == 1


def test_known_hosts_with_markers_and_host_key_alias(ssh_env: SshEnv, tmp_path: Path) -> None:
    """A @cert-authority or @revoked line costs nothing else; HostKeyAlias names the key:
    a key pinned under the alias is checked against it (a different one is CHANGED even
    with --accept-new-host-keys), and a new one is recorded under the alias."""
    other = keygen(tmp_path / "other_key").with_suffix(".pub").read_text().split()
    mine = ssh_env.server.known_hosts_line.split()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host pinned-gpu\n    HostName 127.0.0.1\n    Port {ssh_env.server.port}\n"
                      "    HostKeyAlias gpu-alias\n")
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority * {other[0]} {other[1]}\n"
                     f"@revoked revoked.example {other[0]} {other[1]}\n"
                     f"gpu-alias {mine[1]} {mine[2]}\n")
    host = SshHost(parse_target("pinned-gpu"), ssh_env.options(
        SUDO, known_hosts=(str(known),), ssh_config=str(config)))
    host.connect()
    host.close()
    wrong = tmp_path / "wrong"
    wrong.write_text(f"gpu-alias {other[0]} {other[1]}\n"
                     f"[127.0.0.1]:{ssh_env.server.port} {mine[1]} {mine[2]}\n")
    with pytest.raises(HostKeyRejected, match="CHANGED"):
        SshHost(parse_target("pinned-gpu"), ssh_env.options(
            SUDO, known_hosts=(str(wrong),), ssh_config=str(config),
            accept_new_host_keys=True)).connect()
    record = tmp_path / "record"
    host = SshHost(parse_target("pinned-gpu"), ssh_env.options(
        SUDO, known_hosts=(str(record),), ssh_config=str(config), accept_new_host_keys=True))
    host.connect()
    host.close()
    assert record.read_text() == f"gpu-alias {mine[1]} {mine[2]}\n"
    revoked = tmp_path / "revoked"
    revoked.write_text(f"@revoked * {mine[1]} {mine[2]}\n{ssh_env.server.known_hosts_line}")
    with pytest.raises(HostKeyRejected, match="REVOKED"):
        open_host(ssh_env, known_hosts=(str(revoked),), accept_new_host_keys=True)


def test_shared_context_reads_known_hosts_once_and_keeps_refusing(ssh_env: SshEnv,
                                                                   tmp_path: Path) -> None:
    # Many hosts' keys in one file, read once for the run; each host is still checked.
    other = keygen(tmp_path / "other_key").with_suffix(".pub").read_text().split()
    port = ssh_env.server.port
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"[10.9.{i // 250}.{i % 250}]:{port} {other[0]} {other[1]}\n"
                             for i in range(400)) + ssh_env.server.known_hosts_line)
    options = ssh_env.options(SUDO, known_hosts=(str(known),))
    context = SshContext(options)
    for _ in range(2):
        host = SshHost(parse_target(ssh_env.server.target), options, context)
        host.connect()
        host.collect(PATTERNS[:3])
        assert host.collection is not None
    # The file changes after it was read: this run keeps what it read, and a key
    # the file never held for this name is refused.
    known.write_text("")
    again = SshHost(parse_target(ssh_env.server.target), options, context)
    again.connect()
    again.close()
    stranger = SshHost(parse_target(f"localhost:{port}"), options, context)
    with pytest.raises(HostKeyRejected, match="not in known_hosts"):
        stranger.connect()
    # A wrong key for the name is a changed key, also through a shared context.
    wrong = tmp_path / "wrong"
    wrong.write_text(f"[127.0.0.1]:{port} {other[0]} {other[1]}\n")
    wrong_options = ssh_env.options(SUDO, known_hosts=(str(wrong),), accept_new_host_keys=True)
    shared = SshContext(wrong_options)
    for _ in range(2):
        with pytest.raises(HostKeyRejected, match="CHANGED"):
            SshHost(parse_target(ssh_env.server.target), wrong_options, shared).connect()
    assert wrong.read_text().count("\n") == 1


def test_shared_context_records_a_new_key_once(ssh_env: SshEnv, tmp_path: Path) -> None:
    record = tmp_path / "known_hosts"
    options = ssh_env.options(SUDO, known_hosts=(str(record),), accept_new_host_keys=True)
    context = SshContext(options)
    for _ in range(3):
        host = SshHost(parse_target(ssh_env.server.target), options, context)
        host.connect()
        host.close()
    # Trusted from the first connection on, for the rest of the run: recorded once.
    assert record.read_text() == ssh_env.server.known_hosts_line


def test_refused_login_is_authentication_failed(ssh_env: SshEnv, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    with pytest.raises(AuthenticationFailed):
        open_host(ssh_env, identity=str(stranger),
                  extra_connect_kwargs={"look_for_keys": False, "allow_agent": False})


def test_nothing_listening_is_unreachable(ssh_env: SshEnv) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(HostUnreachable, match="refused"):
        open_host(ssh_env, target=f"127.0.0.1:{port}")


def test_silent_server_times_out(ssh_env: SshEnv) -> None:
    silent = SilentListener()
    started = time.monotonic()
    try:
        with pytest.raises(HostUnreachable, match=r"timed out"):
            open_host(ssh_env, target=f"127.0.0.1:{silent.port}", timeout=1.0)
    finally:
        silent.close()
    assert time.monotonic() - started < 5


def test_connection_dropped_mid_audit(ssh_env: SshEnv) -> None:
    host = SshHost(parse_target(ssh_env.server.target), ssh_env.options(DROP))
    host.connect()
    with pytest.raises(HostUnreachable, match=r"dropped|exited"):
        host.collect(PATTERNS)


def test_processes_come_from_collected_comm(ssh_env: SshEnv) -> None:
    host = open_host(ssh_env, patterns=["/proc/[0-9]*/comm"])
    names = host.processes()
    assert names is not None and "sshd" in names
    assert open_host(ssh_env, patterns=["/etc/hostname"]).processes() is None


def _collect_times(target: str, env: SshEnv, rounds: int = 5) -> tuple[float, float]:
    """Return the fastest connect and collect seconds of a few runs (least disturbed by load)."""
    connects, collects = [], []
    for _ in range(rounds):
        host = SshHost(parse_target(target), env.options(NOSUDO))
        host.connect()
        host.collect(PATTERNS)
        connects.append(host.connect_s)
        collects.append(host.collect_s)
    return min(connects), min(collects)


def _assert_round_trips(base: float, delayed: float, rtt: float) -> None:
    # What the delay added to the audit after connecting, counted in round trips.
    extra = (delayed - base) / rtt
    assert extra <= 4.0 + 0.5, f"the audit took {extra:.1f} round trips after connecting"
    # Opening the channel and starting the command cannot take less than 2 RTT;
    # allow for noise in the server's own time on a loaded machine.
    assert extra >= 1.0, f"the delay was not applied ({extra:.1f} round trips)"


@pytest.mark.slow
def test_audit_takes_at_most_4_round_trips_through_a_delay(ssh_env: SshEnv) -> None:
    """50 ms RTT through a delaying relay: collecting costs at most 4 RTT after connecting."""
    proxy = DelayProxy(("127.0.0.1", ssh_env.server.port), delay=0.025)
    key = ssh_env.server.known_hosts_line.split(" ", 1)[1]
    extra_known = ssh_env.known_hosts.parent / "known_hosts_proxy"
    extra_known.write_text(f"[127.0.0.1]:{proxy.port} {key}")
    try:
        env = SshEnv(ssh_env.lab, ssh_env.server, extra_known)
        _, base = _collect_times(ssh_env.server.target, ssh_env)
        connect, delayed = _collect_times(f"127.0.0.1:{proxy.port}", env)
    finally:
        proxy.close()
    assert connect > 0.05 * 3  # TCP, key exchange and authentication all pay the delay
    _assert_round_trips(base, delayed, 0.05)


@pytest.mark.netns
@pytest.mark.slow
def test_audit_takes_at_most_4_round_trips_over_netem(ssh_env: SshEnv) -> None:
    """A namespace behind a veth with netem 25 ms each way: at most 4 RTT after connecting."""
    if not netns_available():
        pytest.skip("network namespaces are not available (needs root and iproute2)")
    if not netem_available():
        pytest.skip("the kernel has no netem qdisc (sch_netem); the relay test covers this")
    with netns(201, delay_ms=25) as ns:
        server = ssh_env.lab.start(address=ns.address, port=2222, netns=ns.name)
        known = ssh_env.known_hosts.parent / "known_hosts_netns"
        ssh_env.lab.known_hosts(known, [server])
        env = SshEnv(ssh_env.lab, server, known)
        try:
            _, base = _collect_times(ssh_env.server.target, ssh_env)
            _, delayed = _collect_times(server.target, env)
        finally:
            server.stop()
    _assert_round_trips(base, delayed, 0.05)


def test_collection_is_one_tar_with_links_kept(ssh_env: SshEnv) -> None:
    host = open_host(ssh_env, patterns=["/sys/bus/pci/devices/*/driver", "/etc/os-release"])
    assert host.collection is not None
    with tarfile.open(fileobj=io.BytesIO(host.collection.tar)) as archive:
        kinds = {m.name: m.type for m in archive}
    if os.path.islink("/etc/os-release"):
        assert kinds["etc/os-release"] == tarfile.SYMTYPE
    for path in LocalHost().glob("/sys/bus/pci/devices/*/driver"):
        device = os.path.dirname(path)
        assert kinds[device.lstrip("/")] == tarfile.SYMTYPE  # the device link itself
        # ...and the driver link recorded where the device link leads.
        resolved = os.path.join(os.path.realpath(device), "driver")
        assert kinds[resolved.lstrip("/")] == tarfile.SYMTYPE
        assert host.readlink(path) == os.readlink(path)


def test_a_script_the_host_cannot_start_answers_with_the_shell_s_words(
        ssh_env: SshEnv) -> None:
    """NOPY has no bash: its shell says so and exits at once, while the script is still
    being sent (one larger than the channel's window: the sender waits for room the dead
    command never makes). The result is that exit status and those words, not a broken
    connection, however the race falls."""
    with SshHost(parse_target(ssh_env.server.target), ssh_env.options(NOPY)) as host:
        host.connect()
        for size in (100, 8 << 20):
            result = host.run_script("#" * size + "\necho never\n", timeout=30)
            assert result.returncode == 127 and "bash: not found" in result.output, size
            assert "never" not in result.output
