"""Generated hosts for the tests and benchmarks: each class of host in a module of its own.

- :mod:`.base`: the tree of files, links and device nodes, and PCI config spaces;
- :mod:`.proxmox`: the 8-GPU Proxmox node with the six founding problems;
- :mod:`.containers`: a Proxmox VE 9 node with six GPU container layouts, and plain LXC
  with Incus;
- :mod:`.guests`: a KVM guest, and the audit run inside an unprivileged container;
- :mod:`.platforms`: an AMD EPYC host (C2 = CC6) and an arm64 host with ACPI LPI states.
"""

from tests.support.hostgen.base import SPEEDS, Tree, pcie_config, sysfs_common
from tests.support.hostgen.proxmox import FIXED_BY_SCRIPT, HostSpec, build_host

__all__ = ["FIXED_BY_SCRIPT", "SPEEDS", "HostSpec", "Tree", "build_host", "pcie_config",
           "sysfs_common"]
