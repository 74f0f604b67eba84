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
