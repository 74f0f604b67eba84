"""Generated hosts for the tests and benchmarks: each class of host in a module of its own.

- :mod:`.base`: the tree of files, links and device nodes, and PCI config spaces;
- :mod:`.proxmox`: the 8-GPU Proxmox node with the six founding problems;
- :mod:`.nvidia`: GPU nodes as the NVIDIA driver's lifecycle leaves them (kernels and their
  modules, boot loaders, module options, daemons, CDI specs, upgrades).
"""

from tests.support.hostgen.base import SPEEDS, Tree, pcie_config, sysfs_common
from tests.support.hostgen.proxmox import FIXED_BY_SCRIPT, HostSpec, build_host

__all__ = ["FIXED_BY_SCRIPT", "SPEEDS", "HostSpec", "Tree", "build_host", "pcie_config",
           "sysfs_common"]
