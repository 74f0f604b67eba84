"""The real host captures, and writable copies of them (sysroots) for planting problems."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

#: The real host captures, kept in the repository (tests/fixtures/hosts/README.md).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
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
