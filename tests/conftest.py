"""Shared fixtures: the real host captures, copied into sysroots tests may change."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from auditor.model import Finding, Severity, Status

#: The real host captures, kept in the repository (tests/fixtures/hosts/README.md).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hosts"
CAPTURES = {"h200": FIXTURES / "h200-vm.tar.gz", "virtio": FIXTURES / "virtio-vm.tar.gz"}


def extract_capture(capture: Path, dest: Path) -> Path:
    """Unpack a capture into ``dest``; device nodes are made only when running as root."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(capture) as archive:
        members = [
            m for m in archive.getmembers()
            if os.geteuid() == 0 or not (m.ischr() or m.isblk())
        ]
        archive.extractall(dest, members=members, filter="fully_trusted")
    return dest


class Sysroot:
    """A writable copy of a real capture, for planting problems in test code."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def write(self, path: str, text: str | bytes) -> Path:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)
        return target

    def read(self, path: str) -> str:
        return self.path(path).read_text()

    def remove(self, path: str) -> None:
        target = self.path(path)
        if target.is_dir() and not target.is_symlink():
            import shutil

            shutil.rmtree(target)
        else:
            target.unlink()

    def symlink(self, path: str, target: str) -> None:
        link = self.path(path)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)

    def mknod(self, path: str, major: int, minor: int) -> None:
        """Make a character device node (root) or skip the test."""
        if os.geteuid() != 0:
            pytest.skip("making device nodes needs root")
        node = self.path(path)
        node.parent.mkdir(parents=True, exist_ok=True)
        if node.exists():
            node.unlink()
        os.mknod(node, 0o600 | 0o020000, os.makedev(major, minor))

    def tarball(self, dest: Path) -> Path:
        """Pack the sysroot as a .tar.gz capture."""
        with tarfile.open(dest, "w:gz") as archive:
            for entry in sorted(self.root.iterdir()):
                archive.add(entry, arcname=entry.name)
        return dest


@pytest.fixture
def make_sysroot(tmp_path: Path) -> Callable[[str], Sysroot]:
    """Return a factory: ``make_sysroot("h200")`` copies that capture into tmp_path."""
    counter = iter(range(1000))

    def factory(name: str = "h200") -> Sysroot:
        return Sysroot(extract_capture(CAPTURES[name], tmp_path / f"{name}-{next(counter)}"))

    return factory


@pytest.fixture
def h200(make_sysroot: Callable[[str], Sysroot]) -> Sysroot:
    return make_sysroot("h200")


@pytest.fixture
def virtio(make_sysroot: Callable[[str], Sysroot]) -> Sysroot:
    return make_sysroot("virtio")


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
