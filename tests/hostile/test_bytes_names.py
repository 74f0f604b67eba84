"""File names are bytes to the kernel: names that differ only in bytes stay apart.

``50-\\xff.conf`` written literally (UTF-8, a backslash) and ``50-<0xff>.conf`` (a byte
that is not UTF-8, shown escaped as the same text) are two sysctl files; so are the
names with 0xff and 0xfe. Every backend (a directory sysroot, a tar capture, the
collector's answer) lists each once and reads each one's own bytes; the audit judges
the file the boot applies last, by its own content.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Host
from auditor.hosts.collect import collect_tar
from tests.hostile.conftest import audit_cmd, run_limited
from tests.support.sysroot import Sysroot

#: Raw name -> content; each sets a different value, so a file read twice shows.
FILES = {
    b"50-\xff.conf": b"kernel.numa_balancing = 0\n",
    b"50-\\xff.conf": b"kernel.numa_balancing = 1\n",
    b"50-\\\\xff.conf": b"kernel.numa_balancing = 0\n# two backslashes\n",
    b"50-\xfe.conf": b"kernel.numa_balancing = 0\n# 0xfe\n",
    b"99-\\x7a.conf": b"kernel.numa_balancing = 1\n# last\n",
}


def plant(root: Sysroot) -> None:
    directory = os.path.join(bytes(root.root), b"etc/sysctl.d")
    os.makedirs(directory, exist_ok=True)
    for name, content in FILES.items():
        with open(os.path.join(directory, name), "wb") as handle:
            handle.write(content)


def backends(root: Sysroot, tmp_path: Path) -> dict[str, Host]:
    return {
        "directory": DirectoryHost(str(root.root)),
        "capture": ArchiveHost.from_path(str(root.tarball(tmp_path / "capture.tar.gz"))),
        "collector": ArchiveHost(collect_tar(["/etc/sysctl.d/*.conf"], root=str(root.root)),
                                 "collected"),
    }


@pytest.mark.parametrize("backend", ["directory", "capture", "collector"])
def test_names_that_differ_only_in_bytes_stay_two(h200: Sysroot, tmp_path: Path,
                                                  backend: str) -> None:
    for existing in (h200.root / "etc/sysctl.d").glob("*"):
        existing.unlink()
    plant(h200)
    host = backends(h200, tmp_path)[backend]
    paths = host.glob("/etc/sysctl.d/*.conf")
    assert len(paths) == len(set(paths)) == len(FILES), paths
    read = sorted(host.read_bytes(path) for path in paths)
    assert read == sorted(FILES.values())
    assert all(path.isprintable() for path in paths)


def test_the_audit_reads_each_file_once(h200: Sysroot, tmp_path: Path) -> None:
    for existing in (h200.root / "etc/sysctl.d").glob("*"):
        existing.unlink()
    plant(h200)
    capture = h200.tarball(tmp_path / "capture.tar.gz")
    reports = []
    for root in (str(h200.root), str(capture)):
        result = run_limited(audit_cmd("local", "--root", root, "--check", "numa.balancing",
                                       "--format", "json"), timeout=60)
        assert result.code in (0, 1), result.err
        reports.append(json.loads(result.out)["findings"])
    assert reports[0] == reports[1]
    (finding,) = reports[0]
    # 99-\x7a.conf sorts last and sets 1: the boot's value, named by its own file.
    assert finding["evidence"]["boot_source"] == "/etc/sysctl.d/99-\\x7a.conf:1", finding
