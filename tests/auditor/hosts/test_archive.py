"""ArchiveHost reads captures in place: symlinks, device entries, limits."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from auditor.errors import SnapshotError
from auditor.hosts import DirectoryHost, open_sysroot
from auditor.hosts.archive import ArchiveHost
from tests.support.factories import tar_bytes
from tests.support.sysroot import CAPTURES, Sysroot


def test_reads_capture_in_place_with_device_numbers_without_extracting() -> None:
    host = ArchiveHost.from_path(str(CAPTURES["h200"]))
    assert host.name == "gpu-h200-vm"
    assert host.device_numbers("/dev/nvidia-uvm") == (238, 0)
    assert host.device_numbers("/dev/nvidia-caps/nvidia-cap1") == (241, 1)
    assert host.device_numbers("/proc/devices") is None


def test_follows_relative_pci_symlinks() -> None:
    host = ArchiveHost.from_path(str(CAPTURES["h200"]))
    assert host.read_optional("/sys/bus/pci/devices/0000:00:06.0/class") == "0x030200"
    assert host.resolve("/sys/bus/pci/devices/0000:00:06.0/config") == (
        "/sys/devices/pci0000:00/0000:00:06.0/config"
    )
    assert len(host.read_bytes("/sys/bus/pci/devices/0000:00:06.0/config")) == 4096
    assert host.readlink("/sys/bus/pci/devices/0000:00:06.0/driver") == (
        "../../../bus/pci/drivers/nvidia"
    )


def test_glob_matches_directory_host_on_the_same_capture(h200: Sysroot) -> None:
    archive = ArchiveHost.from_path(str(CAPTURES["h200"]))
    directory = DirectoryHost(str(h200.root))
    for pattern in (
        "/sys/bus/pci/devices/*",
        "/sys/bus/pci/devices/*/class",
        "/sys/devices/system/cpu/cpu*/topology/core_id",
        "/sys/devices/system/node/node*",
        "/etc/sysctl.d/*.conf",
        "/nonexistent/*",
    ):
        assert archive.glob(pattern) == directory.glob(pattern), pattern
    for path in archive.glob("/sys/bus/pci/devices/*/class"):
        assert archive.read_bytes(path) == directory.read_bytes(path)


def test_absolute_symlink_stays_inside_the_root(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("etc/hostname", b"inside\n"), ("etc/secret", b"captured\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("etc/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/secret"
        archive.addfile(link)
        escape = tarfile.TarInfo("etc/escape")
        escape.type = tarfile.SYMTYPE
        escape.linkname = "../../../../etc/hostname"
        archive.addfile(escape)
        loop = tarfile.TarInfo("etc/loop")
        loop.type = tarfile.SYMTYPE
        loop.linkname = "loop"
        archive.addfile(loop)
    host = ArchiveHost(buffer.getvalue(), "mem")
    assert host.read_text("/etc/link") == "captured\n"
    assert host.read_text("/etc/escape") == "inside\n"
    with pytest.raises(OSError):
        host.read_text("/etc/loop")
    assert host.read_optional("/etc/loop") is None


def test_read_limit_and_missing_files() -> None:
    host = ArchiveHost(tar_bytes([("proc/cpuinfo", "x" * 100)]), "mem")
    assert host.read_bytes("/proc/cpuinfo", limit=10) == b"x" * 10
    with pytest.raises(FileNotFoundError):
        host.read_bytes("/proc/nope")
    assert host.listdir("/") == ["proc"]
    assert host.is_dir("/proc")
    with pytest.raises(IsADirectoryError):
        host.read_bytes("/proc")


def test_corrupt_capture_is_a_snapshot_error(tmp_path: Path) -> None:
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(CAPTURES["h200"].read_bytes()[:2000])
    with pytest.raises(SnapshotError, match=r"cut\.tar\.gz"):
        open_sysroot(str(truncated))
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"\x00not a tar" * 10)
    with pytest.raises(SnapshotError):
        open_sysroot(str(garbage))
    with pytest.raises(SnapshotError, match="no such"):
        open_sysroot(str(tmp_path / "missing"))
