"""Benchmark ``audit host`` against a real sshd: one host, and 50 hosts at once.

Run as root (it adds a test user and starts sshd on loopback):

    .venv/bin/python -m bench.ssh_bench [--rounds 7] [--hosts 50] [--no-peers] [--workers N]

(a) one host, each a fresh process as a user would run it: ``audit host``; the
    floor, a fabric script running one command; pytest-testinfra reading the
    same files; ``ansible -m setup``.
(b) ``--hosts`` hosts (loopback addresses 127.0.1.x on one sshd) at
    ``--parallel N``: wall time against one host, and peak RSS; against
    ``ansible -m setup -f N``; then where the CPU of a fleet run goes: the
    client, and the targets' sshd sessions split into sshd and the collector.

The peers are optional: ``pip install ansible-core pytest-testinfra`` into the
venv to include them (bench/README.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.sshd import SshLab

PYTHON = sys.executable
AUDIT = str(Path(sys.executable).parent / "audit")
USER = f"ha-bench{os.getpid() % 100000:05d}"  # per run: benchmarks side by side

FLOOR = """
import sys
import fabric
host, port, key, known = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = fabric.Connection(host, user={user!r}, port=port, connect_kwargs={{"key_filename": [key]}})
conn.client.load_system_host_keys(known)
conn.run("cat /proc/sys/kernel/numa_balancing", hide=True)
conn.close()
"""

TESTINFRA = """
import sys
import testinfra
host, port, key, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
remote = testinfra.get_host(f"paramiko://{user}@{{host}}:{{port}}", ssh_identity_file=key)
for path in paths:
    remote.file(path).content
"""


@dataclass
class Sample:
    """One command's figures: median wall and CPU seconds, and its memory.

    ``rss_kib`` is the peak RSS of its largest process; ``pss_kib`` the peak of the
    whole process tree's PSS added up (shared pages counted once, split between the
    processes sharing them): what a run with worker processes really takes.
    """

    wall: float
    cpu: float
    rss_kib: int
    pss_kib: int = 0


def _tree(pid: int) -> list[int]:
    """Return a process and all its descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                pending.extend(int(c) for c in task.read_text().split())
            except OSError:
                continue
    return found


def _tree_pss(pid: int) -> int:
    """Return the PSS (KiB) of a process tree now, 0 for what has already gone."""
    total = 0
    for member in _tree(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except (OSError, ValueError):
            continue
    return total


class PssSampler:
    """Sample a process tree's total PSS every 10 ms in a thread; keep the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _tree_pss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_timed(command: list[str], env: dict[str, str] | None = None,
              codes: tuple[int, ...] = (0, 1), *, pss: bool = False
              ) -> tuple[float, float, int, int]:
    """Run a command; return wall s, CPU s, the largest process's peak RSS and tree PSS (KiB)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=env)
    sampler = PssSampler(process.pid) if pss else None
    # Reap only once the sampler has stopped: a reaped pid may be reused.
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    peak_pss = sampler.stop() if sampler else 0
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    process.returncode = code
    if code not in codes:
        stderr = process.stderr.read().decode() if process.stderr else ""
        raise RuntimeError(f"{command[0]} exited {code}: {stderr[-800:]}")
    return wall, usage.ru_utime + usage.ru_stime, int(usage.ru_maxrss), peak_pss


def measure(commands: dict[str, tuple[list[str], dict[str, str] | None]],
            rounds: int, codes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Sample]:
    """Run each command ``rounds`` times, interleaved so load falls on all alike."""
    codes = codes or {}
    for name, (command, env) in commands.items():
        run_timed(command, env, codes.get(name, (0, 1)))  # warm-up: page cache, .pyc files
    runs: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, (command, env) in commands.items():
            runs[name].append(run_timed(command, env, codes.get(name, (0, 1)), pss=True))
            if env is not None and "ANSIBLE_SSH_ARGS" in env:
                stop_control_masters(env)
    return {
        name: Sample(statistics.median(r[0] for r in samples),
                     statistics.median(r[1] for r in samples),
                     max(r[2] for r in samples),
                     max(r[3] for r in samples))
        for name, samples in runs.items()
    }


def collector_cpu(patterns: list[str], rounds: int) -> float:
    """Return the median CPU seconds of the remote collection command run here as USER.

    This is what each audited host's collector costs (sshd's own share is the rest
    of the sessions' CPU): the command ``audit host`` sends, less ``su``'s own cost.
    """
    from auditor.hosts.collect import remote_command

    command = remote_command(patterns)
    costs = []
    for _ in range(rounds):
        # a session's environment: a login shell's PATH, the user's own shell
        run = ["su", "-", USER, "-s", "/bin/sh", "-c"]
        _, with_command, _, _ = run_timed([*run, command])
        _, bare, _, _ = run_timed([*run, "true"])
        costs.append(with_command - bare)
    return statistics.median(costs)


def children_cpu(pids: list[int]) -> float:
    """Return the CPU seconds of the reaped children of processes (sshd's sessions)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def stop_control_masters(env: dict[str, str]) -> None:
    """End ansible's ssh ControlPersist masters, so each run starts cold."""
    control = env["ANSIBLE_SSH_ARGS"].rsplit("ControlPath=", 1)[1].rsplit("/", 1)[0]
    for sock in Path(control).glob("*"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                       capture_output=True)


def collected_files(target: str, key: Path, known: Path) -> list[str]:
    """Return the regular files ``audit host`` collects, for the peers to read too."""
    from auditor import collect
    from auditor.hosts.ssh import SshHost, SshOptions, parse_target
    from auditor.registry import load_checks

    options = SshOptions(user=USER, identity=str(key), known_hosts=(str(known),))
    host = SshHost.open(parse_target(target), options, collect.patterns_for(load_checks()))
    assert host.collection is not None
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(host.collection.tar)) as archive:
        return ["/" + m.name for m in archive if m.isfile()]


def ansible_env(root: Path, key: Path, known: Path) -> dict[str, str]:
    """Return the environment for ansible: our key and known_hosts, a fresh control dir."""
    control = Path(tempfile.mkdtemp(prefix="cp-", dir=root))
    return {
        **os.environ,
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_ARGS": f"-o UserKnownHostsFile={known} -o ControlMaster=auto "
                            f"-o ControlPersist=60s -o ControlPath={control}/%C",
        "ANSIBLE_PRIVATE_KEY_FILE": str(key),
        "ANSIBLE_REMOTE_USER": USER,
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "ANSIBLE_LOCAL_TEMP": str(root / "ansible-local"),
        "ANSIBLE_FORKS": "50",
        "ANSIBLE_NOCOLOR": "1",
    }


def row(name: str, sample: Sample, ratio_to: Sample | None = None) -> str:
    ratio = f"{sample.wall / ratio_to.wall:5.2f}x" if ratio_to else "      "
    return (f"  {name:<36} {sample.wall * 1000:7.0f} ms  {ratio}  {sample.cpu * 1000:7.0f} ms"
            f"  {sample.rss_kib / 1024:7.1f} MiB  {sample.pss_kib / 1024:7.1f} MiB")


HEADER = (f"  {'':<36} {'wall':>10}  {'ratio':>6}  {'CPU':>10}  {'peak RSS':>11}"
          f"  {'tree PSS':>11}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--no-peers", action="store_true", help="Skip testinfra and ansible.")
    parser.add_argument("--workers", type=int, default=None,
                        help="Pass --workers N to the fleet run (default: audit's own choice).")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the benchmark adds a user and starts sshd", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="ha-sshbench-"))
    os.chmod(root, 0o755)
    lab = SshLab(root)
    try:
        lab.add_user(USER)
        addresses = [f"127.0.1.{i}" for i in range(1, args.hosts + 1)]
        # sshd listens on at most 16 addresses: one server per 15 of them.
        servers = [lab.start(extra=[f"ListenAddress {a}" for a in addresses[i:i + 15]])
                   for i in range(0, len(addresses), 15)]
        server = servers[0]
        endpoints = [(a, servers[i // 15].port) for i, a in enumerate(addresses)]
        known = root / "known_hosts"
        key_line = server.known_hosts_line.split(" ", 1)[1]
        known.write_text(server.known_hosts_line + "".join(
            f"[{a}]:{p} {key_line}" for a, p in endpoints))
        key = lab.client_key
        target = server.target
        common = ["--user", USER, "--identity", str(key), "--known-hosts", str(known),
                  "--format", "json", "--output", "/dev/null"]
        floor_script = root / "floor.py"
        floor_script.write_text(FLOOR.format(user=USER))
        testinfra_script = root / "testinfra_read.py"
        testinfra_script.write_text(TESTINFRA.format(user=USER))
        files = collected_files(target, key, known)
        from auditor import collect
        from auditor.registry import load_checks

        patterns = collect.patterns_for(load_checks())
        have_testinfra = importlib.util.find_spec("testinfra") is not None
        have_ansible = shutil.which("ansible", path=str(Path(sys.executable).parent)) is not None
        inventory = root / "inventory.ini"
        inventory.write_text("".join(
            f"h{i} ansible_host={a} ansible_port={p}\n" for i, (a, p) in enumerate(endpoints)))
        one_inventory = root / "one.ini"
        one_inventory.write_text(f"h0 ansible_host=127.0.0.1 ansible_port={server.port}\n")
        ansible = str(Path(sys.executable).parent / "ansible")

        print(f"sshd on 127.0.0.1:{server.port}; {len(files)} files collected per host; "
              f"median of {args.rounds} interleaved runs, each a fresh process; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
        single: dict[str, tuple[list[str], dict[str, str] | None]] = {
            "floor": ([PYTHON, str(floor_script), "127.0.0.1", str(server.port), str(key),
                       str(known)], None),
            "audit": ([AUDIT, "host", target, *common], None),
        }
        if not args.no_peers and have_testinfra:
            single["testinfra"] = ([PYTHON, str(testinfra_script), "127.0.0.1",
                                    str(server.port), str(key), *files], None)
        if not args.no_peers and have_ansible:
            single["ansible"] = ([ansible, "all", "-i", str(one_inventory), "-m", "setup"],
                                 ansible_env(root, key, known))
        one = measure(single, args.rounds)
        print("(a) one host")
        print(HEADER)
        print(row("fabric, one command (floor)", one["floor"]))
        print(row("audit host", one["audit"], one["floor"]))
        if "testinfra" in one:
            print(row(f"pytest-testinfra, {len(files)} file reads", one["testinfra"],
                      one["floor"]))
        if "ansible" in one:
            print(row("ansible -m setup", one["ansible"], one["floor"]))

        fleet_inventory = root / "fleet.txt"
        fleet_inventory.write_text("".join(f"{a}:{p}\n" for a, p in endpoints))
        many: dict[str, tuple[list[str], dict[str, str] | None]] = {
            "none": ([AUDIT, "host", "127.0.0.1:1", *common], None),
            "one": ([AUDIT, "host", target, *common], None),
            "fleet": ([AUDIT, "host", "-i", str(fleet_inventory), "--parallel",
                       str(args.hosts), *common,
                       *(["--workers", str(args.workers)] if args.workers else [])], None),
        }
        if not args.no_peers and have_ansible:
            many["ansible"] = ([ansible, "all", "-i", str(inventory), "-m", "setup", "-f",
                                str(args.hosts)], ansible_env(root, key, known))
        sshd_pids = [s.process.pid for s in servers if s.process is not None]
        before = children_cpu(sshd_pids)
        fleet = measure({"fleet": many["fleet"]}, 1)
        sshd_cpu = children_cpu(sshd_pids) - before
        fleet = measure(many, max(3, args.rounds // 2), codes={"none": (3,)})
        print(f"\n(b) {args.hosts} hosts at --parallel {args.hosts}")
        print(HEADER)
        print(row("audit host, 1 host", fleet["one"]))
        print(row(f"audit host, {args.hosts} hosts", fleet["fleet"], fleet["one"]))
        if "ansible" in fleet:
            print(row(f"ansible -m setup -f {args.hosts}", fleet["ansible"], fleet["one"]))
        per_run = sshd_cpu / 2  # measure() ran the fleet twice: warm-up and one round
        client = fleet["fleet"].cpu
        startup = fleet["none"].cpu
        collector = collector_cpu(patterns, 9)
        sessions = per_run / args.hosts
        print(f"\n  CPU of one fleet run ({args.hosts} hosts), all on this machine:")
        print(f"    audit (the client)      {client:6.2f} s: {startup * 1000:.0f} ms starting up "
              f"(a run that reaches no host), then "
              f"{(client - startup) / args.hosts * 1000:.1f} ms a host")
        print(f"    the targets' sshd       {per_run:6.2f} s: {sessions * 1000:.0f} ms a host, of "
              f"which the collector {collector * 1000:.0f} ms (measured alone) and sshd "
              f"{(sessions - collector) * 1000:.0f} ms")
        print(f"    together {client + per_run:.2f} CPU s on {os.cpu_count()} CPUs: at least "
              f"{(client + per_run) / (os.cpu_count() or 1):.2f} s of wall")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"\npeak RSS of any child process: {children.ru_maxrss / 1024:.1f} MiB")
    finally:
        lab.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
