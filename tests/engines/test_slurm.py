"""contrib/slurm against a real one-node Slurm cluster on loopback (Debian's munge,
slurmctld, slurmd; proctrack/linuxproc, no cgroup plugins), and the NHC check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.pyz import audit_pyz
from tests.support.sshd import free_port, wait_for_port
from tests.support.sysroot import CAPTURES

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "contrib" / "slurm"
BIN = Path(sys.executable).parent
#: The nodes run the single-file build (contrib/pyz/build.py), installed where the scripts
#: look, not this checkout: ``audit_pyz()`` (built once per test process).
pytestmark = [pytest.mark.slow, pytest.mark.root]


@dataclass
class Cluster:
    """A running one-node cluster; the node is ``localhost``."""

    workdir: Path
    conf: Path
    #: The shell settings file the contrib scripts read (HOST_AUDITOR_SLURM_CONFIG).
    settings: Path
    env: dict[str, str]

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def node(self, raw: bool = False) -> tuple[str, str]:
        """Return the node's state and reason as sinfo prints them (without the "*" of a
        node slurmctld has not heard from since, unless ``raw``)."""
        out = self.run("sinfo", "-h", "-N", "-n", "localhost", "-o", "%T|%E").stdout.strip()
        state, _, reason = out.partition("|")
        return (state if raw else state.rstrip("*")), reason

    def wait_node(self, predicate: Callable[[str, str], bool], timeout: float = 30,
                  raw: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(*self.node(raw)):
                return
            time.sleep(0.3)
        raise AssertionError(f"node never got there: {self.node()}")

    def configure(self, *audit_args: str) -> None:
        """Point the contrib scripts at this cluster, with these ``audit local`` options."""
        self.settings.write_text(
            f"export SLURM_CONF={self.conf}\n"
            f"AUDIT={audit_pyz()}\n"
            f"AUDIT_ARGS='{' '.join(audit_args)}'\n"
            f"STATE_DIR={self.workdir / 'results'}\n")

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """Run the HealthCheckProgram as slurmd does: as root, no PATH, the node's name."""
        return subprocess.run(
            [str(SLURM / "host-auditor-healthcheck")], capture_output=True, text=True,
            timeout=60, check=False,
            env={"SLURMD_NODENAME": "localhost", "HOST_AUDITOR_SLURM_CONFIG": str(self.settings)})

    def drain(self, reason: str) -> None:
        self.run("scontrol", "update", "NodeName=localhost", "State=DRAIN", f"Reason={reason}")
        self.wait_node(lambda state, _reason: "drain" in state)

    def resume(self) -> None:
        self.run("scontrol", "update", "NodeName=localhost", "State=RESUME")
        self.wait_node(lambda state, _reason: state.startswith("idle"))


def _shim(path: Path, script: Path, settings: Path) -> Path:
    """slurm.conf names a program, not a command line: pass the settings file by a shim.

    slurmd runs the program as it starts, before the test has written the settings: until
    then the shim does nothing (the script's defaults would audit this machine with
    /usr/local/bin/audit and leave its log in this machine's /var/lib/host-auditor).
    """
    path.write_text(f"#!/bin/sh\n[ -f {settings} ] || exit 0\n"
                    f"exec /usr/bin/env HOST_AUDITOR_SLURM_CONFIG={settings} {script}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def start_cluster() -> Iterator[Callable[..., Cluster]]:
    """Return a starter of a one-node cluster (slurm.conf lines may be added); stop it after."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster runs its daemons as root")
    for tool in ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                 "/usr/bin/scontrol", "/usr/bin/srun"):
        if not os.path.exists(tool):
            pytest.fail(f"{tool} is missing (tests/run.sh installs munge, slurmctld, slurmd, "
                        "slurm-client)")
    workdir = Path(tempfile.mkdtemp(prefix="ha-slurm-"))
    os.chmod(workdir, 0o755)
    processes: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> Cluster:
        munge = workdir / "munge"
        munge.mkdir(mode=0o700)
        subprocess.run(["mungekey", "-c", "-k", str(munge / "munge.key")], check=True)
        socket = munge / "munge.socket"
        logs = workdir / "log"
        logs.mkdir()
        for name in ("state", "spool", "results"):
            (workdir / name).mkdir()

        def daemon(name: str, *command: str) -> None:
            log = open(logs / f"{name}.out", "wb")
            processes.append(subprocess.Popen(list(command), stdout=log, stderr=log,
                                              stdin=subprocess.DEVNULL))

        daemon("munged", "/usr/sbin/munged", "--foreground", "--force",
               f"--key-file={munge / 'munge.key'}", f"--socket={socket}",
               f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
               f"--log-file={logs / 'munged.log'}")
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        settings = workdir / "host-auditor-slurm"
        ctld_port, slurmd_port = free_port(), free_port()
        conf = workdir / "slurm.conf"
        conf.write_text("\n".join([
            "ClusterName=hatest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket}",
            f"StateSaveLocation={workdir / 'state'}",
            f"SlurmdSpoolDir={workdir / 'spool'}",
            f"SlurmctldPidFile={workdir / 'slurmctld.pid'}",
            f"SlurmdPidFile={workdir / 'slurmd.pid'}",
            f"SlurmctldLogFile={logs / 'slurmctld.log'}",
            f"SlurmdLogFile={logs / 'slurmd.log'}",
            # No cgroup plug-ins: the tests run in containers without a cgroup to manage.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/linear",
            "MpiDefault=none",
            "ReturnToService=2",
            *extra,
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=100 "
            "State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(conf),
               "HOME": str(workdir)}
        cluster = Cluster(workdir, conf, settings, env)
        cluster.configure("--root", str(CAPTURES["h200"]))
        daemon("slurmctld", "/usr/sbin/slurmctld", "-D", "-c", "-f", str(conf))
        wait_for_port("127.0.0.1", ctld_port)
        daemon("slurmd", "/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", str(conf))
        try:
            cluster.wait_node(lambda state, _reason: state != "" and "*" not in state
                              and not state.startswith(("unknown", "down")), raw=True)
        except AssertionError:
            pytest.fail((logs / "slurmctld.log").read_text()[-2000:]
                        + (logs / "slurmd.log").read_text()[-2000:])
        return cluster

    yield start
    for process in reversed(processes):
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster()


def expected_line(root: Path) -> str:
    proc = subprocess.run([str(audit_pyz()), "local", "--root", str(root), "--format", "line"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip()


# -- HealthCheckProgram ----------------------------------------------------------------------


def test_healthcheck_drains_on_a_finding_and_resumes_what_it_drained(
    cluster: Cluster, failing_host: Path, clean_host: Path
) -> None:
    cluster.configure("--root", str(failing_host))
    run = cluster.healthcheck()
    assert run.returncode == 0, run.stderr
    state, reason = cluster.node()
    assert "drain" in state
    assert reason == f"host-auditor: {expected_line(failing_host)}"
    assert reason.startswith("host-auditor: FAIL ")
    report = json.loads((cluster.workdir / "results" / "localhost.json").read_text())
    assert report["host"] == "pve-gpu-01"  # each run keeps its JSON for audit merge
    cluster.configure("--root", str(clean_host))
    assert cluster.healthcheck().returncode == 0
    assert cluster.node() == ("idle", "none")
    assert cluster.healthcheck().returncode == 0  # clean and idle: nothing to do
    assert cluster.node() == ("idle", "none")


def test_healthcheck_leaves_a_node_drained_for_another_reason(
    cluster: Cluster, failing_host: Path, clean_host: Path
) -> None:
    cluster.drain("maintenance: swap riser")
    for root in (failing_host, clean_host):
        cluster.configure("--root", str(root))
        run = cluster.healthcheck()
        assert run.returncode == 0
        state, reason = cluster.node()
        assert "drain" in state and reason == "maintenance: swap riser"
    cluster.configure("--root", str(failing_host))
    assert "for another reason" in cluster.healthcheck().stderr


def test_healthcheck_does_nothing_when_the_audit_cannot_run(
    cluster: Cluster, failing_host: Path, tmp_path: Path
) -> None:
    cluster.configure("--root", str(failing_host))
    cluster.healthcheck()
    drained = cluster.node()
    assert "drain" in drained[0]
    for args in (("--check", "no.such"), ("--root", str(tmp_path / "absent"))):
        cluster.configure(*args)
        run = cluster.healthcheck()
        assert run.returncode == 0 and "audit exited 2, not draining" in run.stderr
        assert cluster.node() == drained  # neither resumed nor drained again
    cluster.resume()
    cluster.configure("--check", "no.such")
    cluster.healthcheck()
    assert cluster.node() == ("idle", "none")


def test_slurmd_runs_the_healthcheck_itself(start_cluster: Callable[..., Cluster],
                                           failing_host: Path, clean_host: Path) -> None:
    """HealthCheckProgram in slurm.conf: slurmd runs it (no PATH, as root) and it acts."""
    workdir = Path(tempfile.mkdtemp(prefix="ha-slurm-shim-"))
    try:
        settings = workdir / "host-auditor-slurm"
        shim = _shim(workdir / "healthcheck", SLURM / "host-auditor-healthcheck", settings)
        cluster = start_cluster(f"HealthCheckProgram={shim}", "HealthCheckInterval=2",
                                "HealthCheckNodeState=ANY")
        cluster.settings = settings
        cluster.configure("--root", str(failing_host))
        cluster.wait_node(lambda state, reason: "drain" in state
                          and reason.startswith("host-auditor: FAIL "), timeout=45)
        cluster.configure("--root", str(clean_host))
        cluster.wait_node(lambda state, reason: state == "idle" and reason == "none",
                          timeout=45)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- Prolog ---------------------------------------------------------------------------------


def test_prolog_refuses_jobs_on_a_finding_and_fails_open_otherwise(
    start_cluster: Callable[..., Cluster], failing_host: Path, clean_host: Path
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ha-slurm-shim-"))
    try:
        settings = workdir / "host-auditor-slurm"
        shim = _shim(workdir / "prolog", SLURM / "host-auditor-prolog", settings)
        cluster = start_cluster(f"Prolog={shim}")
        cluster.settings = settings
        for args in (("--root", str(clean_host)), ("--check", "no.such"),
                     ("--root", str(workdir / "absent"))):
            cluster.configure(*args)
            job = cluster.run("srun", "-N1", "-n1", "-t", "1", "/bin/echo", "ran")
            assert job.returncode == 0 and job.stdout == "ran\n", (args, job.stderr)
        cluster.configure("--root", str(failing_host))
        job = cluster.run("srun", "-N1", "-n1", "-t", "1", "/bin/echo", "ran")
        assert job.returncode != 0 and "ran" not in job.stdout
        assert "prolog failed" in job.stderr.lower()
        state, _reason = cluster.node()
        assert "drain" in state  # Slurm drains a node whose prolog fails
        log = (cluster.workdir / "log" / "slurmd.log").read_text()
        assert f"host-auditor: {expected_line(failing_host)}" in log
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- srun, then audit merge -----------------------------------------------------------------


def test_srun_audits_each_node_and_merge_reads_the_results(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    """The README's Slurm recipe, one task per node into a shared directory."""
    results = tmp_path / "results"
    results.mkdir()
    os.chmod(tmp_path, 0o755)
    job = cluster.run("srun", "--nodes=1", "--ntasks-per-node=1", "--chdir", str(tmp_path),
                      "bash", "-c", "audit local --format json -o results/$(hostname).json")
    assert job.returncode in (0, 1), job.stderr
    [saved] = results.iterdir()
    assert json.loads(saved.read_text())["target"] == "local"
    merged = cluster.run("audit", "merge", str(results), "--format", "json")
    assert merged.returncode in (0, 1), merged.stderr
    document = json.loads(merged.stdout)
    hosts = document["hosts"] if "hosts" in document else [document]
    assert [h["host"] for h in hosts] == [saved.stem]


# -- NHC ------------------------------------------------------------------------------------

#: NHC's own behaviour the check relies on (mej/nhc, nhc): ``die RET MSG`` marks the node
#: offline through ``eval $OFFLINE_NODE '$HOSTNAME' '$*'`` and ends the run; ``log`` only
#: writes to the log. Here they record what they were given.
NHC_STUBS = r"""
die() { printf 'die %s|%s\n' "$1" "$2"; eval ": '$HOSTNAME' '$2'"; }
log() { printf 'log %s\n' "$*"; }
"""


def run_nhc_check(root: Path | str, *args: str, state: Path) -> tuple[int, list[str]]:
    script = (NHC_STUBS
              + f"HOST_AUDITOR={audit_pyz()}\nHOST_AUDITOR_STATE_DIR={state}\n"
              + f". {SLURM / 'nhc' / 'host_auditor.nhc'}\n"
              + "check_host_auditor --root \"$1\" \"${@:2}\"\n")
    started = time.monotonic()
    proc = subprocess.run(["/bin/bash", "-c", script, "nhc", str(root), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert time.monotonic() - started < 30  # NHC's watchdog default
    assert proc.stderr == "", proc.stderr
    return proc.returncode, proc.stdout.splitlines()


def test_nhc_check_dies_on_a_finding_and_only_logs_otherwise(
    failing_host: Path, tmp_path: Path
) -> None:
    code, said = run_nhc_check(failing_host, state=tmp_path)
    assert code == 1
    assert said == [f"die 1|host-auditor: {expected_line(failing_host)}"]
    assert json.loads((tmp_path / f"{os.uname().nodename.split('.')[0]}.json").read_text())[
        "host"] == "pve-gpu-01"
    code, said = run_nhc_check(CAPTURES["h200"], state=tmp_path)
    assert (code, said) == (0, [])
    code, said = run_nhc_check(tmp_path / "absent", state=tmp_path)
    assert (code, said) == (0, ["log host-auditor: audit exited 2 (not draining)"])


def test_nhc_message_cannot_end_the_quoting_of_dies_eval(tmp_path: Path) -> None:
    """A subject read from a host (a container's name, say) may hold a quote: it never
    reaches NHC's eval as one. The audit here is a stand-in printing such a line."""
    fake = tmp_path / "audit"
    fake.write_text("#!/bin/sh\n[ \"$1\" = merge ] || exit 1\n"
                    "printf '%s\\n' \"FAIL lxc.device_majors 1'\\$(touch $0.pwned)' x\"\n")
    fake.chmod(0o755)
    script = (NHC_STUBS + f"HOST_AUDITOR={fake}\nHOST_AUDITOR_STATE_DIR={tmp_path}\n"
              + f". {SLURM / 'nhc' / 'host_auditor.nhc'}\ncheck_host_auditor\n")
    proc = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("die 1|host-auditor: FAIL lxc.device_majors 1?")
    assert "'" not in proc.stdout and proc.stderr == ""
    assert not list(tmp_path.glob("*.pwned"))
