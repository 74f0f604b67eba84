"""Generated hosts for the tests and benchmarks: each class of host in a module of its own.

- :mod:`.base`: the tree of files, links and device nodes, and PCI config spaces;
- :mod:`.proxmox`: the 8-GPU Proxmox node with the six founding problems;
- :mod:`.containers`: a Proxmox VE 9 node with six GPU container layouts, and plain LXC
  with Incus;
- :mod:`.guests`: a KVM guest, and the audit run inside an unprivileged container;
- :mod:`.platforms`: an AMD EPYC host (C2 = CC6) and an arm64 host with ACPI LPI states;
- :mod:`.pcie`: PCIe topologies (root ports, switches, endpoints, VFs) with extended
  capabilities, IOMMU groups, link and port power management and AER counters;
- :mod:`.classes`: whole hosts of the GPU-to-GPU path (an 8-GPU PCIe box with every
  problem planted, DGX H100, 8x MI300X, GH200, a KVM guest with passed-through GPUs).
- :mod:`.nvidia`: GPU nodes as the NVIDIA driver's lifecycle leaves them (kernels and their
  modules, boot loaders, module options, daemons, CDI specs, upgrades).
"""

from tests.support.hostgen.base import SPEEDS, Tree, pcie_config, sysfs_common
from tests.support.hostgen.proxmox import FIXED_BY_SCRIPT, HostSpec, build_host

__all__ = ["FIXED_BY_SCRIPT", "SPEEDS", "HostSpec", "Tree", "build_host", "pcie_config",
           "sysfs_common"]
