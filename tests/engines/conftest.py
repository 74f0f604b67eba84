"""Fixtures of the engine tests: generated hosts as sysroot directories, an SSH target."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.hostgen import HostSpec, build_host
from tests.support.sshd import Sshd, SshLab, free_port, wait_for_port

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"

#: The generated 8-GPU node with none of the six problems planted.
CLEAN = HostSpec(bad_governor=False, deep_cstates=False, numa_balancing=False,
                 old_kernel=False, low_mrrs=False, stale_lxc_major=False)


def _host_factory() -> tuple[Path, Callable[..., Path]]:
    parent = Path(tempfile.mkdtemp(prefix="ha-engine-"))
    os.chmod(parent, 0o755)
    counter = iter(range(1000))

    def factory(spec: HostSpec | None = None, **fields: object) -> Path:
        chosen = spec or HostSpec(**fields)  # type: ignore[arg-type]
        tree = build_host(chosen)
        # The engines' node is an RDMA node set up as rdma-core's package sets one up (its
        # limits file): its problems are the six planted ones, not rdma.memlock.
        tree.put("/etc/security/limits.d/rdma.conf",
                 "*       soft    memlock         unlimited\n"
                 "*       hard    memlock         unlimited\n")
        return tree.write_dir(parent / f"{chosen.hostname}-{next(counter)}")

    return parent, factory


@pytest.fixture
def make_host() -> Iterator[Callable[..., Path]]:
    """Return a factory writing a generated host (``HostSpec`` fields as keywords) to a
    directory every user can read (engines run audits as other users): for tests that
    change the host."""
    parent, factory = _host_factory()
    yield factory
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_hosts() -> Iterator[Callable[..., Path]]:
    parent, factory = _host_factory()
    yield factory
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def failing_host(shared_hosts: Callable[..., Path]) -> Path:
    """The 8-GPU node with its six problems (read only: tests that fix use make_host)."""
    return shared_hosts()


@pytest.fixture(scope="session")
def clean_host(shared_hosts: Callable[..., Path]) -> Path:
    """The 8-GPU node tuned (it still warns that NUMA balancing is on at boot); read only."""
    return shared_hosts(CLEAN)


# -- a target reached over real SSH: the lab's sshd on loopback, a user with sudo ------------

#: The engine tests' own user (per process, so runs side by side do not share it).
ENGINE_USER = f"ha-eng{os.getpid() % 100000:05d}"


@dataclass
class SshTarget:
    """A running sshd on loopback and a user who may log in with the lab's key and sudo."""

    lab: SshLab
    server: Sshd
    known_hosts: Path
    user: str


@pytest.fixture(scope="session")
def ssh_target() -> Iterator[SshTarget]:
    """Start one sshd on 127.0.0.1 with a password-less sudo user; remove both at the end."""
    if os.geteuid() != 0:
        pytest.skip("the engine tests over SSH need root: they add a user and start sshd")
    if not os.path.exists("/usr/sbin/sshd"):
        pytest.fail("openssh-server is not installed (tests/run.sh installs it)")
    # Not under pytest's tmp dir: that is 0700, and sshd reads the keys as the user.
    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-englab-")))
    try:
        lab.add_user(ENGINE_USER, sudo=True)
        server = lab.start()
        known = lab.known_hosts(lab.root / "known_hosts", [server])
        yield SshTarget(lab, server, known, ENGINE_USER)
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)
        # Ansible's remote temporary directory of the user (ANSIBLE_REMOTE_TMP).
        shutil.rmtree(f"/tmp/.ansible-{ENGINE_USER}", ignore_errors=True)


# -- Debian's node_exporter with only its textfile collector ------------------------------


@dataclass
class NodeExporter:
    port: int
    textfiles: Path
    #: Its log (stdout and stderr): where a rejected series is said.
    log: Path | None = None

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def value(self, text: str, name: str, **labels: str) -> float | None:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    return float(sample.value)
        return None


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[NodeExporter]:
    """Start node_exporter with only its textfile collector, on a free loopback port."""
    if not Path(NODE_EXPORTER).exists():
        pytest.fail("prometheus-node-exporter is not installed (tests/run.sh installs it)")
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    textfiles.chmod(0o755)
    port = free_port()
    log = open(tmp_path / "node_exporter.log", "wb")
    process = subprocess.Popen(
        [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
         "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={textfiles}"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port)
        yield NodeExporter(port, textfiles, tmp_path / "node_exporter.log")
    finally:
        process.terminate()
        process.wait(10)
        log.close()
