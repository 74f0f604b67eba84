"""cpu.governor: every cpufreq policy runs at full speed, with boost on and no max-freq cap.

An inference server feeds GPUs from a few hot CPU threads (tokenizer, scheduler, kernel
launches). A governor that ramps frequency on demand (ondemand, schedutil, powersave
with a power-leaning EPP) adds milliseconds of ramp-up to every burst after an idle gap.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import ClassVar

from auditor.check import Check
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import format_cpulist, parse_cpulist

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

#: Running daemons that set the governor themselves and would undo a change, with how
#: to make them keep it. thermald is absent on purpose: it throttles only when hot.
REVERTING_DAEMONS: dict[str, tuple[str, str]] = {
    "tuned": ("tuned", "tuned-adm profile latency-performance"),
    "power-profiles-daemon": ("power-profiles-daemon", "powerprofilesctl set performance"),
    # A process name is cut to 15 characters in /proc/PID/stat.
    "power-profiles-": ("power-profiles-daemon", "powerprofilesctl set performance"),
    "cpufreqd": ("cpufreqd", "systemctl disable --now cpufreqd"),
    "cpufrequtils": ("cpufrequtils", "set GOVERNOR=performance in /etc/default/cpufrequtils"),
    "ondemand": ("ondemand", "systemctl disable --now ondemand"),
    "auto-cpufreq": ("auto-cpufreq", "systemctl disable --now auto-cpufreq"),
    "system76-power": ("system76-power", "system76-power profile performance"),
}

_POLICY_NAME = re.compile(r"^policy([0-9]{1,5})$")
_CPU_NAME = re.compile(r"^cpu([0-9]{1,5})$")
_CPU_LIST = re.compile(r"^[0-9,\-:/]*$")


@dataclass(frozen=True)
class Policy:
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


def read_policy(host: Host, name: str, with_epp: bool) -> Policy | None:
    """Read one policy; None when its governor cannot be read (every CPU of it offline)."""
    base = policy_path(name)
    governor = host.read_optional(f"{base}/scaling_governor")
    if not governor:
        return None
    cpus = parse_cpu_numbers(host.read_optional(f"{base}/affected_cpus") or "")
    if not cpus:
        cpus = parse_cpu_numbers(host.read_optional(f"{base}/related_cpus") or "")
    if not cpus:
        # A policy is named after its first CPU.
        cpus = [int(name.removeprefix("policy").removeprefix("cpu"))]
    return Policy(
        name=name,
        cpus=tuple(cpus),
        governor=governor,
        epp=host.read_optional(f"{base}/energy_performance_preference") if with_epp else None,
        max_freq=parse_khz(host.read_optional(f"{base}/scaling_max_freq")),
        hw_max_freq=parse_khz(host.read_optional(f"{base}/cpuinfo_max_freq")),
    )


def _mhz(khz: int) -> str:
    return f"{khz / 1000:g} MHz"


class CpuGovernor(Check):
    """CPU frequency governors that ramp on demand add latency to every burst."""

    id: ClassVar[str] = "cpu.governor"
    severity: ClassVar[Severity] = Severity.HIGH
    reads: ClassVar[tuple[str, ...]] = (
        *(f"{CPUFREQ}/policy*/{name}" for name in POLICY_FILES),
        *(f"{CPU_DIR}/cpu[0-9]*/cpufreq/{name}" for name in POLICY_FILES),
        BOOST,
        INTEL_STATUS,
        INTEL_NO_TURBO,
        AMD_STATUS,
        # Process names, so a remote audit can name daemons that revert the governor.
        "/proc/[0-9]*/comm",
    )
    rationale: ClassVar[str] = (
        "The CPU threads that tokenize, schedule batches and launch GPU kernels are bursty: "
        "they idle while the GPU computes and then must run at once. Governors that scale "
        "frequency with load (ondemand, conservative, schedutil, powersave with a power-saving "
        "energy-performance preference) start each burst slow and ramp up, which shows as "
        "time-to-first-token and inter-token latency jitter. Boost off or a scaling_max_freq "
        "cap leaves single-thread speed on the table."
    )
    remedy: ClassVar[str] = (
        "cpupower frequency-set -g performance (or write performance to every "
        "/sys/devices/system/cpu/cpufreq/policy*/scaling_governor); on intel_pstate active "
        "mode or amd-pstate-epp, powersave with energy_performance_preference=performance "
        "also passes. Turn boost on, lift scaling_max_freq caps, and persist it in the tool "
        "that manages power on the host (a tuned profile such as latency-performance, "
        "power-profiles-daemon's performance profile, or a systemd unit)."
    )
    defaults: ClassVar[dict[str, object]] = {"governor": "performance", "require_boost": True}

    def evaluate(self, host: Host) -> Iterable[Finding]:
        names = policy_names(host)
        if not names:
            yield self.skipped(
                "cpufreq",
                f"no cpufreq policies under {CPUFREQ}: the kernel does not control CPU "
                "frequency here (a VM, or no cpufreq driver), so the hypervisor or firmware "
                "sets it",
            )
            return
        wanted = str(self.options["governor"])
        first = policy_path(names[0])
        # One cpufreq driver serves every policy (the kernel holds a single driver), so
        # the driver-wide files are read once, from the first policy.
        driver = host.read_optional(f"{first}/scaling_driver") or "unknown"
        available = host.read_optional(f"{first}/scaling_available_governors") or ""
        epp_choices = host.read_optional(f"{first}/energy_performance_available_preferences")
        # The kernel adds both EPP files together, only where the driver has EPP.
        with_epp = epp_choices is not None
        policies = [p for n in names if (p := read_policy(host, n, with_epp)) is not None]
        if not policies:
            yield self.skipped(
                "cpufreq",
                f"{len(names)} cpufreq policies but no readable scaling_governor "
                "(every CPU offline, or the files are unreadable)",
                evidence={"driver": driver},
            )
            return
        mode = self._mode(host, driver)
        boost_on, boost_finding = self._boost(host, driver)
        boost_note = "; boost is on" if boost_on else ""
        problems: list[Finding] = []
        passes: list[Finding] = []
        for (governor, epp), group in self._groups(policies).items():
            cpus = format_cpulist(c for p in group for c in p.cpus)
            evidence = {"driver": driver, "governor": governor}
            if epp is not None:
                evidence["epp"] = epp
            evidence["policies"] = " ".join(p.name for p in group)
            evidence["available_governors"] = available
            if mode:
                evidence["mode"] = mode
            where = f"{driver}{f' ({mode} mode)' if mode else ''}"
            with_epp_text = f" with EPP {epp}" if epp is not None else ""
            shown = f"{governor}{with_epp_text}"
            running = f"CPUs {cpus} run the {governor} governor{with_epp_text} ({where})"
            if self._fast(driver, governor, epp, wanted):
                passes.append(self.passed(
                    cpus, f"{running}{boost_note}",
                    observed=shown, expected=wanted, evidence=evidence,
                ))
                continue
            problems.append(self._governor_failure(
                cpus, running, driver, shown, wanted, available, epp_choices, evidence
            ))
        if boost_finding is not None:
            problems.append(boost_finding)
        problems.extend(self._caps(host, policies, driver, boost_on))
        daemons = self._daemons(host)
        if problems:
            problems.extend(daemons)
        elif daemons:
            names_running = ", ".join(d.subject for d in daemons)
            passes = [
                replace(
                    f, message=f"{f.message}; managed by {names_running}",
                    evidence=(*f.evidence, ("managed_by", names_running)),
                )
                for f in passes
            ]
        yield from passes
        yield from problems

    @staticmethod
    def _groups(policies: list[Policy]) -> dict[tuple[str, str | None], list[Policy]]:
        groups: dict[tuple[str, str | None], list[Policy]] = {}
        for policy in policies:
            groups.setdefault((policy.governor, policy.epp), []).append(policy)
        return groups

    @staticmethod
    def _fast(driver: str, governor: str, epp: str | None, wanted: str) -> bool:
        if governor == wanted:
            return True
        return (
            wanted == "performance"
            and driver in EPP_DRIVERS
            and governor == "powersave"
            and epp in EPP_PERFORMANCE
        )

    def _governor_failure(
        self,
        cpus: str,
        running: str,
        driver: str,
        shown: str,
        wanted: str,
        available: str,
        epp_choices: str | None,
        evidence: dict[str, str],
    ) -> Finding:
        message = f"{running}, not {wanted}"
        if driver in EPP_DRIVERS and wanted == "performance" and evidence.get("epp"):
            message += (
                "; powersave passes only with energy_performance_preference=performance"
                f" (offered: {epp_choices or 'unknown'})"
            )
        fix = f"cpupower -c {cpus} frequency-set -g {shlex.quote(wanted)}"
        if available and wanted not in available.split():
            message += f"; {wanted} is not among the available governors ({available})"
            fix = f"modprobe cpufreq_{shlex.quote(wanted)} && {fix}"
        return self.failed(
            cpus, message, observed=shown, expected=wanted, fix=fix, evidence=evidence
        )

    @staticmethod
    def _mode(host: Host, driver: str) -> str:
        if driver.startswith("amd-pstate"):
            return host.read_optional(AMD_STATUS) or ""
        if driver in INTEL_DRIVERS:
            return host.read_optional(INTEL_STATUS) or ""
        return ""

    def _boost(self, host: Host, driver: str) -> tuple[bool | None, Finding | None]:
        """Return whether boost is on (None if unknown) and a warning when it is off."""
        if driver in INTEL_DRIVERS and (no_turbo := host.read_optional(INTEL_NO_TURBO)):
            on = {"0": True, "1": False}.get(no_turbo)
            source, fix = INTEL_NO_TURBO, f"echo 0 > {INTEL_NO_TURBO}"
            observed = f"no_turbo={no_turbo}"
        elif (boost := host.read_optional(BOOST)) is not None:
            on = {"1": True, "0": False}.get(boost)
            source, fix = BOOST, f"echo 1 > {BOOST}"
            observed = f"boost={boost}"
        else:
            return None, None
        if on is not False or not self.options["require_boost"]:
            return on, None
        return False, self.warned(
            "boost",
            f"turbo/boost is off ({source} reads {observed.partition('=')[2]}): CPUs stay at "
            "base clock, slowing single-threaded work such as tokenization and kernel launch",
            observed=observed, expected="boost on", fix=fix,
            evidence={"driver": driver, "source": source},
        )

    def _caps(
        self, host: Host, policies: list[Policy], driver: str, boost_on: bool | None
    ) -> list[Finding]:
        capped: dict[tuple[int, int], list[Policy]] = {}
        for policy in policies:
            if policy.max_freq is None or policy.hw_max_freq is None:
                continue
            if policy.max_freq < policy.hw_max_freq:
                capped.setdefault((policy.max_freq, policy.hw_max_freq), []).append(policy)
        findings = []
        for (cap, hw_max), group in capped.items():
            cpus = format_cpulist(c for p in group for c in p.cpus)
            min_freq = host.read_optional(f"{policy_path(group[0].name)}/scaling_min_freq") or ""
            note = (
                "; boost is off, which lowers scaling_max_freq on this driver"
                if boost_on is False else ""
            )
            findings.append(self.warned(
                f"max-freq:{cpus}",
                f"scaling_max_freq caps CPUs {cpus} at {_mhz(cap)}, below their "
                f"{_mhz(hw_max)} maximum{note}",
                observed=str(cap), expected=str(hw_max),
                fix=f"cpupower -c {cpus} frequency-set -u {hw_max}",
                evidence={
                    "driver": driver,
                    "policies": " ".join(p.name for p in group),
                    "scaling_max_freq": str(cap),
                    "cpuinfo_max_freq": str(hw_max),
                    "scaling_min_freq": min_freq if min_freq.isdigit() else "",
                },
            ))
        return findings

    def _daemons(self, host: Host) -> list[Finding]:
        running = host.processes()
        if running is None:
            return []
        found: dict[str, str] = {}
        for process in sorted(running):
            if process in REVERTING_DAEMONS:
                daemon, fix = REVERTING_DAEMONS[process]
                found.setdefault(daemon, fix)
        return [
            self.warned(
                daemon,
                f"{daemon} is running: it sets the CPU governor itself and would revert a "
                "change made by hand; make the change through it, or stop it",
                observed="running", expected="not overriding the governor", fix=fix,
                evidence={"daemon": daemon},
            )
            for daemon, fix in found.items()
        ]
