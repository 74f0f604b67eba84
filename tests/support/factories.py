"""Factories with defaults: findings, reports, tars in memory."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from pathlib import Path

from auditor.model import CheckResult, Finding, Report, Severity, Status


def make_finding(**overrides: object) -> Finding:
    """Build a finding with defaults; override any field."""
    values: dict[str, object] = {
        "check": "numa.balancing",
        "status": Status.FAIL,
        "severity": Severity.HIGH,
        "subject": "kernel",
        "message": "automatic NUMA balancing is enabled on 2 nodes",
        "observed": "1",
        "expected": "0",
        "fix": "sysctl -w kernel.numa_balancing=0",
        "host": "gpu-01",
    }
    values.update(overrides)
    return Finding(**values)  # type: ignore[arg-type]


def tar_bytes(files: Iterable[tuple[str, str | bytes]]) -> bytes:
    """Build an uncompressed tar in memory from (path, content) pairs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, content in files:
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tar_of_members(members: Iterable[tuple[tarfile.TarInfo, bytes | None]],
                   fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """Build an uncompressed tar in memory from (TarInfo, data) pairs, as given: links,
    devices and odd headers too (``data`` None for a member without content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def make_report(findings: Iterable[Finding] = (), host: str = "gpu-01", **overrides: object
                ) -> Report:
    """Wrap findings in a report, one result per check in the order first seen."""
    by_check: dict[str, list[Finding]] = {}
    for finding in findings:
        by_check.setdefault(finding.check, []).append(finding)
    values: dict[str, object] = {
        "host": host, "target": "sysroot", "started": "2026-12-03T03:44:22+00:00",
        "duration_s": 0.0,
        "results": tuple(CheckResult(c, 0.0, tuple(fs)) for c, fs in by_check.items()),
    }
    values.update(overrides)
    return Report(**values)  # type: ignore[arg-type]


def write_dist_info(site: Path, name: str, distribution: str,
                    entry_points: dict[str, dict[str, str]]) -> Path:
    """Write a bare ``name-1.0.dist-info`` (METADATA, entry_points.txt) into ``site``."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
        for group, points in entry_points.items()))
    return info
