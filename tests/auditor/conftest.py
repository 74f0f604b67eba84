"""Fixtures for the SSH tests: a real sshd on loopback and test users, made once per session."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.sshd import Sshd, SshLab

# Test users, named per process so that test runs side by side do not share them:
# password-less sudo; no sudo; no python3 on its PATH; a session killed at once.
_TAG = f"{os.getpid() % 100000:05d}"
SUDO, NOSUDO, NOPY, DROP = (f"ha-{role}{_TAG}" for role in ("sudo", "nosudo", "nopy", "drop"))

#: Tools the sh collector needs, linked into a PATH that has no python3.
SH_TOOLS = ("sh", "id", "sudo", "readlink", "head", "od", "ls")


@dataclass
class SshEnv:
    """A running sshd with users: SUDO (password-less sudo), NOSUDO, NOPY (no python3), DROP."""

    lab: SshLab
    server: Sshd
    known_hosts: Path

    def options(self, user: str = SUDO, **overrides: Any) -> Any:
        from auditor.hosts.ssh import SshOptions

        values: dict[str, Any] = {
            "user": user,
            "identity": str(self.lab.client_key),
            "known_hosts": (str(self.known_hosts),),
            "timeout": 10.0,
        }
        values.update(overrides)
        return SshOptions(**values)

    def cli_args(self, user: str = SUDO) -> list[str]:
        return ["--user", user, "--identity", str(self.lab.client_key),
                "--known-hosts", str(self.known_hosts)]


def _require_sshd() -> None:
    if os.geteuid() != 0:
        pytest.skip("the SSH tests need root: they add test users and start sshd")
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (tests/run.sh installs it)")


@pytest.fixture(scope="session")
def ssh_env() -> Iterator[SshEnv]:
    """Start one sshd on 127.0.0.1 with the test users; stop it and remove them at the end."""
    _require_sshd()
    # Not under pytest's tmp dir: that is 0700, and sshd reads the keys as the user.
    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-sshlab-")))
    try:
        nopy = lab.root / "nopy-bin"
        nopy.mkdir()
        for tool in SH_TOOLS:
            found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
            if found:
                (nopy / tool).symlink_to(found)
        lab.add_user(SUDO, sudo=True)
        lab.add_user(NOSUDO)
        lab.add_user(NOPY)
        lab.add_user(DROP)
        server = lab.start(extra=[
            f"Match User {NOPY}",
            f"    SetEnv PATH={nopy}",
            f"Match User {DROP}",
            "    ForceCommand kill -9 $PPID",
        ])
        known = lab.known_hosts(lab.root / "known_hosts", [server])
        yield SshEnv(lab, server, known)
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(ssh_env: SshEnv) -> Iterator[list[Sshd]]:
    """Three more sshd instances on loopback ports, with their keys in the lab's known_hosts:
    three machines (``fleet-N``, each its own hostname and machine id), not this one again."""
    servers = [ssh_env.lab.start(machine=(f"fleet-{n}", f"{n + 1:032x}")) for n in range(3)]
    ssh_env.lab.known_hosts(ssh_env.known_hosts, [ssh_env.server, *servers])
    yield servers
    for server in servers:
        server.stop()
