"""lxc.device_majors: LXC containers whose device allow-list names a GPU driver's old major.

``nvidia-uvm``, ``nvidia-caps`` and the other NVIDIA helper drivers get a dynamic
character major at module load; it can change with every boot or driver update.
A container config that bind-mounts ``/dev/nvidia-uvm`` and allows
``c 509:* rwm`` keeps working until the major moves, then CUDA fails inside the
container with "no CUDA-capable device". The check compares each container's
running config (the main section) with the majors the driver has now.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib.lxc_config import (
    ALLOW_KEYS,
    DENY_KEYS,
    MOUNT_KEY,
    PLAIN_LXC_GLOB,
    PROC_CGROUP,
    PROC_DEVICES,
    PVE_ROOT,
    CgroupMode,
    ConfigLine,
    Container,
    DeviceRule,
    Flavour,
    MainSection,
    cgroup_mode,
    find_containers,
    format_line,
    is_dev_key,
    listdir,
    parse_dev_entry,
    parse_device_rule,
    parse_main_section,
    parse_mount_entry,
    parse_proc_devices,
)
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.remediations.steps import (
    Advice,
    FixContext,
    InsertLine,
    Remedy,
    ReplaceLine,
    Step,
    evidence,
)

#: Drivers whose character major never moves.
FIXED_MAJORS = {"nvidia": 195, "nvidiactl": 195, "drm": 226}
NEED = frozenset("rw")  # opening a GPU node for CUDA needs read and write

#: Device node paths -> (driver name in /proc/devices, minor by naming convention).
_NODE_PATTERNS: tuple[tuple[re.Pattern[str], str, int | None], ...] = (
    (re.compile(r"/dev/nvidia([0-9]+)"), "nvidia", None),
    (re.compile(r"/dev/nvidiactl"), "nvidiactl", 255),
    (re.compile(r"/dev/nvidia-modeset"), "nvidia", 254),
    (re.compile(r"/dev/nvidia-uvm"), "nvidia-uvm", 0),
    (re.compile(r"/dev/nvidia-uvm-tools"), "nvidia-uvm", 1),
    (re.compile(r"/dev/nvidia-caps-imex-channels(?:/channel([0-9]+)|/.*)?"),
     "nvidia-caps-imex-channels", None),
    (re.compile(r"/dev/nvidia-caps(?:/nvidia-cap([0-9]+)|/.*)?"), "nvidia-caps", None),
    (re.compile(r"/dev/nvidia-nvswitchctl"), "nvidia-nvswitch", 255),
    (re.compile(r"/dev/nvidia-nvswitch([0-9]*)"), "nvidia-nvswitch", None),
    (re.compile(r"/dev/nvidia-nvlink.*"), "nvidia-nvlink", None),
    (re.compile(r"/dev/dri(?:/(?:card|renderD|controlD)([0-9]+)|/.*)?"), "drm", None),
)

#: Directories of GPU nodes that a config may bind whole.
_NODE_DIRS = frozenset({"/dev/dri", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels"})


@dataclass(frozen=True)
class GpuNode:
    """A GPU device node a container gets, with the numbers it has on the host now."""

    path: str
    driver: str
    major: int | None
    minor: int | None
    #: Where the major came from: the node itself, /proc/devices, or a fixed number.
    source: str


@dataclass(frozen=True)
class Rule:
    """A device cgroup rule of a container, with the line that sets it."""

    allow: bool
    rule: DeviceRule
    line: ConfigLine


def node_driver(path: str) -> tuple[str, int | None] | None:
    """Return (driver name, minor by convention) of a GPU device path, or None."""
    for pattern, driver, minor in _NODE_PATTERNS:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if minor is None and match.groups() and match.group(1):
            digits = match.group(1)
            minor = int(digits) if len(digits) < 9 else None
        return driver, minor
    return None


def allows(rules: Sequence[Rule], major: int, minor: int | None) -> bool:
    """Return whether the rules let a container open character device major:minor rw.

    Follows the kernel's devices controller (which LXC's cgroup2 program mirrors):
    the list starts as deny-all (LXC's common.conf and every Proxmox container
    begin with ``devices.deny = a``); ``a`` switches the default and clears the
    exceptions; a rule against the default adds an exception, a rule with it
    takes access away from the exceptions for exactly that device.
    """
    default_allow = False
    exceptions: list[tuple[str, int | None, int | None, frozenset[str]]] = []
    for item in rules:
        rule = item.rule
        if rule.type == "a":
            default_allow = item.allow
            exceptions = []
        elif item.allow != default_allow:
            exceptions.append((rule.type, rule.major, rule.minor, rule.access))
        else:
            exceptions = [
                (t, ma, mi, acc - rule.access if (t, ma, mi) == (rule.type, rule.major,
                                                               rule.minor) else acc)
                for t, ma, mi, acc in exceptions
            ]

    def covers(ex_major: int | None, ex_minor: int | None) -> bool:
        return (ex_major is None or ex_major == major) and (
            ex_minor is None or minor is None or ex_minor == minor
        )

    if default_allow:
        return not any(t == "c" and covers(ma, mi) and acc & NEED
                       for t, ma, mi, acc in exceptions)
    return any(t == "c" and covers(ma, mi) and NEED <= acc for t, ma, mi, acc in exceptions)


class LxcDeviceMajors(Check[CheckOptions]):
    """LXC containers must allow the GPU drivers' current device majors."""

    id: ClassVar[str] = "lxc.device_majors"
    severity: ClassVar[Severity] = Severity.CRITICAL
    reads: ClassVar[tuple[str, ...]] = (
        PROC_DEVICES,
        PROC_CGROUP,
        "/etc/hostname",
        f"{PVE_ROOT}/lxc",
        f"{PVE_ROOT}/lxc/*.conf",
        f"{PVE_ROOT}/local",
        f"{PVE_ROOT}/local/lxc/*.conf",
        f"{PVE_ROOT}/nodes/*/lxc/*.conf",
        PLAIN_LXC_GLOB,
        "/dev/nvidia*",
        "/dev/nvidia-caps/*",
        "/dev/nvidia-caps-imex-channels/*",
        "/dev/dri",
        "/dev/dri/*",
    )
    rationale: ClassVar[str] = (
        "nvidia-uvm and nvidia-caps get a dynamic character major when the module loads, and "
        "it can change after a reboot into a new kernel or driver. A container that bind-mounts "
        "/dev/nvidia-uvm but whose lxc.cgroup2.devices.allow still names the old major cannot "
        "open the node: CUDA reports no device inside the container while nvidia-smi, which "
        "needs only /dev/nvidia0 and /dev/nvidiactl at the fixed major 195, still works."
    )
    remedy: ClassVar[str] = (
        "Rewrite the stale allow line to the major in /proc/devices (for example "
        "'lxc.cgroup2.devices.allow: c 238:* rwm') in the main section of the container's "
        "config and restart the container. On Proxmox the lasting fix is to pass the nodes "
        "as 'devN: /dev/nvidia-uvm' entries, which are allowed at the live major on every start."
    )

    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.GPU_NODE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        containers, note = find_containers(host)
        if note:
            yield self.skipped("lxc", note)
        if not containers:
            if not note:
                yield self.skipped("lxc", "no LXC containers")
            return
        devices_text = host.read_optional(PROC_DEVICES)
        drivers = parse_proc_devices(devices_text or "")
        mode = cgroup_mode(host.read_optional(PROC_CGROUP))
        for container in containers:
            yield from self._judge(host, container, drivers, mode, devices_text is not None)

    # -- one container ---------------------------------------------------------------

    def _judge(
        self,
        host: Host,
        container: Container,
        drivers: dict[str, list[int]],
        mode: CgroupMode,
        have_proc_devices: bool,
    ) -> Iterator[Finding]:
        base = {"config": container.path, "flavour": container.flavour}
        entry = host.stat(container.path)
        if entry is None or entry.kind != "file":
            # A FIFO or device named config would block or never end: read files only.
            kind = "missing" if entry is None else f"a {entry.kind}, not a file"
            yield self.skipped(container.id, f"cannot read {container.path}: {kind}",
                               evidence=base)
            return
        try:
            text = host.read_text(container.path)
        except OSError as exc:
            yield self.skipped(container.id, f"cannot read {container.path}: {exc}",
                               evidence=base)
            return
        section = parse_main_section(text, container.flavour)
        passed_through = _dev_entries(section) if container.flavour == "proxmox" else []
        mounted = [n for n in self._mounted_nodes(host, section, drivers)
                   if n.path not in {p.path for p in passed_through}]
        if not mounted and not passed_through:
            yield self.passed(container.id, "no GPU device nodes are mounted or passed through",
                              evidence=base)
            return
        rules, ignored = _effective_rules(section, mode)
        unrestricted = container.flavour == "lxc" and not _restricts(section)
        failing: list[GpuNode] = []
        for node in mounted:
            if node.major is None:
                why = (f"{PROC_DEVICES} has no {node.driver!r} line (module not loaded?)"
                       if have_proc_devices else f"{PROC_DEVICES} is unreadable")
                yield self.skipped(
                    container.id,
                    f"cannot judge {node.path}: its current major is unknown, {why}",
                    evidence={**base, "device": node.path, "driver_name": node.driver},
                )
            elif not unrestricted and not allows(rules, node.major, node.minor):
                failing.append(node)
        if failing:
            yield from self._failures(container, section, failing, mounted, rules, ignored,
                                      drivers, mode)
            return
        if any(n.major is None for n in mounted):
            return
        yield self._pass(container, mounted, passed_through, unrestricted, base)

    def _pass(self, container: Container, mounted: list[GpuNode],
              passed_through: list[GpuNode], unrestricted: bool,
              base: dict[str, str]) -> Finding:
        parts: list[str] = []
        if mounted:
            majors = ", ".join(sorted({f"{n.driver} {n.major}" for n in mounted}))
            verb = ("are not restricted (no device rules and no lxc.include)" if unrestricted
                    else "are allowed at their current majors")
            parts.append(f"{len(mounted)} bind-mounted GPU nodes {verb} ({majors})")
        if passed_through:
            parts.append(
                f"{len(passed_through)} GPU nodes are passed through as devN entries, which "
                "Proxmox allows at the live major on every start (the lasting fix)"
            )
        return self.passed(
            container.id, "; ".join(parts),
            evidence={**base, "devices": " ".join(n.path for n in [*mounted, *passed_through])},
        )

    def _mounted_nodes(self, host: Host, section: MainSection,
                       drivers: dict[str, list[int]]) -> list[GpuNode]:
        nodes: dict[str, GpuNode] = {}
        for line in section.entries(MOUNT_KEY):
            entry = parse_mount_entry(line.value or "")
            if entry is None or not entry.is_bind or not entry.source.startswith("/dev/"):
                continue
            source = posixpath.normpath(entry.source)
            for node in _expand(host, source, drivers):
                nodes.setdefault(node.path, node)
        return list(nodes.values())

    def _failures(
        self,
        container: Container,
        section: MainSection,
        failing: list[GpuNode],
        mounted: list[GpuNode],
        rules: list[Rule],
        ignored: list[ConfigLine],
        drivers: dict[str, list[int]],
        mode: CgroupMode,
    ) -> Iterator[Finding]:
        stale = _stale_rules(failing, mounted, rules, drivers)
        for node in failing:
            assert node.major is not None
            candidates = stale.get(node.path, [])
            majors = sorted({r.rule.major for r in candidates if r.rule.major is not None})
            chosen = candidates[0] if len(majors) == 1 else None
            allow_key = _allow_key(section, mode, chosen)
            wanted = f"c {node.major}:* rwm"
            if chosen is not None:
                rule_text = chosen.line.text.strip()
                message = (
                    f"{node.path} ({node.driver}) has major {node.major} now, but the config "
                    f"allows the old major {chosen.rule.major}: {rule_text}"
                )
                fix = (f"in {container.path} change {rule_text!r} to allow "
                       f"'{chosen.rule.format(node.major)}', then restart the container")
            else:
                rule_text = ""
                stale_note = (f"; stale majors it allows: {' '.join(map(str, majors))}"
                              if majors else "")
                message = (f"{node.path} ({node.driver}) has major {node.major} now and no "
                           f"rule of the config allows it{stale_note}")
                fix = (f"add '{allow_key}: {wanted}' to the main section of {container.path}, "
                       "then restart the container")
            if ignored:
                message += (f"; {len(ignored)} lxc.cgroup.devices lines are ignored on this "
                            "pure cgroup2 host")
            if container.flavour == "proxmox":
                fix += ("; lasting: pass each node in it as a devN entry"
                        if node.path in _NODE_DIRS
                        else f"; lasting: pass it as a devN entry ('devN: {node.path}')")
            evidence = {
                "config": container.path,
                "flavour": container.flavour,
                "device": node.path,
                "driver_name": node.driver,
                "allowed_major": " ".join(map(str, majors)),
                "current_major": str(node.major),
                "rule": rule_text,
                "rule_line": str(chosen.line.number) if chosen is not None else "",
                "allow_key": allow_key,
                "major_source": node.source,
            }
            yield self.failed(
                container.id, message,
                observed=(f"allows c {' '.join(map(str, majors))}" if majors
                          else "no allow rule for it"),
                expected=wanted, fix=fix, evidence=evidence,
            )


    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Point each stale allow rule at the device's current major; advise a restart."""
        remedies: list[Remedy] = []
        planned: dict[tuple[str, int], str] = {}
        inserted: set[tuple[str, str]] = set()
        for finding in findings:
            ev = evidence(finding)
            config, rule = ev.get("config", ""), ev.get("rule", "").strip()
            stale, current = ev.get("allowed_major", ""), ev.get("current_major", "")
            flavour: Flavour = "proxmox" if ev.get("flavour") == "proxmox" else "lxc"
            if not (config.startswith("/") and current.isdigit()):
                continue
            try:
                text = host.read_text(config)
            except OSError:
                continue
            real = host.resolve(config)
            section = parse_main_section(text, flavour)
            notes: list[str] = []
            steps: list[Step] = []
            if rule and stale.isdigit():
                for line in section.entries(*ALLOW_KEYS):
                    new = _with_major(line, int(stale), current)
                    if new is None or line.text.strip() != rule or "\ufffd" in line.text:
                        continue
                    if planned.get((real, line.number), new) != new:
                        notes.append(f"line {line.number} also serves another device: add an "
                                     f"allow rule for {ev.get('device', '')} (major {current}) "
                                     "by hand")
                        continue
                    if (real, line.number) not in planned:
                        planned[(real, line.number)] = new
                        steps.append(ReplaceLine(real, line.number, line.text, new))
            if not rule:
                # No single stale rule to rewrite: add one for the current major.
                key = ev.get("allow_key", "")
                if key not in ALLOW_KEYS:
                    key = ALLOW_KEYS[0]
                added = format_line(key, f"c {current}:* rwm", flavour)
                last = next((line for line in reversed(section.lines) if line.text.strip()),
                            None)
                after, anchor = (last.number, last.text) if last is not None else (0, "")
                if (real, added) not in inserted and "\ufffd" not in anchor:
                    inserted.add((real, added))
                    steps.append(InsertLine(real, after, anchor, added))
            container = finding.subject
            advice: list[Advice] = []
            if _CONTAINER.fullmatch(container):
                advice.append(Advice(f"restart container {container} to apply the new rule",
                                     restart_command(flavour, container)))
            else:
                advice.append(Advice("restart the container to apply the new rule"))
            if flavour == "proxmox":
                notes.append("on Proxmox VE 8.1+, devN: entries (dev0: /dev/nvidia-uvm) pass "
                             "the device with its current numbers at every start: the lasting "
                             "fix")
            remedies.append(Remedy(
                check=self.id,
                subject=container,
                title=f"allow {ev.get('device', 'the device')} by its current major {current}"
                      + (f" (was {stale})" if stale else ""),
                persistent=tuple(steps),
                notes=tuple(notes),
                advice=tuple(advice),
            ))
        return remedies


_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: The type and major at the start of a device rule's value (``c 509:* rwm``).
_RULE_MAJOR = re.compile(r"[cb]\s+([0-9]+)(?=:)")


def restart_command(flavour: str, container: str) -> tuple[str, ...]:
    """Return the command that restarts a container so it picks up its config."""
    if flavour == "proxmox":
        return ("pct", "reboot", container)
    return ("lxc-stop", "-n", container, "-r")


def _with_major(line: ConfigLine, stale: int, current: str) -> str | None:
    """Return an allow line naming ``stale`` as its major, with ``current`` instead; or None."""
    match = _RULE_MAJOR.match(line.value or "")
    if match is None or int(match.group(1)) != stale:
        return None
    value = line.value or ""
    return line.with_value(value[: match.start(1)] + current + value[match.end(1):])


def _dev_entries(section: MainSection) -> list[GpuNode]:
    nodes: list[GpuNode] = []
    for line in section.lines:
        if line.key is None or not is_dev_key(line.key):
            continue
        path = parse_dev_entry(line.value or "")
        if path is None:
            continue
        path = posixpath.normpath(path)
        mapped = node_driver(path)
        if mapped is not None:
            nodes.append(GpuNode(path, mapped[0], None, mapped[1], "devN entry"))
    return nodes


def _expand(host: Host, source: str, drivers: dict[str, list[int]]) -> list[GpuNode]:
    mapped = node_driver(source)
    if mapped is None:
        return []
    driver, minor = mapped
    if host.is_dir(source):
        # A bind of /dev/dri or /dev/nvidia-caps brings every node inside it.
        found: list[GpuNode] = []
        for name in listdir(host, source):
            numbers = host.device_numbers(posixpath.join(source, name))
            if numbers is not None:
                found.append(GpuNode(posixpath.join(source, name), driver, numbers[0],
                                     numbers[1], "device node"))
        if found:
            return found
        minor = None
    numbers = host.device_numbers(source)
    if numbers is not None:
        return [GpuNode(source, driver, numbers[0], numbers[1], "device node")]
    if driver in drivers:
        return [GpuNode(source, driver, drivers[driver][0], minor, PROC_DEVICES)]
    if driver in FIXED_MAJORS:
        return [GpuNode(source, driver, FIXED_MAJORS[driver], minor, "fixed major")]
    return [GpuNode(source, driver, None, minor, "")]


def _effective_rules(section: MainSection, mode: CgroupMode) -> tuple[list[Rule], list[ConfigLine]]:
    """Return the device rules LXC applies on this host, and the lines it ignores."""
    # With a v1 devices controller (hybrid layouts) LXC may apply both families, so
    # anything but a pure cgroup2 host reads them together, in file order.
    keys = {ALLOW_KEYS[0], DENY_KEYS[0]} if mode == "v2" else {*ALLOW_KEYS, *DENY_KEYS}
    rules: list[Rule] = []
    ignored: list[ConfigLine] = []
    for line in section.entries(*ALLOW_KEYS, *DENY_KEYS):
        if line.key not in keys:
            if mode == "v2":
                ignored.append(line)
            continue
        parsed = parse_device_rule(line.value or "")
        if parsed is not None:
            rules.append(Rule(line.key in ALLOW_KEYS, parsed, line))
    return rules, ignored


def _restricts(section: MainSection) -> bool:
    # A plain LXC config with no include and no device rule sets no device cgroup at all.
    return bool(section.entries("lxc.include", *ALLOW_KEYS, *DENY_KEYS))


def _allow_key(section: MainSection, mode: CgroupMode, chosen: Rule | None) -> str:
    if chosen is not None and chosen.line.key is not None:
        return chosen.line.key
    if mode == "v2":
        return ALLOW_KEYS[0]
    if mode == "v1":
        return ALLOW_KEYS[1]
    if not section.entries(ALLOW_KEYS[0]) and section.entries(ALLOW_KEYS[1]):
        return ALLOW_KEYS[1]
    return ALLOW_KEYS[0]


def _stale_rules(
    failing: list[GpuNode],
    mounted: list[GpuNode],
    rules: list[Rule],
    drivers: dict[str, list[int]],
) -> dict[str, list[Rule]]:
    """Pair each failing node with the allow rules that most likely named its old major.

    A candidate is a character allow rule with a concrete major that lets rw through,
    allows none of the container's GPU nodes as they are now, and whose major is not a
    fixed GPU major nor one any driver holds now (``c 10:200`` is tun, and a rule for the
    current nvidia-caps major is current even when no nvidia-caps node is mounted). Its
    minor must fit the node's (``c 509:1`` is uvm-tools'). When the candidates name
    several majors, the failing drivers and the stale majors are
    paired in order: dynamic majors are handed out in the same order at every load.
    """
    other_majors = {m for ms in drivers.values() for m in ms} | set(FIXED_MAJORS.values())
    live = [(n.major, n.minor) for n in mounted if n.major is not None]
    pool = [
        r for r in rules
        if r.allow and r.rule.type == "c" and r.rule.major is not None
        and NEED <= r.rule.access and r.rule.major not in other_majors
        and not any(r.rule.major == ma and (r.rule.minor is None or mi is None
                                            or r.rule.minor == mi) for ma, mi in live)
    ]
    per_node: dict[str, list[Rule]] = {}
    for node in failing:
        # A fixed major never goes stale: a missing 195 or 226 rule is only missing.
        per_node[node.path] = [] if node.driver in FIXED_MAJORS else [
            r for r in pool
            if r.rule.minor is None or node.minor is None or r.rule.minor == node.minor
        ]
    stale_majors = sorted({r.rule.major for rs in per_node.values() for r in rs
                           if r.rule.major is not None})
    failing_drivers = sorted({(n.major or 0, n.driver) for n in failing
                              if n.driver not in FIXED_MAJORS})
    if len(stale_majors) > 1 and len(stale_majors) == len(failing_drivers):
        paired = {driver: major for (_, driver), major in zip(failing_drivers, stale_majors,
                                                                   strict=True)}
        for node in failing:
            narrowed = [r for r in per_node[node.path] if r.rule.major == paired.get(node.driver)]
            if narrowed:
                per_node[node.path] = narrowed
    for path, candidates in per_node.items():
        # The line naming the node's own minor is the one to rewrite first.
        node = next(n for n in failing if n.path == path)
        candidates.sort(key=lambda r: r.rule.minor is None or r.rule.minor != node.minor)
    return per_node
