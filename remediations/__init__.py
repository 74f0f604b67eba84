"""Remediations: turn findings into runtime, persistent and rollback steps.

One module per kind of fix; :func:`remediations` maps check ids to them.
"""

from __future__ import annotations

from remediations.base import Remediation


def remediations() -> dict[str, Remediation]:
    """Return the remediation for each check id that has one."""
    from remediations import cstates, governor, kernel, lxc, numa, pcie

    return {
        "numa.balancing": numa.remediate,
        "cpu.governor": governor.remediate,
        "cpu.cstates": cstates.remediate,
        "pcie.mrrs": pcie.remediate,
        "lxc.device_majors": lxc.remediate,
        "kernel.version": kernel.remediate,
    }


def remediation_reads() -> tuple[str, ...]:
    """Return the path patterns remediations read beyond what the checks read."""
    from remediations import boot, cstates, governor, kernel, lxc, numa, pcie

    reads: list[str] = ["/proc/sys/kernel/hostname", "/etc/hostname", "/etc/machine-id"]
    for module in (boot, cstates, governor, kernel, lxc, numa, pcie):
        reads.extend(module.READS)
    return tuple(dict.fromkeys(reads))
