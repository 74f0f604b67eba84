"""Benchmark ``audit merge`` of 10,000 host results: wall time and peak RSS.

The results are made from real reports (``audit local --format json`` of the
real captures in tests/fixtures/hosts), varied per host: host names, a share
of hosts with planted failures and warnings, a GPU server's eight PCIe
devices with their own subjects and observed values, and a few hosts that
could not be audited. Then ``audit merge`` runs as its own process, in each
format, and its wall time and peak RSS (ru_maxrss of the child) are printed.

Usage: .venv/bin/python bench/merge_bench.py [--hosts 10000] [--keep DIR] [--formats text,json]
       [--jobs N]
Targets on a 2-core machine: 10,000 hosts, text and prometheus <= 2 s and <= 300 MB peak RSS,
json and html <= 4 s and <= 500 MB; 100,000 hosts, text and prometheus peak RSS within 1.5x
of the 10,000-host figure and time linear; on 16 cores, 10,000 hosts text <= 1 s.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hosts"
AUDIT = str(Path(sys.executable).with_name("audit"))


def real_report(capture: Path) -> dict[str, Any]:
    """Audit a real capture and return its JSON report."""
    proc = subprocess.run([AUDIT, "local", "--root", str(capture), "--format", "json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"audit of {capture} failed: {proc.stderr.strip()}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def gpu_findings(host: str, rng: random.Random) -> list[dict[str, Any]]:
    """Return pcie.mrrs findings for a GPU server's eight devices, a few of them capped."""
    findings = []
    for slot in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"):
        capped = rng.random() < 0.03
        mrrs = rng.choice(["512", "1024"]) if capped else "4096"
        findings.append({
            "check": "pcie.mrrs", "host": host, "status": "fail" if capped else "pass",
            "severity": "high", "subject": f"0000:{slot}:00.0", "observed": mrrs,
            "expected": "4096",
            "message": f"MaxReadReq {mrrs} bytes" + (" is below 4096" if capped else ""),
            "fix": f"setpci -s 0000:{slot}:00.0 CAP_EXP+08.w=5000:7000" if capped else "",
            "evidence": {"class": "0x030200", "mrrs": mrrs, "mps": "256", "cap_offset": "0x60",
                         "link_speed": "32.0 GT/s PCIe", "link_width": "16",
                         "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16",
                         "driver": "nvidia"},
        })
    return findings


def vary(template: dict[str, Any], index: int, rng: random.Random) -> dict[str, Any]:
    """Return a copy of a real report as host number ``index`` would report it."""
    host = f"gpu-{index // 1000:02d}-{index % 1000:03d}"
    report = copy.deepcopy(template)
    report["host"] = host
    report["target"] = host
    # Each machine has its own id (a fleet merge tells machines apart by it).
    report.setdefault("facts", {})["machine_id"] = f"{index:032x}"
    report["started"] = f"2026-12-03T04:{rng.randrange(60):02d}:{rng.randrange(60):02d}+00:00"
    report["duration_s"] = round(rng.uniform(0.01, 0.2), 4)
    if rng.random() < 0.002:
        report.update(results_error(host))
        return report
    for finding in report["findings"]:
        finding["host"] = host
        roll = rng.random()
        if finding["status"] == "pass" and roll < 0.05:
            finding["status"] = "fail"
            finding["observed"] = rng.choice(["1", "2", "powersave", "C6"])
        elif finding["status"] == "pass" and roll < 0.08:
            finding["status"] = "warn"
    report["findings"].extend(gpu_findings(host, rng))
    checks = {c["check"] for c in report["checks"]}
    if "pcie.mrrs" not in checks:
        report["checks"].append({"check": "pcie.mrrs", "status": "pass", "duration_s": 0.002})
    return report


def results_error(host: str) -> dict[str, Any]:
    """Return the fields of a host that could not be audited."""
    return {"error": f"{host}: connection timed out after 10 s", "findings": [], "checks": [],
            "summary": {"pass": 0, "skip": 0, "warn": 0, "fail": 0, "error": 0}}


#: Runs ``audit merge`` and prints its figures. A small process of its own starts it: Linux
#: keeps the high-water RSS of the memory a process had before exec (vfork shares the
#: parent's), so a child started from this process, which has held a fleet's file names,
#: would be charged this process's peak (fs/exec.c, exec_mmap: setmax_mm_hiwater_rss).
_MEASURE = """
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = proc.stderr.read()
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([time.perf_counter() - started, usage.ru_utime + usage.ru_stime,
                  usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status),
                  err.decode(errors="replace")]))
"""


def run_merge(args: list[str]) -> tuple[float, float, float, int]:
    """Run ``audit merge`` as a child; return (wall s, CPU s, peak RSS in MB, exit code)."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, AUDIT, "merge", *args],
                          capture_output=True, text=True, check=True)
    wall, cpu, rss, code, err = json.loads(proc.stdout)
    if err.strip() and code not in (0, 1, 3):
        print(err.strip(), file=sys.stderr)
    return float(wall), float(cpu), float(rss), int(code)


def generate(results: Path, hosts: int) -> None:
    """Write ``hosts`` result files made from the real reports."""
    templates = [real_report(FIXTURES / "h200-vm.tar.gz"),
                 real_report(FIXTURES / "virtio-vm.tar.gz")]
    results.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261203)
    started = time.perf_counter()
    size = 0
    for index in range(hosts):
        template = templates[0] if index % 10 else templates[1]
        text = json.dumps(vary(template, index, rng), indent=2)
        size += len(text)
        (results / f"{index:06d}.json").write_text(text)
    print(f"generated {hosts} results ({size / 1e6:.1f} MB) in "
          f"{time.perf_counter() - started:.1f} s from {len(templates)} real reports")


def main() -> int:
    """Generate the results, merge them in each format, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--keep", help="write the results here and keep them; a DIR that "
                        "already holds --hosts results is merged again without writing them")
    parser.add_argument("--formats", default="text,json,html,prometheus",
                        help="comma-separated formats to merge")
    parser.add_argument("--jobs", type=int, help="audit merge --jobs N (default: its own)")
    options = parser.parse_args()
    workdir = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="merge-"))
    results = workdir / "results"
    have = len(list(results.glob("*.json"))) if results.is_dir() else 0
    if have != options.hosts:
        shutil.rmtree(results, ignore_errors=True)
        generate(results, options.hosts)
    extra = ["--jobs", str(options.jobs)] if options.jobs else []
    try:
        for fmt in options.formats.split(","):
            out = workdir / f"fleet.{fmt}"
            wall, cpu, rss, code = run_merge([str(results), "--format", fmt, "-o", str(out),
                                              "--golden", "gpu-00-001", *extra])
            print(f"audit merge --format {fmt:<10} {options.hosts} hosts: wall {wall:.2f} s, "
                  f"CPU {cpu:.2f} s, peak RSS {rss:.0f} MB, exit {code}, "
                  f"output {out.stat().st_size / 1e6:.1f} MB", flush=True)
        print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} CPUs (wall time includes waiting for them)")
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
