"""cpu.cstates: no enabled CPU idle state takes longer to leave than the policy allows.

A CPU in a deep C-state (C6 on Intel, C2 on AMD EPYC) needs tens to hundreds of
microseconds to wake. Every wake-up of an inference server's launch or network thread
pays that exit latency, so the deep states show up directly in token latency.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from auditor.check import Check, CheckOptions, option
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import format_cpulist, kernel_cmdline_params, parse_cpulist
from auditor.remediations.steps import FixContext, Remedy, SetValue, Step, evidence

CPU_DIR = "/sys/devices/system/cpu"
DRIVER = f"{CPU_DIR}/cpuidle/current_driver"
OFFLINE = f"{CPU_DIR}/offline"
CMDLINE = "/proc/cmdline"
STATE_FILES = ("name", "desc", "latency", "disable", "residency")
#: Module parameters that cap the deepest state a driver registers, with their default,
#: which caps nothing (intel_idle: CPUIDLE_STATE_MAX - 1; processor: ACPI_PROCESSOR_MAX_POWER).
MODULE_LIMITS = {
    "intel_idle.max_cstate": ("/sys/module/intel_idle/parameters/max_cstate", 9),
    "processor.max_cstate": ("/sys/module/processor/parameters/max_cstate", 8),
}
#: Paravirtual guest drivers: their states are the guest's, the host's C-states are not.
GUEST_DRIVERS = frozenset({"haltpoll"})
#: Enough for any CPU the kernel supports (CPUIDLE_STATE_MAX is 10).
_MAX_STATES = 16

#: Boot parameters that cap the idle driver at C1, by cpuidle driver.
BOOT_PARAMS = {
    "intel_idle": ("intel_idle.max_cstate=1", "processor.max_cstate=1"),
    "acpi_idle": ("processor.max_cstate=1",),
}

_STATE = re.compile(r"state[0-9]+")
_CPU_NAME = re.compile(r"^cpu([0-9]{1,5})$")
#: A kernel CPU list with no number over five digits (a garbled file must not expand
#: into billions of CPUs).
_CPU_LIST = re.compile(r"^(?:[0-9]{1,5}(?:-[0-9]{1,5})?)(?:,[0-9]{1,5}(?:-[0-9]{1,5})?)*$")


@dataclass(frozen=True)
class IdleState:
    """One idle state of a cpuidle driver: its index, name and exit latency as read."""

    index: int
    name: str
    latency: str

    @property
    def latency_us(self) -> int | None:
        """Return the exit latency in microseconds, or None when garbled."""
        text = self.latency
        return int(text) if text.isascii() and text.isdigit() and len(text) < 12 else None


@dataclass
class StateUse:
    """Where one idle state is enabled and disabled, across CPUs."""

    state: IdleState
    enabled: list[int]
    disabled: list[int]


def online_cpus(host: Host) -> list[int]:
    """Return the CPUs under /sys/devices/system/cpu, less those the kernel lists offline."""
    try:
        names = host.listdir(CPU_DIR)
    except OSError:
        return []
    # An offline CPU keeps its cpuidle directory but never idles: leave it out.
    offline_text = host.read_optional(OFFLINE) or ""
    try:
        offline = set(parse_cpulist(offline_text)) if _CPU_LIST.match(offline_text) else set()
    except ValueError:
        offline = set()
    return sorted(
        cpu for n in names if (m := _CPU_NAME.match(n)) and (cpu := int(m.group(1))) not in offline
    )


def read_state_table(host: Host, cpu: int) -> tuple[IdleState, ...]:
    """Read the idle states (name, exit latency) a CPU's driver registers."""
    states: list[IdleState] = []
    base = f"{CPU_DIR}/cpu{cpu}/cpuidle"
    # The kernel numbers states from 0 without gaps: probing by index avoids a
    # directory listing per CPU.
    for index in range(_MAX_STATES):
        name = host.read_optional(f"{base}/state{index}/name")
        if name is None:
            break
        latency = host.read_optional(f"{base}/state{index}/latency") or ""
        states.append(IdleState(index=index, name=name, latency=latency))
    return tuple(states)


def read_disable_flags(host: Host, cpu: int, count: int) -> tuple[bool, ...]:
    """Return whether each of a CPU's first ``count`` states is enabled, up to a missing one."""
    enabled: list[bool] = []
    for index in range(count):
        flag = host.read_optional(f"{CPU_DIR}/cpu{cpu}/cpuidle/state{index}/disable")
        if flag is None:
            break
        # The kernel writes 0 or 1; anything else cannot prove the state is off.
        enabled.append(flag != "1")
    return tuple(enabled)


def state_usage(host: Host, cpus: Iterable[int]) -> list[StateUse]:
    """Return every distinct idle state with the CPUs it is enabled and disabled on.

    A state's name, desc, latency and residency belong to the cpuidle driver and read
    the same under every CPU it drives; only ``disable`` is per CPU. So the table is
    read once per driver, and per CPU only the disable flags (plus the per-CPU driver
    name on kernels built to drive CPUs with several drivers; the first CPU tells).
    """
    tables: dict[str | None, tuple[IdleState, ...]] = {}
    groups: dict[tuple[str | None, tuple[bool, ...]], list[int]] = {}
    several_drivers: bool | None = None
    for cpu in cpus:
        driver = None
        if several_drivers is not False:
            driver = host.read_optional(f"{CPU_DIR}/cpu{cpu}/cpuidle/driver/name")
            if several_drivers is None:
                several_drivers = driver is not None
        table = tables.get(driver)
        if not table:
            table = tables[driver] = read_state_table(host, cpu)
        flags = read_disable_flags(host, cpu, len(table))
        if flags:
            groups.setdefault((driver, flags), []).append(cpu)
    uses: dict[tuple[int, str, int], StateUse] = {}
    for (driver, flags), members in groups.items():
        # A CPU whose flags stop early lists fewer states than its driver's table.
        for state, enabled in zip(tables[driver], flags, strict=False):
            latency = state.latency_us
            key = (state.index, state.name, -1 if latency is None else latency)
            use = uses.setdefault(key, StateUse(state, [], []))
            (use.enabled if enabled else use.disabled).extend(members)
    return [uses[key] for key in sorted(uses)]


def cstate_limits(host: Host, params: dict[str, str]) -> list[str]:
    """Describe what the kernel command line and module parameters do to C-states."""
    notes = []
    for key, (path, unlimited) in MODULE_LIMITS.items():
        if key in params:
            notes.append(f"{key}={params[key]} on the kernel command line")
            continue
        value = host.read_optional(path)
        if value is not None and value.isascii() and value.isdigit() and int(value) < unlimited:
            notes.append(f"{key} is {value}")
    if params.get("idle") == "nomwait":
        notes.append("idle=nomwait: C-states are entered without MWAIT")
    return notes


@dataclass(frozen=True)
class CstateOptions(CheckOptions):
    """Options of ``cpu.cstates``."""

    max_exit_latency_us: int = option(
        20, minimum=0, maximum=100_000,
        help="the longest exit latency (us) an enabled idle state may declare")


class CpuCstates(Check[CstateOptions]):
    """Deep CPU idle states add wake-up latency to every burst of inference work."""

    id: ClassVar[str] = "cpu.cstates"
    severity: ClassVar[Severity] = Severity.HIGH
    reads: ClassVar[tuple[str, ...]] = (
        DRIVER,
        OFFLINE,
        *(f"{CPU_DIR}/cpu*/cpuidle/state*/{name}" for name in STATE_FILES),
        f"{CPU_DIR}/cpu*/cpuidle/driver/name",
        CMDLINE,
        *(path for path, _ in MODULE_LIMITS.values()),
    )
    rationale: ClassVar[str] = (
        "Between bursts the threads that launch GPU kernels, move tokens and answer the "
        "network go idle, and cpuidle puts their cores into the deepest state it expects to "
        "pay off. Leaving C6 on Intel or C2 on AMD EPYC takes tens to hundreds of "
        "microseconds, paid on every wake-up: it shows as inter-token latency and jitter."
    )
    remedy: ClassVar[str] = (
        "Disable the states whose exit latency exceeds the limit now "
        "(cpupower idle-set -d N, or write 1 to /sys/devices/system/cpu/cpu*/cpuidle/stateN/"
        "disable) and persist it: a tuned profile (latency-performance), a systemd unit, or "
        "intel_idle.max_cstate= / processor.max_cstate= on the kernel command line."
    )
    options_type: ClassVar[type[CheckOptions]] = CstateOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {
        "latency": {"max_exit_latency_us": 2},
        "throughput": {"max_exit_latency_us": 50},
    }

    def evaluate(self, host: Host) -> Iterable[Finding]:
        limit = self.options.max_exit_latency_us
        driver = host.read_optional(DRIVER)
        params = kernel_cmdline_params(host.read_optional(CMDLINE) or "")
        idle = params.get("idle")
        notes = cstate_limits(host, params)
        note = f"; {'; '.join(notes)}" if notes else ""
        base_evidence = {"driver": driver or "", "limit_us": str(limit)}
        if idle == "poll":
            yield self.passed(
                "cpuidle",
                "idle=poll on the kernel command line: idle CPUs spin instead of entering a "
                "C-state (no exit latency, at the cost of power and of turbo headroom for "
                f"busy cores){note}",
                observed="idle=poll", expected=f"exit latency <= {limit} us",
                evidence={**base_evidence, "idle": idle},
            )
            return
        uses = state_usage(host, online_cpus(host))
        if not uses:
            yield self._without_states(driver, idle, limit, note, base_evidence)
            return
        driver = driver or "unknown"
        base_evidence["driver"] = driver
        yield from self._judge(host, uses, driver, limit, note, base_evidence)

    def _without_states(
        self, driver: str | None, idle: str | None, limit: int, note: str,
        evidence: dict[str, str],
    ) -> Finding:
        if idle == "halt":
            return self.passed(
                "cpuidle",
                f"idle=halt on the kernel command line: CPUs idle only in C1 (HLT){note}",
                observed="idle=halt", expected=f"exit latency <= {limit} us",
                evidence={**evidence, "idle": idle},
            )
        if driver is None:
            reason = f"{DRIVER} is missing: this kernel has no cpuidle, C-states cannot be read"
        elif driver == "none":
            reason = (
                "no cpuidle driver is registered (cpuidle driver 'none'): a VM without "
                "cpuidle, whose idle vCPUs halt into the hypervisor; the host's C-states "
                "decide the wake-up latency"
            )
        else:
            reason = f"cpuidle driver {driver} is registered but no CPU lists idle states"
        return self.skipped("cpuidle", reason + note, evidence=evidence)

    def _judge(
        self, host: Host, uses: list[StateUse], driver: str, limit: int, note: str,
        base_evidence: dict[str, str],
    ) -> Iterable[Finding]:
        judged_all, failed = True, False
        deepest: tuple[int, str] | None = None
        for use in uses:
            state = use.state
            latency = state.latency_us
            if not use.enabled:
                continue
            cpus = format_cpulist(use.enabled)
            if latency is None:
                yield self.skipped(
                    state.name,
                    f"state{state.index} ({state.name}) on CPUs {cpus} has an unreadable exit "
                    f"latency {state.latency!r}",
                    evidence={**base_evidence, "state": f"state{state.index}", "cpus": cpus},
                )
                judged_all = False
                continue
            if latency <= limit:
                if deepest is None or latency >= deepest[0]:
                    deepest = (latency, state.name)
                continue
            failed = True
            yield self._too_deep(host, use, latency, cpus, driver, limit, note, base_evidence)
        if failed or not judged_all:
            return
        if deepest is None:
            summary = "every idle state is disabled"
        else:
            summary = f"the deepest enabled state is {deepest[1]} ({deepest[0]} us)"
        if driver in GUEST_DRIVERS:
            summary = (
                f"cpuidle driver {driver} is a paravirtual guest driver (poll, then halt into "
                f"the hypervisor) and its states are within the {limit} us limit: {summary}"
            )
        else:
            summary = f"{summary}, within the {limit} us limit (driver {driver})"
        yield self.passed(
            "cpuidle", summary + note,
            observed=f"{deepest[0]} us" if deepest else "all disabled",
            expected=f"<= {limit} us", evidence=base_evidence,
        )

    def _too_deep(
        self, host: Host, use: StateUse, latency: int, cpus: str, driver: str, limit: int,
        note: str, base_evidence: dict[str, str],
    ) -> Finding:
        state = use.state
        directory = f"state{state.index}"
        # desc and residency are the driver's, the same on every CPU: read them once.
        sample = f"{CPU_DIR}/cpu{use.enabled[0]}/cpuidle/{directory}"
        desc = host.read_optional(f"{sample}/desc") or ""
        residency = host.read_optional(f"{sample}/residency") or ""
        partly = (
            f" (disabled on CPUs {format_cpulist(use.disabled)})" if use.disabled else ""
        )
        return self.failed(
            state.name,
            f"idle state {state.name} ({directory}, exit latency {latency} us > {limit} us) "
            f"is enabled on CPUs {cpus}{partly} (driver {driver}){note}",
            observed=f"{latency} us", expected=f"<= {limit} us",
            fix=f"cpupower -c {cpus} idle-set -d {state.index}",
            evidence={
                **base_evidence,
                "state": directory,
                "cpus": cpus,
                "latency_us": str(latency),
                "desc": desc,
                "residency_us": residency if residency.isascii() and residency.isdigit() else "",
            },
        )

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Write 1 to each too-deep state's ``disable`` file and cap the idle driver at boot."""
        remedies: list[Remedy] = []
        for finding in findings:
            ev = evidence(finding)
            state = ev.get("state", "")
            if not _STATE.fullmatch(state):
                continue
            try:
                cpus = parse_cpulist(ev.get("cpus", ""))
            except ValueError:
                continue
            steps: list[Step] = []
            for cpu in cpus:
                path = f"{CPU_DIR}/cpu{cpu}/cpuidle/{state}/disable"
                if host.exists(path):
                    steps.append(SetValue(path, "1"))
            driver = ev.get("driver", "")
            params = BOOT_PARAMS.get(driver, ())
            if not params:
                notes = (f"cpuidle driver {driver or 'unknown'!s} has no boot parameter that "
                         "caps C-states: the runtime change lasts until the next boot",)
            else:
                notes = ("max_cstate=1 keeps only C1 at boot, which may be stricter than the "
                         f"{ev.get('limit_us', '?')} us limit",)
            remedies.append(Remedy(
                check=self.id,
                subject=finding.subject,
                title=f"disable {finding.subject} ({state}) on CPUs {ev.get('cpus', '')}",
                runtime=tuple(steps),
                boot_params=params,
                notes=notes,
            ))
        return remedies
