"""The built-in checks, one module per check, registered in BUILTIN_CHECKS."""

from __future__ import annotations

from auditor.check import Check
from checks.cpu_cstates import CpuCstates
from checks.cpu_governor import CpuGovernor
from checks.kernel_version import KernelVersion
from checks.lxc_device_majors import LxcDeviceMajors
from checks.numa_balancing import NumaBalancing
from checks.pcie_mrrs import PcieMrrs

#: The built-in checks in report order; plug-ins come after them.
BUILTIN_CHECKS: list[type[Check]] = [
    CpuGovernor,
    CpuCstates,
    NumaBalancing,
    KernelVersion,
    PcieMrrs,
    LxcDeviceMajors,
]
