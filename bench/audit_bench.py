"""Benchmark: `audit local --format json` on a generated many-CPU GPU node vs the import floor.

Three figures, each a median over fresh runs:

- the import floor, `python -c 'import typer, jinja2, psutil'`: the cost of starting
  Python with the libraries the tool cannot avoid;
- `audit local --root SYSROOT --format json` as a user runs it (a process each time);
- the audit in process: `runner.audit()` of every registered check on a fresh host
  object each run (no import or start-up cost: what grows with the host's size).

Targets: at 512 CPUs, the command at most 2x the floor, and the in-process audit at
most 150 ms. Also printed: the start-up of the command alone (`audit checks`), which
must not grow when checks are added. The commands run with bytecode written, as an
installed package has it, even where PYTHONDONTWRITEBYTECODE is set.

Usage: python bench/audit_bench.py [--runs N] [--cpus 128] [--tar]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hostgen import HostSpec, build_host


def timed(argv: list[str], runs: int, codes: tuple[int, ...] = (0,)) -> list[float]:
    """Run a command ``runs`` times (after one warm-up) and return wall times in seconds.

    Every run must exit with one of ``codes`` and write nothing to stderr: a command that
    fails early (a missing library, a bad path) would otherwise time as fast.
    """
    # Bytecode is written (the warm-up run writes it) whatever PYTHONDONTWRITEBYTECODE says
    # here: an installed package and the floor's libraries have theirs from pip, and an
    # editable checkout without it would time compiling every module of the tool on each run.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    samples = []
    for run in range(runs + 1):
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, check=False, env=env)
        if run:
            samples.append(time.perf_counter() - start)
        if result.returncode not in codes or result.stderr:
            raise SystemExit(f"{' '.join(argv)} exited {result.returncode}: "
                             f"{result.stderr.decode(errors='replace')[-2000:]}")
    return samples


def in_process(root: Path, runs: int) -> list[float]:
    """Audit the sysroot ``runs`` times in this process, a fresh host object each time."""
    from auditor.hosts import open_sysroot
    from auditor.policy import load_policy
    from auditor.registry import load_checks
    from auditor.runner import audit

    checks = load_checks()
    policy = load_policy(checks)
    samples = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        with open_sysroot(str(root)) as host:
            audit(host, checks, policy)
        samples.append(time.perf_counter() - start)
    return samples[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cpus", type=int, default=128)
    parser.add_argument("--tar", action="store_true", help="audit the .tar.gz capture instead")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="audit-bench-"))
    try:
        tree = build_host(HostSpec(cpus=args.cpus, gpus=8, nics=4))
        root = tree.write_tar(workdir / "host.tar.gz") if args.tar else tree.write_dir(
            workdir / "root")
        audit = shutil.which("audit", path=os.path.dirname(sys.executable)) or "audit"
        floor = timed([sys.executable, "-c", "import typer, jinja2, psutil"], args.runs)
        startup = timed([audit, "checks"], args.runs)
        # Exit 1: the generated host has findings that fail (any other code is an error).
        run = timed([audit, "local", "--root", str(root), "--format", "json"], args.runs,
                    codes=(0, 1))
        inside = in_process(root, args.runs)
        devices = len([p for p in tree.links if p.startswith("/sys/bus/pci/devices/")])
        floor_ms = statistics.median(floor) * 1000
        run_ms = statistics.median(run) * 1000
        print(f"sysroot: {args.cpus} CPUs, {devices} PCI functions "
              f"({'tar.gz' if args.tar else 'directory'}), {args.runs} runs, medians")
        print(f"import floor (typer, jinja2, psutil): {floor_ms:8.1f} ms")
        print(f"audit checks (start-up):              {statistics.median(startup) * 1000:8.1f} ms")
        print(f"audit local --root ... --format json: {run_ms:8.1f} ms")
        print(f"audit in process:                     {statistics.median(inside) * 1000:8.1f} ms"
              " (target <= 150 ms at 512 CPUs)")
        print(f"ratio: {run_ms / floor_ms:.2f}x (target <= 2x at 512 CPUs)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
