"""The parts every generated host is built from: a tree of files, links and device
nodes, and PCI config spaces real pciutils decode.

The layout follows the kernel's sysfs and procfs (policy symlinks, PCI device
symlinks into ``/sys/devices/pci*``, 4096-byte config spaces with a real
capability list).
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tree:
    """Files, symlinks and device entries of a sysroot, by absolute path."""

    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Modification times of some files (seconds since the epoch); the rest get the time
    #: they are written.
    mtimes: dict[str, float] = field(default_factory=dict)

    def put(self, path: str, text: str | bytes) -> None:
        self.files[path] = text.encode() if isinstance(text, str) else text

    def write_dir(self, root: Path) -> Path:
        """Materialise under ``root`` (device entries only when running as root)."""
        for path, data in self.files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if path in self.mtimes:
                os.utime(target, (self.mtimes[path], self.mtimes[path]))
        for path, dest in self.links.items():
            link = root / path.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(dest)
        if os.geteuid() == 0:
            for path, (major, minor) in self.devices.items():
                node = root / path.lstrip("/")
                node.parent.mkdir(parents=True, exist_ok=True)
                os.mknod(node, 0o666 | 0o020000, os.makedev(major, minor))
        return root

    def write_tar(self, dest: Path) -> Path:
        """Write a ``.tar.gz`` capture with device entries (no root needed)."""
        with tarfile.open(dest, "w:gz") as archive:
            for path, data in sorted(self.files.items()):
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size = len(data)
                info.mode = 0o644
                info.mtime = int(self.mtimes.get(path, 0))
                archive.addfile(info, io.BytesIO(data))
            for path, target in sorted(self.links.items()):
                info = tarfile.TarInfo(path.lstrip("/"))
                info.type = tarfile.SYMTYPE
                info.linkname = target
                archive.addfile(info)
            for path, (major, minor) in sorted(self.devices.items()):
                info = tarfile.TarInfo(path.lstrip("/"))
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = major, minor
                info.mode = 0o666
                archive.addfile(info)
        return dest


def pcie_config(
    vendor: int,
    device: int,
    class_code: int,
    *,
    port_type: int = 0,
    mrrs: int = 4096,
    mps: int = 256,
    speed: int = 5,
    width: int = 16,
    current_speed: int | None = None,
    current_width: int | None = None,
) -> bytes:
    """Return a 4096-byte config space with PM, MSI and PCI Express capabilities."""
    cfg = bytearray(4096)
    struct.pack_into("<HH", cfg, 0, vendor, device)
    struct.pack_into("<H", cfg, 0x06, 0x0010)  # status: capability list present
    cfg[0x08] = 0xA1  # revision
    cfg[0x09:0x0C] = class_code.to_bytes(3, "little")
    cfg[0x0E] = 0x01 if class_code >> 8 == 0x0604 else 0x00
    cfg[0x34] = 0x40
    cfg[0x40:0x42] = bytes([0x01, 0x60])  # power management -> MSI
    cfg[0x60:0x62] = bytes([0x05, 0x78])  # MSI -> PCI Express
    exp = 0x78
    cfg[exp : exp + 2] = bytes([0x10, 0x00])
    struct.pack_into("<H", cfg, exp + 0x02, 0x0002 | (port_type << 4))
    struct.pack_into("<I", cfg, exp + 0x04, 0x00008000 | 0x5)  # MPS supported 4096
    code = {128: 0, 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
    control = (code[mrrs] << 12) | (code[mps] << 5) | 0x0010
    struct.pack_into("<H", cfg, exp + 0x08, control)
    struct.pack_into("<I", cfg, exp + 0x0C, (width << 4) | speed)
    status = ((current_width or width) << 4) | (current_speed or speed)
    struct.pack_into("<H", cfg, exp + 0x12, status)
    return bytes(cfg)


SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
          5: "32.0 GT/s PCIe"}


def sysfs_common(tree: Tree, directory: str) -> None:
    """Write the sysfs attributes lspci reads beside ``config``."""
    # lspci reads these beside config; without them it stops after the header line.
    tree.put(f"{directory}/irq", "0\n")
    tree.put(f"{directory}/resource", "0x0000000000000000 0x0000000000000000 "
             "0x0000000000000000\n" * 13)
    tree.put(f"{directory}/enable", "1\n")
    tree.put(f"{directory}/subsystem_vendor", "0x0000\n")
    tree.put(f"{directory}/subsystem_device", "0x0000\n")
