"""Hostile files for the audit itself: bombs, pathological lines, odd names, deep documents,
markup and terminal payloads. Each run is a real ``audit`` process under an address-space
limit; each asserts bounded wall time and memory, the exit code and a one-line error."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.hostile.conftest import Canary, audit_cmd, run_limited
from tests.support.factories import tar_of_members
from tests.support.sysroot import Sysroot

#: Address space an audit may use here (Python, its libraries and the checks' threads
#: reserve ~400 MB of it before reading a byte).
LIMIT = 1536 << 20
#: Peak resident memory a bounded run stays under (a capture is refused past 64 MiB).
RSS = 300 << 20


def zero_stream(size: int, compress: str) -> bytes:
    """Compress ``size`` zero bytes incrementally (the bomb is built, never held whole)."""
    out = io.BytesIO()
    block = b"\0" * (1 << 20)
    writer = (gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) if compress == "gz"
              else lzma.LZMAFile(out, mode="wb", preset=1))
    with writer:
        for _ in range(size >> 20):
            writer.write(block)
    return out.getvalue()


@pytest.mark.parametrize("compress", ["gz", "xz"])
def test_a_decompression_bomb_is_refused_in_bounded_memory(tmp_path: Path, compress: str
                                                           ) -> None:
    bomb = tmp_path / f"capture.tar.{compress}"
    bomb.write_bytes(zero_stream(640 << 20, compress))  # 10 times the cap, 1 MB on disk
    result = run_limited(audit_cmd("local", "--root", str(bomb)), memory=LIMIT, timeout=120)
    assert result.code == 2
    assert "expands past 64 MiB" in result.one_error_line()
    assert result.max_rss < RSS, result.max_rss


def test_a_member_flood_is_refused(tmp_path: Path) -> None:
    """110,000 empty members (512-byte headers: 56 MB, under the size cap) in 1 MB of gzip."""
    headers = bytearray()
    for index in range(110_000):
        info = tarfile.TarInfo(f"d/{index}")
        headers += info.tobuf(tarfile.USTAR_FORMAT)
    capture = tmp_path / "flood.tar.gz"
    capture.write_bytes(gzip.compress(bytes(headers) + b"\0" * 1024, 6))
    result = run_limited(audit_cmd("local", "--root", str(capture)), memory=LIMIT, timeout=120)
    assert result.code == 2
    assert "members" in result.one_error_line()


def test_fifo_device_and_symlink_captures_and_roots(tmp_path: Path) -> None:
    fifo = tmp_path / "capture.tar.gz"
    os.mkfifo(fifo)
    result = run_limited(audit_cmd("local", "--root", str(fifo)), timeout=30)
    assert result.code == 2 and result.wall < 20
    result.one_error_line()


def test_pathological_lines_are_parsed_in_linear_time(h200: Sysroot) -> None:
    """A 1 MiB LXC config line, a 1 MiB NVIDIA version file, a CPU list of huge ranges."""
    h200.write("/etc/pve/lxc/101.conf", "a: " + "b" + " \t" * (1 << 19) + "c\n"
               + "lxc.cgroup2.devices.allow: c 1:2" + " " * (1 << 19) + "x y\n")
    h200.write("/proc/driver/nvidia/version", "NVIDIA UNIX " * (1 << 16) + "\n")
    h200.write("/sys/devices/system/cpu/offline", ",".join(["0-99999"] * 50_000) + "\n")
    for policy in h200.root.glob("sys/devices/system/cpu/cpufreq/policy*"):
        (policy / "affected_cpus").write_text(" ".join(["0-65535"] * 20_000) + "\n")
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json"),
                         memory=LIMIT, timeout=60)
    assert result.code in (0, 1), result.err
    assert result.wall < 30
    assert json.loads(result.out)["summary"]["error"] == 0


def test_names_that_are_not_utf8_become_escaped_text(h200: Sysroot, tmp_path: Path) -> None:
    lxc = h200.path("/etc/pve/lxc")
    lxc.mkdir(parents=True, exist_ok=True)
    body = "arch: amd64\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
    for raw in (b"10\xff.conf", b"10\xfe.conf", b"\xe9t\xe9.conf"):
        with open(os.fsencode(lxc) + b"/" + raw, "w") as handle:
            handle.write(body)
    out = tmp_path / "report.json"
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json",
                                   "-o", str(out)), timeout=60)
    assert result.code in (0, 1), result.err
    text = out.read_bytes().decode("utf-8")  # valid UTF-8
    document = json.loads(text)
    assert document["summary"]["error"] == 0
    prom = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "prometheus"),
                       timeout=60)
    series = [line for line in prom.out.splitlines() if line.startswith("host_auditor_finding")]
    assert len(series) == len(set(series))  # two odd names never make one series
    stdout = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json"),
                         timeout=60)
    json.loads(stdout.out)


def test_deep_json_and_toml_are_one_line_each(tmp_path: Path, h200: Sysroot) -> None:
    good = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json"),
                       timeout=60)
    (tmp_path / "good.json").write_text(good.out)
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "deeper.json").write_text('{"hosts": ' + "[" * 100_000 + "]" * 100_000 + "}")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with open(tmp_path / "huge.json", "wb") as handle:
        handle.truncate(65 << 20)  # sparse: 65 MiB of zeros, no disk
    merged = run_limited(audit_cmd("merge", str(tmp_path), "--format", "json"), timeout=60,
                         memory=LIMIT)
    assert merged.code == 2
    lines = merged.err.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("audit: error: ") for line in lines), lines
    assert any("huge.json: cannot read (larger than 64 MiB)" in line for line in lines)
    assert merged.max_rss < RSS
    assert any("nested too deeply" in line for line in lines)
    assert any("zero.json: cannot read (not a regular file)" in line for line in lines)
    assert len(json.loads(merged.out)["hosts"]) == 1  # the good one is still merged
    policy = tmp_path / "deep.toml"
    policy.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--policy", str(policy)),
                         timeout=60)
    assert result.code == 2 and "nested too deeply" in result.one_error_line()


PAYLOAD = "x\x1b[2J\x1b]0;owned\x07<script>alert(1)</script>|[a](javascript:x)*b*`c`\r\nX"


def test_markup_and_terminal_payloads_stay_text(h200: Sysroot, tmp_path: Path) -> None:
    """A host name, an LXC container name and a report's fields carry markup and escape
    sequences: text output has no control character, markdown no live markup."""
    h200.write("/etc/hostname", "gpu\x1b[31m-07<b>|x\n" + "junk" * 300_000)
    h200.write(f"/etc/pve/lxc/101{PAYLOAD.replace('/', '')}.conf",
               "lxc.cgroup2.devices.allow: c 509:* rwm\n")
    text = run_limited(audit_cmd("local", "--root", str(h200.root)), timeout=60)
    assert "\x1b" not in text.out and "\x07" not in text.out and "\r" not in text.out
    head = text.out.splitlines()[0]
    # The name is /etc/hostname's first token, control characters dropped (as SSH names are).
    assert "  gpu[31m-07<b>|x  (" in head and "junk" not in head
    md = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "markdown"),
                     timeout=60)
    assert "\x1b" not in md.out and "<script>" not in md.out and "<b>" not in md.out
    assert "](javascript" not in md.out
    report = json.loads(run_limited(audit_cmd("local", "--root", str(h200.root), "--format",
                                              "json"), timeout=60).out)
    report["error"] = PAYLOAD
    report["host"] = PAYLOAD
    (tmp_path / "a.json").write_text(json.dumps(report))
    merged = run_limited(audit_cmd("merge", str(tmp_path / "a.json")), timeout=60)
    assert "\x1b" not in merged.out + merged.err and "\x07" not in merged.out + merged.err


def test_an_internal_error_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """Any uncaught exception: one line, exit 4 (not 1, the findings code); --debug traces."""
    program = ("import sys, auditor.runner as r\n"
               "def boom(*a, **k): raise RuntimeError('boom\\x1b[2J\\nsecond line')\n"
               "r.audit = boom\n"
               "from auditor.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    import sys

    result = run_limited([sys.executable, "-c", program, "local"], timeout=60)
    assert result.code == 4
    line = result.one_error_line()
    assert line.startswith("audit: internal error: RuntimeError: boom") and "--debug" in line
    traced = run_limited([sys.executable, "-c", program, "local", "--debug"], timeout=60)
    assert traced.code == 1 and "Traceback" in traced.err


def test_symlinks_swapped_during_an_audit_never_read_outside(
    h200: Sysroot, canary: Canary
) -> None:
    """A thread swaps files the checks read with symlinks to a secret outside the tree."""
    stop = threading.Event()
    victims = [h200.path("/etc/os-release"), h200.path("/proc/sys/kernel/osrelease"),
               h200.path("/etc/hostname")]

    def swap() -> None:
        while not stop.is_set():
            for victim in victims:
                link = victim.with_name(victim.name + ".lnk")
                parked = victim.with_name(victim.name + ".real")
                try:
                    if not link.is_symlink():
                        link.symlink_to(canary.root / "secret")
                    os.rename(victim, parked)
                    os.rename(link, victim)
                    time.sleep(0.0002)
                    os.rename(victim, link)
                    os.rename(parked, victim)
                except OSError:
                    pass

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        outputs = [run_limited(audit_cmd("local", "--root", str(h200.root), "--format",
                                         "json"), timeout=60).out for _ in range(8)]
    finally:
        stop.set()
        thread.join()
    assert not any(canary.secret in out for out in outputs)
    assert canary.unchanged()


def test_a_snapshot_never_holds_the_machine_id_or_other_processes(tmp_path: Path) -> None:
    out = tmp_path / "host.tar.gz"
    result = run_limited(audit_cmd("snapshot", "local", "-o", str(out)), timeout=120)
    assert result.code == 0, result.err
    with tarfile.open(out) as archive:
        names = archive.getnames()
        kinds = {m.name: m for m in archive.getmembers()}
    assert "etc/machine-id" not in names
    comms = [n for n in names if n.startswith("proc/") and n.endswith("/comm")]
    from auditor.registry import load_checks
    from auditor.snapshot import daemons_of

    daemons = daemons_of(load_checks())
    with tarfile.open(out) as archive:
        for name in comms:
            member = archive.extractfile(name)
            assert member is not None
            assert member.read().decode().strip() in daemons
    assert all(not (m.ischr() or m.isblk()) or n.startswith("dev/") for n, m in kinds.items())
    assert all(m.isreg() or m.isdir() or m.issym() or m.ischr() or m.isblk()
               for m in kinds.values())
    machine_id = Path("/etc/machine-id")
    if machine_id.exists() and machine_id.read_text().strip():
        report = run_limited(audit_cmd("local", "--format", "json", "--check",
                                       "numa.balancing"), timeout=60)
        assert machine_id.read_text().strip() not in report.out
        assert machine_id.read_text().strip() not in gzip.decompress(out.read_bytes()).decode(
            "utf-8", "replace")


def test_the_machine_id_fact_is_systemds_app_specific_id() -> None:
    """The report's machine_id is sd_id128_get_machine_app_specific() with host-auditor's
    app id, as systemd itself computes it: stable per host, never the id."""
    import shutil
    import subprocess

    from auditor.runner import APP_ID, app_machine_id

    machine_id = Path("/etc/machine-id")
    if not machine_id.exists() or not machine_id.read_text().strip():
        pytest.skip("this machine has no machine-id")
    if shutil.which("systemd-id128") is None:
        pytest.skip("systemd-id128 is not installed")
    expected = subprocess.run(["systemd-id128", "machine-id", f"--app-specific={APP_ID.hex()}"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert app_machine_id(machine_id.read_text()) == expected
    report = json.loads(run_limited(audit_cmd("local", "--format", "json", "--check",
                                              "numa.balancing"), timeout=60).out)
    assert report["facts"]["machine_id"] == expected
    assert machine_id.read_text().strip() not in json.dumps(report)


def test_symlinks_with_endless_targets_are_resolved_in_bounded_time(tmp_path: Path) -> None:
    """A capture whose links name hundreds of thousands of components, chained: each
    resolution stops at PATH_MAX's worth of components instead of walking them all."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for name, target in [("etc/hostname", "a/" * 200_000 + "x"),
                         *((f"l{n}", "/".join([f"l{n + 1}"] * 3000)) for n in range(40)),
                         ("etc/os-release", "/l0/x")]:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        members.append((info, None))
    capture = tmp_path / "links.tar"
    capture.write_bytes(tar_of_members(members))
    result = run_limited(audit_cmd("local", "--root", str(capture), "--format", "json"),
                         memory=LIMIT, timeout=60)
    assert result.code in (0, 1), result.err
    assert result.wall < 20


def test_deep_member_names_are_bounded(tmp_path: Path) -> None:
    """Members whose names imply thousands of directories each (memory grows with the square
    of a name's depth): longer than PATH_MAX they are left out, and the directories all
    names imply are capped."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for n in range(2000):
        depth = 2000 if n % 2 else 400  # 20 KB names, then 3 KB ones
        members.append((tarfile.TarInfo("/".join(f"d{n}x{k}" for k in range(depth))), b""))
    capture = tmp_path / "deep.tar.gz"
    capture.write_bytes(gzip.compress(tar_of_members(members), 6))
    result = run_limited(audit_cmd("local", "--root", str(capture)), memory=LIMIT, timeout=60)
    assert result.code == 2 and "names imply more than" in result.one_error_line()
    assert result.max_rss < RSS, result.max_rss
