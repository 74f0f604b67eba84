"""cpu.governor: every cpufreq policy runs at full speed, with boost on and no max-freq cap.

An inference server feeds GPUs from a few hot CPU threads (tokenizer, scheduler, kernel
launches). A governor that ramps frequency on demand (ondemand, schedutil, powersave
with a power-leaning EPP) adds milliseconds of ramp-up to every burst after an idle gap.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from auditor import environment as where
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import tuned
from auditor.checks.lib.cpufreq import (
    AMD_STATUS,
    BOOST,
    CPU_DIR,
    CPUFREQ,
    EPP_DRIVERS,
    EPP_PERFORMANCE,
    INTEL_DRIVERS,
    INTEL_NO_TURBO,
    INTEL_STATUS,
    POLICY_FILES,
    PRESENT,
    REVERTING_DAEMONS,
    CpufreqPolicy,
    one_cpu_each,
    policy_names,
    policy_path,
    read_policy,
)
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.parsing import format_cpulist, lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

#: The governors of Linux's cpufreq core (Documentation/admin-guide/pm/cpufreq.rst).
GOVERNORS = ("performance", "powersave", "userspace", "ondemand", "conservative", "schedutil")

UNIT_NAME = "host-auditor-cpu-performance.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
WANTS = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
#: Drivers that choose the policy themselves (setpolicy / EPP): the
#: ``cpufreq.default_governor`` parameter does not reach them, a unit does.
SETPOLICY_DRIVERS = ("intel_pstate", "amd-pstate-epp")
#: Policy names as the check reports them: ``policyN``, or ``cpuN`` without policies.
_POLICY = lazy_re(r"(?:policy|cpu)[0-9]+")
_BOOST_FILES = {BOOST: "1", INTEL_NO_TURBO: "0"}


def unit_text(governor: str) -> str:
    """Return the systemd unit that sets ``governor`` (and EPP performance) at every boot."""
    epp = (f"for f in {CPU_DIR}/cpu[0-9]*/cpufreq/energy_performance_preference; "
           'do [ -w "$$f" ] && echo performance > "$$f"; done; ' if governor == "performance"
           else "")
    # systemd expands $VAR in ExecStart: $$ is a literal dollar for the shell.
    return (
        f"# Written by host-auditor: the {governor} governor{' and EPP' if epp else ''} on "
        "every cpufreq policy.\n"
        "[Unit]\n"
        f"Description=CPU frequency governor {governor} (host-auditor)\n"
        "After=sysinit.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart=/bin/sh -c '{epp}"
        f"for f in {CPU_DIR}/cpu[0-9]*/cpufreq/scaling_governor; do echo {governor} > "
        '"$$f"; done; true\'\n\n'
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


class GovernorOptions(CheckOptions):
    """Options of ``cpu.governor``."""

    governor: str = option("performance", choices=GOVERNORS,
                           help="the governor every cpufreq policy must run")
    require_boost: bool = option(True, help="warn when turbo/boost is off")

def _mhz(khz: int) -> str:
    return f"{khz / 1000:g} MHz"


class CpuGovernor(Check[GovernorOptions]):
    """CPU frequency governors that ramp on demand add latency to every burst."""

    id: ClassVar[str] = "cpu.governor"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *(f"{CPUFREQ}/policy*/{name}" for name in POLICY_FILES),
        *(f"{CPU_DIR}/cpu[0-9]*/cpufreq/{name}" for name in POLICY_FILES),
        PRESENT,
        BOOST,
        INTEL_STATUS,
        INTEL_NO_TURBO,
        AMD_STATUS,
        # Process names, so a remote audit can name daemons that revert the governor.
        "/proc/[0-9]*/comm",
        *where.READS,
    )
    daemons: ClassVar[frozenset[str]] = frozenset(REVERTING_DAEMONS)
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
    options_type: ClassVar[type[CheckOptions]] = GovernorOptions
    fix_reads: ClassVar[tuple[str, ...]] = ("/proc/cpuinfo",)

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = where.environment(host)
        found = list(self._evaluate(host, env))
        if env.bare_metal:
            yield from found
            return
        if env.in_container:
            note = (f"; read {env.inside()}: this is the host's cpufreq (/sys is the "
                    "host's), so the fix belongs on the host")
        else:
            note = (f"; in a VM guest ({env.hypervisor}) the hypervisor host's governor sets "
                    "the physical CPU frequency: audit the host too")
        for finding in found:
            if env.vm and finding.status is Status.SKIP:
                yield finding  # it says so already
                continue
            fix = finding.fix
            if env.in_container and fix:
                fix = f"on the host: {fix}"
            yield replace(finding, message=finding.message + note, fix=fix,
                          evidence=(*finding.evidence, ("environment", env.describe())))

    def _evaluate(self, host: Host, env: where.Environment) -> Iterable[Finding]:
        names = policy_names(host)
        if not names:
            if env.vm:
                reason = (f"no cpufreq policies under {CPUFREQ}: a VM guest "
                          f"({env.hypervisor}) does not control the CPU frequency; the "
                          "hypervisor host's governor does, so audit the host")
            else:
                reason = (f"no cpufreq policies under {CPUFREQ}: the kernel does not control "
                          "CPU frequency here (no cpufreq driver), so the firmware sets it")
            yield self.skipped("cpufreq", reason)
            return
        wanted = self.options.governor
        first = policy_path(names[0])
        # One cpufreq driver serves every policy (the kernel holds a single driver), so
        # the driver-wide files are read once, from the first policy.
        driver = host.read_optional(f"{first}/scaling_driver") or "unknown"
        available = host.read_optional(f"{first}/scaling_available_governors") or ""
        epp_choices = host.read_optional(f"{first}/energy_performance_available_preferences")
        # The kernel adds both EPP files together, only where the driver has EPP.
        with_epp = epp_choices is not None
        alone = one_cpu_each(host, names)
        policies = [p for n in names
                    if (p := read_policy(host, n, with_epp, alone)) is not None]
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
    def _groups(policies: list[CpufreqPolicy]) -> dict[tuple[str, str | None], list[CpufreqPolicy]]:
        groups: dict[tuple[str, str | None], list[CpufreqPolicy]] = {}
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
        if on is not False or not self.options.require_boost:
            return on, None
        return False, self.warned(
            "boost",
            f"turbo/boost is off ({source} reads {observed.partition('=')[2]}): CPUs stay at "
            "base clock, slowing single-threaded work such as tokenization and kernel launch",
            observed=observed, expected="boost on", fix=fix,
            evidence={"driver": driver, "source": source},
        )

    def _caps(
        self, host: Host, policies: list[CpufreqPolicy], driver: str, boost_on: bool | None
    ) -> list[Finding]:
        capped: dict[tuple[int, int], list[CpufreqPolicy]] = {}
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
        running = tuned.processes(host)
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

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Write the governor to each policy (EPP first), and persist it across reboots."""
        from auditor.remedy import MakeSymlink, Remedy, RunCommand, SetValue, WriteFile
        from auditor.remedy import evidence as evidence_of
        env = where.environment(host)
        if env.in_container:
            return self.advice_on_the_host(findings, env.describe())
        wanted = self.options.governor
        remedies: list[Remedy] = []
        params: list[str] = []
        need_unit = False
        for finding in findings:
            ev = evidence_of(finding)
            if "governor" not in ev:
                extra = self._other_remedy(host, finding, ev)
                if extra is not None:
                    remedies.append(extra)
                continue
            driver = ev.get("driver", "")
            available = ev.get("available_governors", "").split()
            notes: list[str] = []
            steps: list[Step] = []
            if available and wanted not in available:
                notes.append(f"driver {driver} offers no {wanted} governor "
                             f"({' '.join(available)}): nothing to set")
            else:
                epp_steps: list[Step] = []
                gov_steps: list[Step] = []
                for name in ev.get("policies", "").split():
                    if not _POLICY.fullmatch(name):
                        continue
                    epp = f"{policy_path(name)}/energy_performance_preference"
                    if wanted == "performance" and ev.get("epp") and host.exists(epp):
                        epp_steps.append(SetValue(epp, "performance"))
                    governor = f"{policy_path(name)}/scaling_governor"
                    if host.exists(governor):
                        gov_steps.append(SetValue(governor, wanted))
                # EPP first: EPP drivers refuse a non-performance EPP under the performance
                # governor, so the rollback (reverse order) restores the governor before EPP.
                steps = epp_steps + gov_steps
                if driver in SETPOLICY_DRIVERS:
                    need_unit = True
                    if driver == "amd-pstate-epp":
                        params.append("amd_pstate=active")
                else:
                    params.append(f"cpufreq.default_governor={wanted}")
                    if driver == "acpi-cpufreq" and "AuthenticAMD" in (
                        host.read_optional("/proc/cpuinfo") or ""
                    ):
                        notes.append("on kernels >= 6.3, amd_pstate=active switches this AMD "
                                     "CPU to the amd-pstate-epp driver; not added here")
            remedies.append(Remedy(
                check=self.id,
                subject=finding.subject,
                title=f"{wanted} governor on CPUs {finding.subject} ({driver})",
                runtime=tuple(steps),
                notes=tuple(notes),
            ))
        if not params and not need_unit:
            return remedies
        running = tuned.processes(host)
        daemons = sorted({daemon for process, (daemon, _) in REVERTING_DAEMONS.items()
                          if running is not None and process in running})
        known = sorted({daemon for daemon, _ in REVERTING_DAEMONS.values()})
        warning = ("daemons that set governors can revert this: "
                   + ("running now: " + ", ".join(daemons) if daemons else
                      "check " + ", ".join(known) + " and Ubuntu's ondemand.service"))
        persistent: list[Step] = []
        if need_unit:
            persistent += [
                WriteFile(UNIT, unit_text(wanted)),
                MakeSymlink(WANTS, UNIT),
                RunCommand(("systemctl", "daemon-reload"), after=(0,),
                           undo=("systemctl", "daemon-reload"), optional=True),
            ]
        how = [f"{' '.join(dict.fromkeys(params))} on the boot command line"] if params else []
        if need_unit:
            how.append(f"the {UNIT_NAME} unit")
        remedies.append(Remedy(
            check=self.id,
            subject="boot",
            title=f"keep the {wanted} governor across reboots",
            persistent=tuple(persistent),
            boot_params=tuple(dict.fromkeys(params)),
            notes=(f"persisted by {' and '.join(how)}", warning),
        ))
        return remedies

    def _other_remedy(self, host: Host, finding: Finding, ev: dict[str, str]) -> Remedy | None:
        """Return the remedy for a boost, max-frequency cap or daemon finding, or None."""
        from auditor.remedy import Advice, Remedy, SetValue
        if finding.subject == "boost" and ev.get("source") in _BOOST_FILES:
            source = ev["source"]
            return Remedy(
                check=self.id, subject="boost", title="turn boost on",
                runtime=(SetValue(source, _BOOST_FILES[source]),) if host.exists(source) else (),
                notes=("boost can also be off in the firmware setup: check it there too",),
            )
        if finding.subject.startswith("max-freq:"):
            hw_max = ev.get("cpuinfo_max_freq", "")
            if not hw_max.isdigit():
                return None
            steps: list[Step] = []
            for name in ev.get("policies", "").split():
                path = f"{policy_path(name)}/scaling_max_freq"
                if _POLICY.fullmatch(name) and host.exists(path):
                    steps.append(SetValue(path, hw_max))
            return Remedy(
                check=self.id, subject=finding.subject,
                title=f"lift the scaling_max_freq cap to {hw_max} kHz", runtime=tuple(steps),
                notes=("whatever set the cap (a daemon, a power profile) sets it again at boot",),
            )
        if "daemon" in ev:
            return Remedy(
                check=self.id, subject=finding.subject,
                title=f"{ev['daemon']} manages the governor",
                advice=(Advice(f"make {ev['daemon']} choose {self.options.governor}, or stop "
                               f"it: {finding.fix}"),),
            )
        return None
