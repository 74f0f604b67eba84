"""DirectoryHost and LocalHost: the same seam over a real filesystem."""

from __future__ import annotations

import os

from auditor.hosts import DirectoryHost, LocalHost
from tests.support.sysroot import Sysroot


def test_directory_host_resolves_absolute_links_inside_root(h200: Sysroot) -> None:
    h200.symlink("/etc/alias", "/etc/hostname")
    host = DirectoryHost(str(h200.root))
    assert host.read_optional("/etc/alias") == "gpu-h200-vm"
    assert host.resolve("/etc/alias") == "/etc/hostname"


def test_directory_host_reads_device_nodes_when_extracted_as_root(h200: Sysroot) -> None:
    host = DirectoryHost(str(h200.root))
    if os.geteuid() == 0:
        assert host.device_numbers("/dev/nvidia-uvm") == (238, 0)
    else:
        assert host.device_numbers("/dev/nvidia-uvm") is None


def test_local_host_reads_the_live_machine() -> None:
    host = LocalHost()
    devices = host.read_text("/proc/devices")
    assert "Character devices:" in devices
    assert host.glob("/proc/sys/kernel/osrel*") == ["/proc/sys/kernel/osrelease"]
    processes = host.processes()
    assert processes is not None and len(processes) > 0


def test_directory_host_read_optional_is_none_for_what_is_no_readable_file(
        h200: Sysroot) -> None:
    """A FIFO, a directory, a dangling link or a missing file is None; bytes that are not
    UTF-8 are replaced; a path is read as its normal form."""
    os.mkfifo(h200.root / "etc/fifo")
    h200.symlink("/etc/dangling", "/etc/nowhere")
    (h200.root / "etc/latin1").write_bytes(b"caf\xe9 \n")
    host = DirectoryHost(str(h200.root))
    for path in ("/etc/fifo", "/etc", "/etc/dangling", "/etc/missing", "/etc/fifo/x"):
        assert host.read_optional(path) is None, path
    assert host.read_optional("/etc/latin1") == "caf\ufffd"
    assert host.read_optional("/etc/../etc/./hostname") == "gpu-h200-vm"
    assert host.read_optional("etc//hostname") == host.read_text("/etc/hostname").strip()
