"""The device-rule semantics of LXC containers: which GPU device nodes a container's
rules let it open, under each cgroup's rules.

A container's ``lxc.cgroup.devices.*`` (cgroup v1: the kernel's device_cgroup list) and
``lxc.cgroup2.devices.*`` (cgroup v2: the BPF program LXC's cgfsng builds) rules are read
by :mod:`auditor.checks.lib.lxc_config`; this module answers, for a GPU device node, what
those rules mean, as the kernel and LXC apply them. ``lxc.device_majors`` judges with it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from auditor.checks.lib.lxc_config import ConfigLine, DeviceRule, Entry, Loaded

#: Drivers whose character major never moves.
FIXED_MAJORS = {"nvidia": 195, "nvidiactl": 195, "drm": 226}
#: The character majors the kernel hands out dynamically: 254 down to 234, then 511 down
#: to 384 (fs/char_dev.c ``find_dynamic_major``: CHRDEV_MAJOR_DYN_END,
#: CHRDEV_MAJOR_DYN_EXT_START/END). Only a rule naming one of these can be a stale one.
DYNAMIC_MAJORS = frozenset(range(234, 255)) | frozenset(range(384, 512))
NEED = frozenset("rw")  # opening a GPU node for CUDA or ROCm needs read and write


@functools.cache
def _node_patterns() -> tuple[tuple[re.Pattern[str], str, int | None], ...]:
    """Return device node paths -> (driver name in /proc/devices, minor by naming convention).

    Compiled on first use: most hosts have no container to look at.
    """
    return (
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
        # AMD: ROCm opens /dev/kfd (a dynamic major, like nvidia-uvm) and a render node.
        (re.compile(r"/dev/kfd"), "kfd", 0),
        (re.compile(r"/dev/dri(?:/(?:card|renderD|controlD)([0-9]+)|/.*)?"), "drm", None),
    )


Semantics = Literal["bpf", "kernel", "list"]


class GpuNode(NamedTuple):
    """A GPU device node a container gets, with the numbers it has on the host now."""

    path: str
    driver: str
    major: int | None
    minor: int | None
    #: Where the major came from: the node itself, /proc/devices, or a fixed number.
    source: str
    #: How the container gets it: ``mount``, ``devN`` or ``hook``.
    via: str = "mount"


class Rule(NamedTuple):
    """A device cgroup rule of a container, with the line that sets it."""

    allow: bool
    rule: DeviceRule
    line: ConfigLine
    #: The file the rule is written in ("" when Proxmox generates it or LXC ships it).
    path: str = ""
    #: Where it comes from, for a report (``/etc/lxc/gpu.conf:3``, ``dev0 in ...``).
    origin: str = ""


@dataclass
class View:
    """One reading of what a container gets: its config for the next start, or its run."""

    #: ``config`` (what the next start gives) or ``running`` (what it runs with now).
    label: str
    #: The file (or cgroup list) it was read from.
    source: str
    rules: list[Rule]
    semantics: Semantics
    nodes: list[GpuNode]
    #: Legacy cgroup v1 lines that LXC ignores on this pure cgroup2 host.
    ignored: list[ConfigLine] = field(default_factory=list)
    loaded: Loaded = field(default_factory=Loaded)
    #: The nvidia hook line, where the hook hands GPUs to the container.
    hook: Entry | None = None
    unprivileged: bool = False


def node_driver(path: str) -> tuple[str, int | None] | None:
    """Return (driver name, minor by convention) of a GPU device path, or None."""
    for pattern, driver, minor in _node_patterns():
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if minor is None and match.groups() and match.group(1):
            digits = match.group(1)
            minor = int(digits) if len(digits) < 9 else None
        return driver, minor
    return None


def _covers(ex_major: int | None, ex_minor: int | None, major: int, minor: int | None) -> bool:
    return (ex_major is None or ex_major == major) and (
        ex_minor is None or minor is None or ex_minor == minor)


def allows(rules: Sequence[Rule], major: int, minor: int | None, *,
           start_allow: bool = False) -> bool:
    """Return whether the rules let a container open character device major:minor rw.

    The kernel's cgroup v1 devices controller (security/device_cgroup.c): a group
    starts with its parent's behaviour (``start_allow``; the root allows all, and
    LXC's common.conf and every Proxmox container begin with ``devices.deny = a``);
    a rule whose value starts with ``a`` switches the default and clears the
    exceptions; a rule against the default adds an exception, a rule with it takes
    access away from the exceptions for exactly that device.
    """
    default_allow = start_allow
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
    if default_allow:
        return not any(t == "c" and _covers(ma, mi, major, minor) and acc & NEED
                       for t, ma, mi, acc in exceptions)
    return any(t == "c" and _covers(ma, mi, major, minor) and NEED <= acc
               for t, ma, mi, acc in exceptions)


def bpf_allows(rules: Sequence[Rule], major: int, minor: int | None) -> bool:
    """Return whether LXC's cgroup2 device program lets a container open major:minor rw.

    LXC's cgroup2_devices.c: a config starts as an allow-list (conf.c); the value
    ``a`` alone switches between allow-list and deny-list and empties the list
    (``bpf_list_add_device``); a rule identical to one already listed flips it; the
    program keeps only the rules against the default (``bpf_device_add``) and a rule
    matches only when the access asked for is within its own (``bpf_program_append_device``:
    a deny of ``w`` does not stop an ``rw`` open). With no rule left LXC attaches no
    program at all (cgfsng.c ``cgfsng_devices_activate``): every device opens.
    """
    default_allow = False
    listed: list[tuple[DeviceRule, bool]] = []
    for item in rules:
        rule = item.rule
        if rule.switch:
            default_allow = item.allow
            listed = []
            continue
        for index, (existing, allow) in enumerate(listed):
            if existing == rule and allow != default_allow:
                listed[index] = (existing, item.allow)
                break
        else:
            listed.append((rule, item.allow))
    if not listed:
        return True
    for rule, allow in listed:
        if allow == default_allow or rule.type not in ("a", "c"):
            continue
        if _covers(rule.major, rule.minor, major, minor) and NEED <= rule.access:
            return allow
    return default_allow


def list_allows(rules: Sequence[Rule], major: int, minor: int | None) -> bool:
    """Return whether a cgroup v1 ``devices.list`` lets the group open major:minor rw."""
    return any(item.rule.type in ("a", "c") and _covers(item.rule.major, item.rule.minor,
                                                        major, minor)
               and NEED <= item.rule.access for item in rules)


def permits(view: View, node: GpuNode) -> bool:
    """Return whether the view's rules let the container open ``node`` rw."""
    assert node.major is not None
    if view.semantics == "bpf":
        return bpf_allows(view.rules, node.major, node.minor)
    if view.semantics == "list":
        return list_allows(view.rules, node.major, node.minor)
    return allows(view.rules, node.major, node.minor, start_allow=True)


def restart_command(kind: str, container: str) -> tuple[str, ...]:
    """Return the command that restarts a container so it picks up its config."""
    if kind == "proxmox":
        return ("pct", "reboot", container)
    if kind == "incus":
        return ("incus", "restart", container)
    if kind == "lxd":
        return ("lxc", "restart", container)
    return ("lxc-stop", "-n", container, "-r")
