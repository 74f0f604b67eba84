"""Benchmark: `audit local --format json` on a 128-CPU, 12-device sysroot vs the import floor.

The floor is `python -c 'import typer, jinja2, psutil'`: the cost of starting
Python with the libraries the tool cannot avoid. Target: at most 2.5x the floor.

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


def timed(argv: list[str], runs: int) -> list[float]:
    """Run a command ``runs`` times (after one warm-up) and return wall times in seconds."""
    subprocess.run(argv, capture_output=True, check=False)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, check=False)
        samples.append(time.perf_counter() - start)
        if result.returncode not in (0, 1):
            raise SystemExit(f"{argv} exited {result.returncode}: {result.stderr.decode()}")
    return samples


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
        run = timed([audit, "local", "--root", str(root), "--format", "json"], args.runs)
        devices = len([p for p in tree.links if p.startswith("/sys/bus/pci/devices/")])
        floor_ms = statistics.median(floor) * 1000
        run_ms = statistics.median(run) * 1000
        print(f"sysroot: {args.cpus} CPUs, {devices} PCI functions "
              f"({'tar.gz' if args.tar else 'directory'}), {args.runs} runs, medians")
        print(f"import floor (typer, jinja2, psutil): {floor_ms:8.1f} ms")
        print(f"audit local --root ... --format json: {run_ms:8.1f} ms")
        print(f"ratio: {run_ms / floor_ms:.2f}x (target <= 2.5x)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
