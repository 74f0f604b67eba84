"""cpu.cstates: no enabled CPU idle state takes longer to leave than the policy allows.

A CPU in a deep C-state (C6 on Intel, C2 on AMD EPYC) needs tens to hundreds of
microseconds to wake. Every wake-up of an inference server's launch or network thread
pays that exit latency, so the deep states show up directly in token latency.

A state is judged by what it is as well as by the exit latency firmware declares:
on AMD Zen (EPYC), acpi_idle's ``C2`` entered through an ACPI I/O port (``ACPI IOPORT
0x814``) is CC6, the core power-off, whatever latency the BIOS declares (30 to 800 us
are seen). A state a PM QoS limit keeps the governor from choosing (tuned's
``force_latency``, a process holding /dev/cpu_dma_latency) is not a finding: the
cpuidle governors skip every state whose exit latency exceeds the limit
(drivers/cpuidle/governor.c ``cpuidle_governor_latency_req``, governors/menu.c).
The boot-time cap matches the idle driver: ``intel_idle.max_cstate=N`` keeps
intel_idle's first N states (drivers/idle/intel_idle.c), ``processor.max_cstate=N``
keeps acpi_idle's _CST states C1..CN (drivers/acpi/processor_idle.c
``acpi_processor_setup_cstates``) and does nothing on the ACPI LPI path (states
``LPI-n``, arm64), where a unit disables the states at every boot instead.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import bootloader, tuned
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import format_cpulist, kernel_cmdline_params, lazy_re, parse_cpulist

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

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

#: The module parameter that caps each idle driver at boot (drivers with none: see above).
CAP_PARAMS = {"intel_idle": "intel_idle.max_cstate", "acpi_idle": "processor.max_cstate"}
#: /dev/cpu_dma_latency: reading it (root) returns the CPU latency QoS limit now, a
#: native s32 in microseconds (kernel/power/qos.c ``cpu_latency_qos_read``); with no
#: request it is the default, 2000 s.
CPU_DMA_LATENCY = "/dev/cpu_dma_latency"
QOS_DEFAULT_US = 2_000_000_000
CPUINFO = "/proc/cpuinfo"
#: Deep states by what they are: (CPU vendors, first family, driver, state name, desc prefix).
KNOWN_DEEP = (
    (("AuthenticAMD", "HygonGenuine"), 0x17, "acpi_idle", "C2", "ACPI IOPORT",
     "CC6, the core power-off of AMD Zen (EPYC)"),
)
UNIT_NAME = "host-auditor-cpuidle.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
WANTS = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"

_STATE = lazy_re(r"state[0-9]+")
_CPU_NAME = lazy_re(r"^cpu([0-9]{1,5})$")
#: A kernel CPU list with no number over five digits (a garbled file must not expand
#: into billions of CPUs).
_CPU_LIST = lazy_re(r"^(?:[0-9]{1,5}(?:-[0-9]{1,5})?)(?:,[0-9]{1,5}(?:-[0-9]{1,5})?)*$")


@dataclass(frozen=True)
class IdleState:
    """One idle state of a cpuidle driver: its index, name and exit latency as read, and
    the CPU whose directory they were read under."""

    index: int
    name: str
    latency: str
    cpu: int = -1

    @property
    def latency_us(self) -> int | None:
        """Return the exit latency in microseconds, or None when garbled."""
        text = self.latency
        return int(text) if text.isascii() and text.isdigit() and len(text) < 12 else None


class StateUse(NamedTuple):
    """Where one idle state is enabled and disabled, across CPUs (lists that grow)."""

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
        states.append(IdleState(index=index, name=name, latency=latency, cpu=cpu))
    return tuple(states)


def read_flag(host: Host, cpu: int, index: int) -> bool | None:
    """Return whether a CPU's idle state ``index`` is enabled; None where it has no flag."""
    flag = host.read_optional(f"{CPU_DIR}/cpu{cpu}/cpuidle/state{index}/disable")
    # The kernel writes 0 or 1; anything else cannot prove the state is off.
    return None if flag is None else flag != "1"


class Usage(NamedTuple):
    """The idle states the drivers register, and where the ones read are enabled."""

    states: list[IdleState]
    uses: list[StateUse]


def state_usage(host: Host, cpus: Iterable[int],
                strict: Callable[[IdleState], bool]) -> Usage:
    """Return every distinct idle state, and the CPUs states are enabled and disabled on.

    A state's name, desc, latency and residency belong to the cpuidle driver and read
    the same under every CPU it drives; only ``disable`` is per CPU. So the table is
    read once per driver (plus the per-CPU driver name on kernels built to drive CPUs
    with several drivers; the first CPU tells), and per CPU only disable flags:

    - a state ``strict`` names (one that may fail: too deep, or its latency unreadable)
      on every CPU, since a finding names the CPUs it is enabled and disabled on;
    - of the others only the deepest enabled one counts (the verdict names it): they are
      read deepest first, and the first CPU found with one enabled ends the reading (on
      512 CPUs, one read instead of 512 per shallow state). A state read on every CPU
      and enabled on none lists them all as disabled.
    """
    tables: dict[str | None, tuple[IdleState, ...]] = {}
    members: dict[str | None, list[int]] = {}
    several_drivers: bool | None = None
    for cpu in cpus:
        driver = None
        if several_drivers is not False:
            driver = host.read_optional(f"{CPU_DIR}/cpu{cpu}/cpuidle/driver/name")
            if several_drivers is None:
                several_drivers = driver is not None
        if not tables.get(driver):
            tables[driver] = read_state_table(host, cpu)
        members.setdefault(driver, []).append(cpu)
    uses: dict[tuple[int, str, int], StateUse] = {}

    def use_of(state: IdleState) -> StateUse:
        latency = state.latency_us
        key = (state.index, state.name, -1 if latency is None else latency)
        return uses.setdefault(key, StateUse(state, [], []))

    for driver, on in members.items():
        table = tables[driver]
        for state in (s for s in table if strict(s)):
            for cpu in on:
                enabled = read_flag(host, cpu, state.index)
                if enabled is not None:
                    use = use_of(state)
                    (use.enabled if enabled else use.disabled).append(cpu)
        shallow = sorted((s for s in table if not strict(s)),
                         key=lambda s: (s.latency_us or 0, s.index), reverse=True)
        for state in shallow:
            disabled: list[int] = []
            for cpu in on:
                enabled = read_flag(host, cpu, state.index)
                if enabled:
                    use_of(state).enabled.append(cpu)
                    break
                if enabled is not None:
                    disabled.append(cpu)
            else:
                if disabled:
                    use_of(state).disabled.extend(disabled)
                continue
            break
    states = {(s.index, s.name, s.latency): s for table in tables.values() for s in table}
    return Usage([states[key] for key in sorted(states)], [uses[key] for key in sorted(uses)])


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


def cpu_identity(host: Host) -> tuple[str, int]:
    """Return the CPU vendor and family from /proc/cpuinfo (x86), or ("", -1)."""
    vendor, family = "", -1
    for line in where.cpuinfo(host).split("\n")[:64]:
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "vendor_id" and not vendor:
            vendor = value[:16]
        elif name == "cpu family" and family < 0 and value.isascii() and value.isdigit():
            family = int(value[:4])
        if not line.strip() and vendor:
            break
    return vendor, family


def known_deep(vendor: str, family: int, driver: str, state: IdleState,
               desc: Callable[[], str]) -> str:
    """Return what a state is when its identity makes it deep whatever its latency, or "".

    ``desc`` reads the state's description, only for a state that may be one.
    """
    for vendors, first_family, on_driver, name, prefix, what in KNOWN_DEEP:
        if (vendor in vendors and family >= first_family and driver == on_driver
                and state.name == name and desc().startswith(prefix)):
            return what
    return ""


def state_desc(host: Host, cpu: int, index: int) -> str:
    """Return a state's description: the driver's, the same on every CPU (read once)."""
    path = f"{CPU_DIR}/cpu{cpu}/cpuidle/state{index}/desc"
    return host.fact("text:" + path, lambda h: h.read_optional(path) or "")


class Identity:
    """Which states are deep by what they are (:data:`KNOWN_DEEP`), for one idle driver.

    The CPU's vendor and family are read on the first question; a state's description
    only for a state that may be one.
    """

    def __init__(self, host: Host, driver: str, judge: bool) -> None:
        self.host = host
        self.driver = driver
        self.judge = judge
        self._cpu: tuple[str, int] | None = None

    def of(self, state: IdleState) -> str:
        """Return what ``state`` is when that makes it deep whatever its latency, or ""."""
        if not self.judge:
            return ""
        if self._cpu is None:
            self._cpu = cpu_identity(self.host)
        vendor, family = self._cpu
        return known_deep(vendor, family, self.driver, state,
                          lambda: state_desc(self.host, state.cpu, state.index))


class QosLimit(NamedTuple):
    """A CPU latency QoS limit in force, and who holds it."""

    us: int
    holder: str


def force_latency_us(value: str, states: Sequence[IdleState]) -> int | None:
    """Resolve tuned's ``force_latency`` to microseconds as tuned's cpu plugin does.

    Alternatives are separated by ``|``, the first that resolves wins: a number,
    ``cstate.id:N`` or ``cstate.name:NAME`` (that state's exit latency), or
    ``cstate.id_no_zero:N`` (the same, unless it is 0).
    """
    for item in value.split("|")[:8]:
        item = item.strip()
        kind, _, arg = item.partition(":")
        if item.isascii() and item.isdigit() and len(item) < 10:
            return int(item)
        if kind in ("cstate.id", "cstate.id_no_zero") and arg.isascii() and arg.isdigit():
            found = next((s for s in states if s.index == int(arg[:4])), None)
        elif kind == "cstate.name":
            found = next((s for s in states if s.name == arg), None)
        else:
            continue
        latency = found.latency_us if found is not None else None
        if latency is None or (kind == "cstate.id_no_zero" and latency == 0):
            continue
        return latency
    return None


def qos_limit(host: Host, states: Sequence[IdleState]) -> QosLimit | None:
    """Return the CPU latency QoS limit held now, with its holder, or None.

    tuned holds one through /dev/cpu_dma_latency while its active profile sets
    ``[cpu] force_latency``. On this machine, as root, the device itself says the
    limit in force, whoever holds it.
    """
    found: list[QosLimit] = []
    state = tuned.active(host)
    if state is not None and state.force_latency is not None:
        value, path = state.force_latency
        us = force_latency_us(value, states)
        if us is not None:
            found.append(QosLimit(us, f"tuned's active profile {state.profiles_text} "
                                      f"(force_latency={value} in {path})"))
    entry = host.stat(CPU_DMA_LATENCY) if host.kind == "local" else None
    if entry is not None and entry.kind == "chr":
        try:
            raw = host.read_bytes(CPU_DMA_LATENCY, 4)
        except OSError:
            raw = b""
        if len(raw) == 4:
            us = int.from_bytes(raw, sys.byteorder, signed=True)
            if 0 <= us < QOS_DEFAULT_US and not any(q.us == us for q in found):
                found.append(QosLimit(us, f"a process holding {CPU_DMA_LATENCY} open (it reads "
                                          f"{us} us; fuser -v {CPU_DMA_LATENCY} names it)"))
    return min(found, key=lambda q: q.us) if found else None


class CstateOptions(CheckOptions):
    """Options of ``cpu.cstates``."""

    max_exit_latency_us: int = option(
        20, minimum=0, maximum=100_000,
        help="the longest exit latency (us) an enabled idle state may declare")
    judge_identity: bool = option(
        True, help="judge known deep states (AMD Zen's CC6 behind acpi_idle's C2) as too "
                   "deep whatever exit latency the firmware declares")


class CpuCstates(Check[CstateOptions]):
    """Deep CPU idle states add wake-up latency to every burst of inference work."""

    id: ClassVar[str] = "cpu.cstates"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        DRIVER,
        OFFLINE,
        *(f"{CPU_DIR}/cpu*/cpuidle/state*/{name}" for name in STATE_FILES),
        f"{CPU_DIR}/cpu*/cpuidle/driver/name",
        CMDLINE,
        *(path for path, _ in MODULE_LIMITS.values()),
        CPU_DMA_LATENCY,
        *tuned.READS,
        *bootloader.NEXT_BOOT_READS,
        # Process names: a running tuned holds its profile's latency limit.
        "/proc/[0-9]*/comm",
        *where.READS,
    )
    daemons: ClassVar[frozenset[str]] = frozenset({"tuned"})
    rationale: ClassVar[str] = (
        "Between bursts the threads that launch GPU kernels, move tokens and answer the "
        "network go idle, and cpuidle puts their cores into the deepest state it expects to "
        "pay off. Leaving C6 on Intel or C2 (CC6) on AMD EPYC takes tens to hundreds of "
        "microseconds, paid on every wake-up: it shows as inter-token latency and jitter."
    )
    remedy: ClassVar[str] = (
        "Disable the states whose exit latency exceeds the limit now "
        "(cpupower idle-set -d N, or write 1 to /sys/devices/system/cpu/cpu*/cpuidle/stateN/"
        "disable) and persist it in the idle driver's own way: intel_idle.max_cstate= for "
        "intel_idle, processor.max_cstate= for acpi_idle's C-states, a unit at boot for the "
        "ACPI LPI states of arm64; or hold a PM QoS limit (tuned's latency-performance "
        "profile, force_latency)."
    )
    options_type: ClassVar[type[CheckOptions]] = CstateOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {
        "latency": {"max_exit_latency_us": 2},
        "throughput": {"max_exit_latency_us": 50},
    }
    fix_reads: ClassVar[tuple[str, ...]] = (UNIT, WANTS)

    def evaluate(self, host: Host) -> Iterable[Finding]:
        limit = self.options.max_exit_latency_us
        driver = host.read_optional(DRIVER)
        # The running line as the shared view of the boot read it (one read of /proc/cmdline).
        params = kernel_cmdline_params(" ".join(bootloader.next_boot(host).live))
        idle = params.get("idle")
        notes = cstate_limits(host, params)
        env = where.environment(host)
        if env.in_container:
            notes.append(f"read {env.inside()}: these are the host's CPUs and "
                         "/sys is the host's, so the fix belongs on the host")
        note = f"; {'; '.join(notes)}" if notes else ""
        if env.vm:
            # The guest's own states, where it has any, still count (a vCPU pinned with
            # MWAIT passed through enters them), but the physical core is the host's.
            note += (f"; in a VM guest ({env.hypervisor}) the hypervisor host's C-states "
                     "decide how fast the physical CPU wakes: audit the host too")
        base_evidence = {"driver": driver or "", "limit_us": str(limit)}
        if not env.bare_metal:
            base_evidence["environment"] = env.describe()
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
        named = driver or "unknown"
        identity = Identity(host, named, self.options.judge_identity)

        def strict(state: IdleState) -> bool:
            """Whether the state can fail: too deep, deep by what it is, or unreadable."""
            latency = state.latency_us
            return latency is None or latency > limit or bool(identity.of(state))

        usage = state_usage(host, online_cpus(host), strict)
        if not usage.uses:
            limits = f"; {'; '.join(notes)}" if notes else ""
            yield self._without_states(driver, idle, limit, limits, base_evidence, env)
            return
        base_evidence["driver"] = named
        yield from self._judge(host, usage, identity, named, limit, note, base_evidence)

    def _without_states(
        self, driver: str | None, idle: str | None, limit: int, note: str,
        evidence: dict[str, str], env: where.Environment,
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
            guest = f"a VM guest ({env.hypervisor})" if env.vm else "a VM guest"
            reason = (
                f"no cpuidle driver is registered (cpuidle driver 'none'): {guest} without "
                "cpuidle, whose idle vCPUs halt into the hypervisor; the hypervisor host's "
                "C-states decide the wake-up latency, so audit the host"
            )
        else:
            reason = f"cpuidle driver {driver} is registered but no CPU lists idle states"
        return self.skipped("cpuidle", reason + note, evidence=evidence)

    def _judge(
        self, host: Host, usage: Usage, identity: Identity, driver: str, limit: int,
        note: str, base_evidence: dict[str, str],
    ) -> Iterable[Finding]:
        judged_all, failed = True, False
        deepest: tuple[int, str] | None = None
        qos = qos_limit(host, usage.states)
        blocked: list[str] = []
        for use in usage.uses:
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
            what = identity.of(state)
            if latency <= limit and not what:
                if deepest is None or latency >= deepest[0]:
                    deepest = (latency, state.name)
                continue
            if qos is not None and latency > qos.us:
                # The governors never pick a state whose exit latency exceeds the limit.
                blocked.append(f"{state.name} ({latency} us)")
                continue
            failed = True
            yield self._too_deep(host, use, latency, cpus, driver, limit, note, base_evidence,
                                 what)
        if failed or not judged_all:
            return
        if deepest is None:
            summary = "every idle state is disabled"
        else:
            summary = f"the deepest enabled state is {deepest[1]} ({deepest[0]} us)"
        evidence = dict(base_evidence)
        if driver in GUEST_DRIVERS:
            summary = (
                f"cpuidle driver {driver} is a paravirtual guest driver (poll, then halt into "
                f"the hypervisor) and its states are within the {limit} us limit: {summary}"
            )
        else:
            summary = f"{summary}, within the {limit} us limit (driver {driver})"
        if blocked and qos is not None:
            summary = (f"{summary}; {', '.join(blocked)} is enabled but never entered: "
                       f"{qos.holder} holds a CPU latency limit of {qos.us} us, and cpuidle "
                       "picks no state whose exit latency exceeds it")
            evidence["qos_us"] = str(qos.us)
            evidence["qos_holder"] = qos.holder
        yield self.passed(
            "cpuidle", summary + note,
            observed=f"{deepest[0]} us" if deepest else "all disabled",
            expected=f"<= {limit} us", evidence=evidence,
        )

    def _too_deep(
        self, host: Host, use: StateUse, latency: int, cpus: str, driver: str, limit: int,
        note: str, base_evidence: dict[str, str], identity: str,
    ) -> Finding:
        state = use.state
        directory = f"state{state.index}"
        # desc and residency are the driver's, the same on every CPU: read them once.
        sample = f"{CPU_DIR}/cpu{use.enabled[0]}/cpuidle/{directory}"
        desc = state_desc(host, use.enabled[0], state.index)
        residency = host.read_optional(f"{sample}/residency") or ""
        partly = (
            f" (disabled on CPUs {format_cpulist(use.disabled)})" if use.disabled else ""
        )
        if identity and latency <= limit:
            what = (f"idle state {state.name} ({directory}, {desc}) is {identity}, whatever "
                    f"the {latency} us exit latency the firmware declares")
            observed = f"{state.name} = {identity.split(',')[0]}"
        else:
            what = (f"idle state {state.name} ({directory}, exit latency {latency} us > "
                    f"{limit} us)")
            if identity:
                what += f" is {identity}"
            observed = f"{latency} us"
        evidence = {
            **base_evidence,
            "state": directory,
            "cpus": cpus,
            "latency_us": str(latency),
            "desc": desc,
            "residency_us": residency if residency.isascii() and residency.isdigit() else "",
        }
        if identity:
            evidence["identity"] = identity
        waiting = ""
        cap = next_boot_cap(host, driver)
        if cap is not None and cap_excludes(driver, cap[0], state):
            # The same next boot boot.cmdline reads: the cap is written, not yet booted.
            evidence["next_boot_cap"] = f"{CAP_PARAMS[driver]}={cap[0]}"
            evidence.update(bootloader.next_boot(host).evidence())
            waiting = (f"; {CAP_PARAMS[driver]}={cap[0]} is configured for the next boot "
                       f"({cap[1]}), which leaves {state.name} out: pending a reboot")
        return self.failed(
            state.name,
            f"{what}; it is enabled on CPUs {cpus}{partly} (driver {driver}){note}{waiting}",
            observed=observed, expected=f"<= {limit} us",
            fix=(("on the host: " if "environment" in base_evidence
                  and "container" in base_evidence["environment"] else "")
                 + f"cpupower -c {cpus} idle-set -d {state.index}"),
            evidence=evidence,
        )


    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Disable each too-deep state now, and at boot in the idle driver's own way."""
        from auditor.remedy import MakeSymlink, Remedy, RunCommand, SetValue, WriteFile, evidence
        env = where.environment(host)
        if env.in_container:
            return self.advice_on_the_host(findings, env.describe(),
                                           "disable {subject} on the host")
        remedies: list[Remedy] = []
        first_failing: dict[str, tuple[int, str]] = {}
        unit_states: set[int] = set()
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
            index = int(state.removeprefix("state"))
            notes: tuple[str, ...]
            if ev.get("next_boot_cap"):
                notes = (f"{ev['next_boot_cap']} is configured for the next boot and leaves "
                         "this state out: pending a reboot",)
            elif driver in CAP_PARAMS and not finding.subject.startswith("LPI-"):
                if driver not in first_failing or index < first_failing[driver][0]:
                    first_failing[driver] = (index, finding.subject)
                notes = ()
            else:
                unit_states.add(index)
                why = ("processor.max_cstate does nothing on the ACPI LPI path"
                       if finding.subject.startswith("LPI-") else
                       f"cpuidle driver {driver or 'unknown'!s} has no boot parameter that "
                       "caps C-states")
                notes = (f"{why}: a unit disables the state at every boot",)
            remedies.append(Remedy(
                check=self.id,
                subject=finding.subject,
                title=f"disable {finding.subject} ({state}) on CPUs {ev.get('cpus', '')}",
                runtime=tuple(steps),
                notes=notes,
            ))
        for driver, (index, name) in first_failing.items():
            cap = _cap(driver, index, name)
            if cap is None:
                continue
            param, kept = cap
            remedies.append(Remedy(
                check=self.id, subject="boot",
                title=f"cap {driver} at boot ({param})",
                boot_params=(param,),
                notes=(f"{param} keeps {kept} at boot: {name} and deeper are not registered",),
            ))
        if unit_states:
            remedies.append(Remedy(
                check=self.id, subject="boot",
                title="disable the deep idle states at every boot",
                persistent=(
                    WriteFile(UNIT, unit_text(sorted(unit_states))),
                    MakeSymlink(WANTS, UNIT),
                    RunCommand(("systemctl", "daemon-reload"), after=(0,),
                               undo=("systemctl", "daemon-reload"), optional=True),
                ),
            ))
        return remedies


def next_boot_cap(host: Host, driver: str) -> tuple[int, str] | None:
    """Return the cap of ``driver`` that the next boot's line sets and the running one does
    not (its value and where it is written), or None."""
    key = CAP_PARAMS.get(driver)
    if key is None:
        return None
    nxt = bootloader.next_boot(host)
    value = nxt.configured_value(key) if nxt.known else None
    if value is None or not value.isdigit() or len(value) > 2:
        return None
    token = f"{key}={value}"
    if not nxt.pending(token):
        return None
    return int(value), nxt.source(token) or nxt.describe()


def cap_excludes(driver: str, cap: int, state: IdleState) -> bool:
    """Return whether a boot cap of ``driver`` leaves the state out (see :func:`_cap`)."""
    if driver == "intel_idle":
        return cap >= 1 and state.index > cap
    match = re.fullmatch(r"C([0-9]{1,2})", state.name)
    return match is not None and int(match.group(1)) > max(1, cap)


def _cap(driver: str, index: int, name: str) -> tuple[str, str] | None:
    """Return the boot parameter that keeps only the states shallower than state ``index``.

    intel_idle.max_cstate=N keeps the first N entries of intel_idle's table (state1..N;
    skipped table entries count too, so N=index-1 never keeps a deeper state); 0 would
    turn intel_idle off and hand the CPUs to acpi_idle, so N is at least 1.
    processor.max_cstate=N keeps acpi_idle's C1..CN, named after their _CST index
    (``C%d``), with 0 read as 1.
    """
    if driver == "intel_idle":
        keep = max(1, index - 1)
        return f"intel_idle.max_cstate={keep}", f"intel_idle's first {keep} state(s)"
    if driver == "acpi_idle":
        match = re.fullmatch(r"C([0-9]{1,2})", name)
        if match is None:
            return None
        keep = max(1, int(match.group(1)) - 1)
        return f"processor.max_cstate={keep}", f"C1..C{keep}"
    return None


def unit_text(states: Sequence[int]) -> str:
    """Return the systemd unit that disables the given idle states on every CPU at boot."""
    loops = " ".join(
        f"for f in {CPU_DIR}/cpu[0-9]*/cpuidle/state{index}/disable; do echo 1 > \"$$f\"; "
        "done;" for index in states)
    # systemd expands $VAR in ExecStart: $$ is a literal dollar for the shell.
    return (
        "# Written by host-auditor: idle states too deep for inference, disabled at boot.\n"
        "[Unit]\n"
        "Description=Disable deep CPU idle states (host-auditor)\n"
        "After=sysinit.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart=/bin/sh -c '{loops} true'\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
