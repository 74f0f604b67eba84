"""A capture's manifest: what it collected decides what a replay may judge.

The real capture of a lent H200 machine (``tests/fixtures/hosts/h200-lent-vm.tar.gz``)
was made before manifests existed; rebuilt here with one, as ``audit snapshot`` writes
it, it stands for a capture made before a check existed.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from auditor.check import Check, CheckClass, CheckOptions
from auditor.errors import SnapshotError
from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Host
from auditor.manifest import (
    NOT_COLLECTED,
    PATH,
    Manifest,
    make_manifest,
    read_manifest,
)
from auditor.model import Finding, Severity, Status
from auditor.policy import load_policy
from auditor.registry import collected_paths, load_checks
from auditor.runner import audit
from auditor.snapshot import daemons_of, manifest_files, rebuild
from tests.support.sysroot import FIXTURES, extract_capture

AUDIT = str(Path(sys.executable).with_name("audit"))
LENT = FIXTURES / "h200-lent-vm.tar.gz"
LIVE = json.loads((FIXTURES / "h200-lent-vm.report.json").read_text())
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
#: The checks the lent machine's capture was made for: those its live audit ran.
MADE_FOR = {c["check"] for c in LIVE["checks"]}


class Thp(Check[CheckOptions]):
    """Transparent huge pages: a check written after the lent machine was captured."""

    id: ClassVar[str] = "mem.thp_test"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = (THP,)
    rationale: ClassVar[str] = "test"
    remedy: ClassVar[str] = "test"

    def evaluate(self, host: Host) -> Iterable[Finding]:
        text = host.read_optional(THP)
        if text is None:
            yield self.failed("thp", "the kernel has no transparent huge pages")
        else:
            yield self.passed("thp", text)


def recaptured(checks: list[CheckClass], out: Path) -> Path:
    """Rebuild the lent machine's capture as ``audit snapshot`` makes one for ``checks``."""
    patterns = collected_paths(checks)
    rebuilt = rebuild(ArchiveHost.from_path(str(LENT)), patterns, daemons_of(checks),
                      manifest_files(checks, patterns))
    out.write_bytes(rebuilt.data)
    return out


def verdicts(findings: Iterable[Any], checks: set[str] = MADE_FOR
             ) -> list[tuple[str, str, str]]:
    return sorted((f["check"], f["subject"], f["status"]) for f in findings
                  if f["check"] in checks)


def made_for() -> list[CheckClass]:
    return [c for c in load_checks() if c.id in MADE_FOR]


def test_a_check_newer_than_the_capture_is_skipped_as_not_collected(tmp_path: Path) -> None:
    checks = load_checks()
    older = made_for()
    capture = recaptured(older, tmp_path / "lent.tar.gz")
    with ArchiveHost.from_path(str(capture)) as host:
        manifest = read_manifest(host)
        report = audit(host, [*checks, Thp], load_policy(checks))
    assert manifest is not None and set(manifest.checks) == MADE_FOR
    thp = [f for f in report.findings if f.check == Thp.id]
    assert [(f.status, f.subject) for f in thp] == [(Status.SKIP, "capture")]
    assert thp[0].message.startswith(NOT_COLLECTED) and THP in thp[0].message
    # Every check the capture was made for is judged as the live audit judged it.
    assert verdicts(f.to_dict() for f in report.findings) == verdicts(LIVE["findings"])
    # A check added since is judged only where the capture holds all it reads.
    for check in [c for c in checks if c.id not in MADE_FOR]:
        found = [f for f in report.findings if f.check == check.id]
        skipped = [f.subject for f in found if f.message.startswith(NOT_COLLECTED)]
        assert skipped == (["capture"] if manifest.missing(check) else []), check.id
    assert dict(report.facts)["capture"].startswith("host-auditor 0.1.0 at ")


def test_without_a_manifest_the_capture_is_judged_as_before() -> None:
    """An older capture keeps today's behaviour: what it lacks is taken as absent."""
    checks = load_checks()
    with ArchiveHost.from_path(str(LENT)) as host:
        assert read_manifest(host) is None
        report = audit(host, [*checks, Thp], load_policy(checks))
    assert [(f.check, f.status) for f in report.findings if f.check == Thp.id] == [
        (Thp.id, Status.FAIL)]
    assert "capture" not in dict(report.facts)


def test_the_replay_skips_a_check_whose_reads_the_capture_left_out(tmp_path: Path) -> None:
    """``audit local --root``, on the archive and unpacked: pcie.aer made no part of it."""
    older = [c for c in made_for() if c.id != "pcie.aer"]
    capture = recaptured(older, tmp_path / "older.tar.gz")
    unpacked = extract_capture(capture, tmp_path / "older")
    for root in (capture, unpacked):
        proc = subprocess.run([AUDIT, "local", "--root", str(root), "--format", "json"],
                              capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode in (0, 1), proc.stderr
        replay = json.loads(proc.stdout)
        aer = [f for f in replay["findings"] if f["check"] == "pcie.aer"]
        assert [(f["status"], f["subject"]) for f in aer] == [("skip", "capture")]
        assert aer[0]["message"].startswith(NOT_COLLECTED)
        assert "/proc/uptime" in aer[0]["message"]  # the first read it lacks is named
        covered = MADE_FOR - {"pcie.aer"}
        assert verdicts(replay["findings"], covered) == verdicts(LIVE["findings"], covered)


def test_snapshot_writes_what_it_collected(tmp_path: Path) -> None:
    capture = tmp_path / "numa.tar.gz"
    proc = subprocess.run([AUDIT, "snapshot", "local", "-o", str(capture),
                           "--check", "numa.balancing"], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(capture) as archive:
        member = archive.extractfile(PATH.lstrip("/"))
        assert member is not None
        data = json.loads(member.read())
    numa = [c for c in load_checks() if c.id == "numa.balancing"]
    assert data["format"] == 1
    assert data["tool"] == {"name": "host-auditor", "version": "0.1.0"}
    assert data["checks"] == ["numa.balancing"]
    assert data["patterns"] == collected_paths(numa)
    assert data["daemons"] == sorted(numa[0].daemons)
    made = dt.datetime.fromisoformat(data["created"])
    assert abs((dt.datetime.now(dt.timezone.utc) - made).total_seconds()) < 120
    proc = subprocess.run([AUDIT, "local", "--root", str(capture), "--format", "json"],
                          capture_output=True, text=True, check=False, timeout=120)
    replay = json.loads(proc.stdout)
    numa_findings = [f for f in replay["findings"] if f["check"] == "numa.balancing"]
    assert numa_findings
    assert not any(f["message"].startswith(NOT_COLLECTED) for f in numa_findings)
    # cpu.governor reads cpufreq files the capture never looked for.
    governor = [f for f in replay["findings"] if f["check"] == "cpu.governor"]
    assert [f["subject"] for f in governor] == ["capture"]
    assert governor[0]["message"].startswith(NOT_COLLECTED)


def test_coverage_by_pattern_and_by_process() -> None:
    class Reader(Check[CheckOptions]):
        """Reads the swappiness and looks for a daemon."""

        id: ClassVar[str] = "vm.reader_test"
        severity: ClassVar[Severity] = Severity.LOW
        reads: ClassVar[tuple[str, ...]] = ("/proc/sys/vm/swappiness", "/proc/[0-9]*/comm")
        rationale: ClassVar[str] = "test"
        remedy: ClassVar[str] = "test"
        daemons: ClassVar[frozenset[str]] = frozenset({"tuned"})

        def evaluate(self, host: Host) -> Iterable[Finding]:
            yield self.passed("x", "x")

    def lacking(patterns: tuple[str, ...], daemons: frozenset[str]) -> list[str]:
        return make_manifest([], patterns, daemons).missing(Reader)

    comm = "/proc/[0-9]*/comm"
    assert lacking(("/proc/sys/vm/swappiness", comm), frozenset({"tuned"})) == []
    assert lacking(("/proc/sys/vm/*", comm), frozenset({"tuned", "x"})) == []
    assert lacking(("/proc/sys/*", comm), frozenset({"tuned"})) == ["/proc/sys/vm/swappiness"]
    assert lacking(("/proc/sys/vm/swappiness", comm), frozenset()) == ["process tuned"]
    assert lacking((), frozenset({"tuned"})) == ["/proc/sys/vm/swappiness", comm]


def manifest_json(**changes: Any) -> bytes:
    data: dict[str, Any] = json.loads(make_manifest(load_checks()[:1], ["/etc/hostname"],
                                                    []).to_json())
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(("raw", "why"), [
    (b"{", "not JSON"),
    (b"[]", "not an object"),
    (manifest_json(format=2), "format 2"),
    (manifest_json(tool={"version": "1.0\x1b[31m"}), "no tool version"),
    (manifest_json(created="yesterday"), "no creation time"),
    (manifest_json(patterns="/etc/*"), "patterns must be a list"),
    (manifest_json(checks=["x"] * 10_001), "checks must be a list"),
    (b" " * (1 << 20) + b"{}", "larger than"),
])
def test_a_bad_manifest_is_refused_in_one_line(raw: bytes, why: str, tmp_path: Path) -> None:
    root = extract_capture(recaptured(load_checks()[:1], tmp_path / "c.tar.gz"),
                           tmp_path / "root")
    (root / PATH.lstrip("/")).write_bytes(raw)
    with DirectoryHost(str(root)) as host, pytest.raises(SnapshotError, match=why):
        read_manifest(host)
    proc = subprocess.run([AUDIT, "local", "--root", str(root)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "not a capture manifest" in proc.stderr


def test_a_manifest_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    root = extract_capture(recaptured(load_checks()[:1], tmp_path / "c.tar.gz"),
                           tmp_path / "root")
    real = root / "host-auditor" / "real.json"
    (root / PATH.lstrip("/")).rename(real)
    (root / PATH.lstrip("/")).symlink_to("real.json")
    with DirectoryHost(str(root)) as host, pytest.raises(SnapshotError, match="regular file"):
        read_manifest(host)


def test_the_host_cannot_plant_a_manifest_in_a_capture(tmp_path: Path) -> None:
    """A host's own /host-auditor (reached by a pattern or a symlink) is never kept."""
    root = extract_capture(LENT, tmp_path / "host")
    planted = Manifest("9.9", "2020-01-01T00:00:00+00:00", (), (), frozenset()).to_json()
    (root / "host-auditor").mkdir()
    (root / PATH.lstrip("/")).write_bytes(planted)
    (root / "etc" / "planted").symlink_to("/host-auditor/manifest.json")
    checks = load_checks()[:1]
    patterns = [*collected_paths(checks), "/host-auditor/*", "/etc/planted"]
    with DirectoryHost(str(root)) as source:
        rebuilt = rebuild(source, patterns, frozenset())
        without = ArchiveHost(rebuilt.data, "without")
        assert without.lstat(PATH) is None and without.lstat("/etc/planted") is None
        rebuilt = rebuild(source, patterns, frozenset(), manifest_files(checks, patterns))
    with ArchiveHost(rebuilt.data, "with") as capture:
        manifest = read_manifest(capture)
        assert manifest is not None and manifest.version == "0.1.0"
        assert capture.listdir("/host-auditor") == ["manifest.json"]


def test_a_live_host_never_reads_a_manifest() -> None:
    from auditor.hosts import LocalHost

    assert read_manifest(LocalHost()) is None
