"""Many hosts at once never mistake a live host for a dead one.

fabric's ``Connection`` writes to the config it is given; one config shared by the
threads of a fleet made healthy hosts fail with "No attribute or config key found".
Each connection now gets a config of its own (``SshContext.config``). The stress
tests build thousands of connections from many threads with the interpreter
switching threads every microsecond; the fleet test audits 44 ssh config aliases
of real loopback sshd instances, several times over.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from auditor.cli import main
from auditor.hosts.ssh import SshContext, SshHost, SshOptions, SshTarget
from auditor.runner import one_line
from tests.auditor.conftest import SUDO, SshEnv
from tests.support.sshd import Sshd

CONNECTIONS = 2000
THREADS = 64


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every microsecond, so a race in shared state shows up at once."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def ssh_config(tmp_path: Path, hosts: int = 50) -> Path:
    """Write an ssh config of aliases, every fifth behind a ProxyJump (a nested Connection)."""
    lines = ["Host jump", "    HostName 10.99.0.1", "    User hop", "    Port 2022"]
    for index in range(hosts):
        lines += [f"Host gpu-{index:03d}", f"    HostName 10.0.{index // 250}.{index % 250}",
                  f"    Port {2200 + index}", "    User ops"]
        if index % 5 == 0:
            lines.append("    ProxyJump jump")
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_in_threads(build: Callable[[int], None]) -> list[str]:
    """Run ``build`` for every index on a thread pool; return each error as one line."""
    errors: list[str] = []

    def guarded(index: int) -> None:
        try:
            build(index)
        except Exception as exc:  # the race surfaces as AttributeError, KeyError, ...
            errors.append(f"{index}: {type(exc).__name__}: {one_line(str(exc), 120)}")

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(guarded, range(CONNECTIONS)))
    return errors


def test_thousands_of_connections_from_many_threads_see_no_error(
    tmp_path: Path, fast_switching: None
) -> None:
    options = SshOptions(user="admin", timeout=5.0, ssh_config=str(ssh_config(tmp_path)))
    context = SshContext(options)

    def build(index: int) -> None:
        alias = f"gpu-{index % 50:03d}"
        conn = SshHost(SshTarget(alias), options, context)._connection(options.timeout)
        # What connect() reads next: each value the ssh config gave this alias.
        assert conn.host == f"10.0.0.{index % 50}", conn.host
        assert int(conn.port) == 2200 + index % 50
        assert conn.user == "admin"  # the command line's user wins over the config's
        # The seconds left of the host's deadline, and the one second paramiko's own
        # timers are given past it (the deadline's watchdog ends the connection first).
        assert conn.connect_timeout == 6
        assert conn.connect_kwargs["transport_factory"] is not None
        if index % 5 == 0:
            assert conn.gateway.host == "10.99.0.1" and conn.gateway.user == "hop"
        else:
            assert not conn.gateway

    assert build_in_threads(build) == []


def test_the_stress_finds_the_race_of_one_shared_config(fast_switching: None) -> None:
    """The same stress on one config shared by every connection fails (the old fault)."""
    import fabric

    shared = fabric.Config(overrides={"load_ssh_configs": True})

    def build(index: int) -> None:
        conn = fabric.Connection(f"10.0.0.{index % 250}", user="ops", port=22, config=shared,
                                 connect_timeout=5)
        assert conn.user == "ops" and not conn.gateway

    errors = build_in_threads(build)
    assert errors, "the stress did not reproduce the shared-config race"
    assert any("No attribute or config key found" in e for e in errors), errors[:3]


# -- a fleet of aliases on real sshd ----------------------------------------------------------

ALIASES = 44
RUNS = 5


@pytest.fixture
def alias_config(ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path) -> tuple[Path, list[str]]:
    """An ssh config of 44 aliases spread over the four loopback sshd instances."""
    servers = [ssh_env.server, *fleet]
    lines: list[str] = []
    names = []
    for index in range(ALIASES):
        server = servers[index % len(servers)]
        name = f"node-{index:02d}"
        names.append(name)
        lines += [f"Host {name}", f"    HostName {server.address}", f"    Port {server.port}",
                  f"    User {SUDO}", f"    IdentityFile {ssh_env.lab.client_key}"]
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    return path, names


@pytest.mark.ssh
@pytest.mark.slow
def test_a_fleet_of_44_aliases_is_audited_whole_every_time(
    ssh_env: SshEnv, alias_config: tuple[Path, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    config, names = alias_config
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # as often as the fleet can bear and still finish
    try:
        for _ in range(RUNS):
            code = main(["host", *names, "--ssh-config", str(config), "--known-hosts",
                         str(ssh_env.known_hosts), "--check", "numa.balancing",
                         "--format", "json", "--workers", "1", "--parallel", "32"])
            out, err = capfd.readouterr()
            document: dict[str, Any] = json.loads(out)
            assert "error:" not in err, err
            assert code in (0, 1), err
            assert document["summary"]["unreachable"] == 0
            # Four machines, each reported once under its first alias, naming the others.
            hosts = document["hosts"]
            assert document["summary"]["targets"] == ALIASES and len(hosts) == 4
            assert sorted(n for h in hosts for n in [h["name"], *h["aliases"]]) == names
            assert all("error" not in h and h["findings"] for h in hosts)
            # stderr is not a terminal: one progress line per finished host, and one line
            # per machine reached under several names
            lines = err.splitlines()
            progress = [line for line in lines if line.startswith("audit: [")]
            assert len(progress) == ALIASES, err
            assert len(lines) == ALIASES + 4, err
    finally:
        sys.setswitchinterval(previous)


def test_a_host_error_is_one_line_whatever_the_exception_says() -> None:
    text = "No attribute or config key found for 'user'\n\nValid keys: []\n\n" + "x " * 500
    line = one_line(f"gpu-07: AttributeError: {text}")
    assert "\n" not in line and len(line) <= 400 and line.endswith("...")
    assert line.startswith("gpu-07: AttributeError: No attribute or config key found")


def test_a_host_failing_with_a_long_exception_gets_one_error_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever a host's failure says, its error line and report error are one line each."""
    from auditor.cli.options import AuditOptions, prepare
    from auditor.hosts.ssh import parse_target
    from auditor.runner import FleetAudit

    def explode(self: SshHost) -> None:
        raise AttributeError("No attribute or config key found for 'user'\n\nValid keys: "
                             "[]\n\nValid real attributes: ['clear', 'clone', ...]")

    monkeypatch.setattr(SshHost, "connect", explode)
    checks, policy = prepare(AuditOptions())
    lines: list[str] = []
    fleet = FleetAudit([parse_target("gpu-01"), parse_target("gpu-02")], SshOptions(),
                       checks, policy, workers=1, on_error=lines.append)
    reports = fleet.run()
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith("gpu-01: AttributeError: No attribute or config key found")
    assert [r.error for r in reports] == lines
