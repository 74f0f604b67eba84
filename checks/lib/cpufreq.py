"""cpufreq as sysfs shows it: policies, their governors, EPP and frequency limits.

Shared by ``cpu.governor`` and its remediation; read through the Host seam.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from auditor.hosts.base import Host
from auditor.parsing import lazy_re, parse_cpulist

CPU_DIR = "/sys/devices/system/cpu"
CPUFREQ = f"{CPU_DIR}/cpufreq"
BOOST = f"{CPUFREQ}/boost"
INTEL_STATUS = "/sys/devices/system/cpu/intel_pstate/status"
INTEL_NO_TURBO = "/sys/devices/system/cpu/intel_pstate/no_turbo"
AMD_STATUS = "/sys/devices/system/cpu/amd_pstate/status"
POLICY_FILES = (
    "scaling_driver",
    "scaling_governor",
    "scaling_available_governors",
    "affected_cpus",
    "related_cpus",
    "energy_performance_preference",
    "energy_performance_available_preferences",
    "scaling_max_freq",
    "cpuinfo_max_freq",
    "scaling_min_freq",
)

#: Drivers in which the hardware picks the frequency, steered by the EPP hint: there
#: ``powersave`` with EPP ``performance`` runs as fast as the ``performance`` governor.
EPP_DRIVERS = frozenset({"intel_pstate", "amd-pstate-epp"})
#: EPP values that mean "performance": the name, or the raw 0 a tool may have written.
EPP_PERFORMANCE = frozenset({"performance", "0"})
INTEL_DRIVERS = frozenset({"intel_pstate", "intel_cpufreq"})

#: Running daemons that set the governor themselves and would undo a change, by process
#: name, with the daemon's name and how to make it keep the performance governor. A
#: process name is cut to 15 characters (/proc/PID/comm). thermald is absent on
#: purpose: it throttles only when hot, and sets no governor.
REVERTING_DAEMONS: dict[str, tuple[str, str]] = {
    "tuned": ("tuned", "tuned-adm profile latency-performance"),
    "power-profiles-daemon": ("power-profiles-daemon", "powerprofilesctl set performance"),
    "power-profiles-": ("power-profiles-daemon", "powerprofilesctl set performance"),
    "cpufreqd": ("cpufreqd", "systemctl disable --now cpufreqd"),
    "cpufrequtils": ("cpufrequtils", "set GOVERNOR=performance in /etc/default/cpufrequtils"),
    "ondemand": ("ondemand", "systemctl disable --now ondemand"),
    "auto-cpufreq": ("auto-cpufreq", "systemctl disable --now auto-cpufreq"),
    "system76-power": ("system76-power", "system76-power profile performance"),
    "tlp": ("tlp", "set CPU_SCALING_GOVERNOR_ON_AC=performance in /etc/tlp.conf"),
}

_POLICY_NAME = lazy_re(r"^policy([0-9]{1,5})$")
_CPU_NAME = lazy_re(r"^cpu([0-9]{1,5})$")
_CPU_LIST = lazy_re(r"^[0-9,\-:/]*$")


class CpufreqPolicy(NamedTuple):
    """What one cpufreq policy reports."""

    name: str
    cpus: tuple[int, ...]
    governor: str
    epp: str | None
    max_freq: int | None
    hw_max_freq: int | None


def parse_cpu_numbers(text: str) -> list[int]:
    """Parse a cpufreq CPU list (``0 1 2``) or a range list; [] for garbage."""
    joined = ",".join(text.split())
    # A garbled file must not make us build a range of billions of CPUs.
    if not _CPU_LIST.match(joined) or any(len(n) > 5 for n in re.findall(r"[0-9]+", joined)):
        return []
    try:
        return parse_cpulist(joined)
    except ValueError:
        return []


def parse_khz(text: str | None) -> int | None:
    """Parse a frequency in kHz; None for a missing or garbled value."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 12:
        return None
    return int(text)


def policy_path(name: str) -> str:
    """Return the directory of a policy ``policy_names`` gave: ``policyN``, or ``cpuN``'s own."""
    if _CPU_NAME.match(name):
        return f"{CPU_DIR}/{name}/cpufreq"
    return f"{CPUFREQ}/{name}"


def policy_names(host: Host) -> list[str]:
    """Return the cpufreq policy names, in CPU order.

    These are the ``policyN`` directories; where there are none but CPUs have a
    ``cpufreq`` directory of their own (kernels before 4.3, trees built by hand),
    each such CPU is named (``cpuN``) as a policy of one.
    """
    try:
        names = host.listdir(CPUFREQ)
    except OSError:
        names = []
    found = [(int(m.group(1)), n) for n in names if (m := _POLICY_NAME.match(n))]
    if not found:
        try:
            cpus = host.listdir(CPU_DIR)
        except OSError:
            return []
        found = [(int(m.group(1)), n) for n in cpus
                 if (m := _CPU_NAME.match(n)) and host.is_dir(f"{CPU_DIR}/{n}/cpufreq")]
    return [name for _, name in sorted(found)]


#: The CPUs the kernel knows of (Documentation/ABI/testing/sysfs-devices-system-cpu).
PRESENT = f"{CPU_DIR}/present"


def one_cpu_each(host: Host, names: list[str]) -> bool:
    """Return whether every ``policyN`` holds CPU N alone, without reading each policy.

    A policy directory is named after the CPU that created it, and every CPU belongs to
    one policy (Documentation/admin-guide/pm/cpufreq.rst, "Policy Objects"): as many
    ``policyN`` directories as CPUs present means one CPU each, CPU N in ``policyN``
    (then ``affected_cpus`` can only say ``N``: 512 reads fewer on a 512-CPU host).
    """
    if not names or not all(_POLICY_NAME.match(n) for n in names):
        return False
    present = parse_cpu_numbers(host.read_optional(PRESENT) or "")
    return len(present) == len(names)


def read_policy(host: Host, name: str, with_epp: bool,
                alone: bool = False) -> CpufreqPolicy | None:
    """Read one policy; None when its governor cannot be read (every CPU of it offline).

    ``alone``: the policy is known to hold only its own CPU (:func:`one_cpu_each`).
    """
    base = policy_path(name)
    governor = host.read_optional(f"{base}/scaling_governor")
    if not governor:
        return None
    cpus: list[int] = []
    if not alone:
        cpus = (parse_cpu_numbers(host.read_optional(f"{base}/affected_cpus") or "")
                or parse_cpu_numbers(host.read_optional(f"{base}/related_cpus") or ""))
    if not cpus:
        # A policy is named after its first CPU; one held alone is that CPU, online (an
        # inactive policy answers EBUSY for its governor above).
        cpus = [int(name.removeprefix("policy").removeprefix("cpu"))]
    return CpufreqPolicy(
        name=name,
        cpus=tuple(cpus),
        governor=governor,
        epp=host.read_optional(f"{base}/energy_performance_preference") if with_epp else None,
        max_freq=parse_khz(host.read_optional(f"{base}/scaling_max_freq")),
        hw_max_freq=parse_khz(host.read_optional(f"{base}/cpuinfo_max_freq")),
    )


