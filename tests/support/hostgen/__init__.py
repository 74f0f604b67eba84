"""Generated hosts for the tests and benchmarks: each class of host in a module of its own.

- :mod:`.base`: the tree of files, links and device nodes, and PCI config spaces;
- :mod:`.proxmox`: the 8-GPU Proxmox node with the six founding problems;
- :mod:`.pcie`: PCIe topologies (root ports, switches, endpoints, VFs) with extended
  capabilities, IOMMU groups, link and port power management and AER counters;
- :mod:`.classes`: whole hosts of the GPU-to-GPU path (an 8-GPU PCIe box with every
  problem planted, DGX H100, 8x MI300X, GH200, a KVM guest).
"""

from tests.support.hostgen.base import SPEEDS, Tree, pcie_config, sysfs_common
from tests.support.hostgen.proxmox import FIXED_BY_SCRIPT, HostSpec, build_host

__all__ = ["FIXED_BY_SCRIPT", "SPEEDS", "HostSpec", "Tree", "build_host", "pcie_config",
           "sysfs_common"]
