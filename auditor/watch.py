"""``audit watch``: re-run the checks a device event can change, and print what changed.

A PCI event (hot-plug, driver bind, ``udevadm trigger``) can change a device's
MaxReadReq; an NVIDIA module or device node event can change the driver version and
the character device majors containers are allowed. The watch listens on the udev
netlink socket (pyudev), batches a burst of events, re-runs only the affected checks
on the live host and prints one line per finding that changed since the previous run.
With ``--source auto`` it listens to udev's events only when a udevd answers, else to
the kernel's (a udevd that stopped may leave its socket behind).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from auditor.check import CheckClass, Trigger
from auditor.errors import UsageError
from auditor.hosts.base import Host
from auditor.model import Finding
from auditor.policy import Policy

NVIDIA_PCI_VENDOR = "0x10de"
#: How long to wait for the rest of a burst (``udevadm trigger`` sends one per device).
BATCH_WINDOW_S = 0.25


@dataclass(frozen=True)
class DeviceEvent:
    """The parts of a uevent the watch looks at."""

    action: str
    subsystem: str
    name: str
    driver: str = ""
    vendor: str = ""
    node: str = ""

    def describe(self) -> str:
        """Return ``action subsystem name``."""
        return f"{self.action} {self.subsystem} {self.name}"


_EVERY = frozenset(Trigger)


def triggers(event: DeviceEvent) -> frozenset[Trigger]:
    """Return the kinds of change an event is."""
    nvidia = (
        event.name.startswith("nvidia")
        or event.subsystem.startswith("nvidia")
        or event.node.startswith("/dev/nvidia")
        or event.driver.startswith("nvidia")
    )
    if event.subsystem == "pci":
        # An NVIDIA GPU bound or unbound loads or drops the driver's device nodes too.
        if nvidia or (event.vendor == NVIDIA_PCI_VENDOR and event.action in ("bind", "unbind")):
            return _EVERY
        return frozenset({Trigger.PCI})
    if event.subsystem == "module":
        return (frozenset({Trigger.GPU_MODULE, Trigger.GPU_NODE})
                if event.name.startswith("nvidia") else frozenset())
    return frozenset({Trigger.GPU_NODE}) if nvidia else frozenset()


def affected_checks(event: DeviceEvent, checks: Sequence[CheckClass]) -> frozenset[str]:
    """Return the ids of the checks an event can change the findings of."""
    kinds = triggers(event)
    return frozenset(c.id for c in checks if c.events & kinds)


def _from_pyudev(device: Any) -> DeviceEvent:
    def attr(name: str) -> str:
        try:
            value = device.attributes.get(name)
        except (KeyError, OSError, AttributeError):
            return ""
        return value.decode("ascii", "replace").strip() if isinstance(value, bytes) else ""

    subsystem = str(device.subsystem or "")
    return DeviceEvent(
        action=str(device.action or ""),
        subsystem=subsystem,
        name=str(device.sys_name or ""),
        driver=str(device.driver or ""),
        vendor=attr("vendor") if subsystem == "pci" else "",
        node=str(device.device_node or ""),
    )


def _state(findings: Sequence[Finding]) -> dict[tuple[str, str, str], Finding]:
    return {f.key: f for f in findings}


def changes(before: Sequence[Finding], after: Sequence[Finding]) -> list[str]:
    """Return one line per finding that appeared, went away, or changed status or value."""
    old, new = _state(before), _state(after)
    lines: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key), new.get(key)
        check, subject, aspect = key
        if aspect:
            subject = f"{subject} [{aspect}]"
        if was is None and now is not None:
            lines.append(f"{check} {subject}: new {now.status.value} (observed {now.observed!r})"
                         f": {now.message}")
        elif now is None and was is not None:
            lines.append(f"{check} {subject}: gone (was {was.status.value})")
        elif was is not None and now is not None and (
            was.status != now.status or was.observed != now.observed
        ):
            parts = []
            if was.status != now.status:
                parts.append(f"{was.status.value} -> {now.status.value}")
            if was.observed != now.observed:
                parts.append(f"observed {was.observed!r} -> {now.observed!r}")
            lines.append(f"{check} {subject}: {', '.join(parts)}: {now.message}")
    return [" ".join(line.split()) for line in lines]


class Watcher:
    """Keep the last findings of each watched check and re-run them on demand."""

    def __init__(self, host: Host, checks: Sequence[CheckClass], policy: Policy,
                 debug: bool = False) -> None:
        self.host = host
        self.checks = {c.id: c for c in checks}
        self.policy = policy
        self.debug = debug
        self.last: dict[str, tuple[Finding, ...]] = {}

    def run(self, check_ids: Sequence[str]) -> list[str]:
        """Re-run these checks; return the lines describing what changed."""
        from auditor.runner import run_check

        lines: list[str] = []
        # What the checks learned (facts, the driver's GPU state) is of the host before the
        # event: read it again.
        self.host.forget()
        for check_id in sorted(check_ids):
            result = run_check(self.host, self.checks[check_id], self.policy, self.debug)
            previous = self.last.get(check_id)
            self.last[check_id] = result.findings
            if previous is not None:
                lines.extend(changes(previous, result.findings))
        return lines


#: The socket udevd takes commands on; a udevd that stopped can leave it behind.
UDEV_CONTROL = "/run/udev/control"
PROBE_TIMEOUT_S = 2


def udev_answers(control: str = UDEV_CONTROL) -> tuple[bool, str]:
    """Return whether a udevd is running to re-broadcast events, and how that was told.

    udevd re-broadcasts each kernel event on the udev netlink group once it has
    processed it; with no udevd nothing arrives there, whatever socket file is left
    in ``/run/udev``. As root, ``udevadm control --ping`` asks udevd itself; else a
    connection to its control socket is tried: a socket left behind refuses it.
    """
    udevadm = shutil.which("udevadm")
    if udevadm is not None and os.geteuid() == 0:
        try:
            ping = subprocess.run([udevadm, "control", "--ping", f"--timeout={PROBE_TIMEOUT_S}"],
                                  capture_output=True, timeout=PROBE_TIMEOUT_S + 5, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False, "udevadm control --ping did not finish"
        if ping.returncode == 0:
            return True, "udevd answered udevadm control --ping"
        return False, "udevd did not answer udevadm control --ping"
    if not os.path.exists(control):
        return False, f"no udevd: {control} does not exist"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(control)
    except PermissionError:
        # Not root: the socket cannot be tried; a udevd process says the same.
        if _udevd_running():
            return True, "a udevd process is running (not root: it was not asked)"
        return False, f"no udevd process is running ({control} is left behind)"
    except OSError as exc:
        return False, f"no udevd answers on {control} ({exc.strerror or exc})"
    finally:
        probe.close()
    return True, f"udevd accepts connections on {control}"


def _udevd_running(proc: str = "/proc", limit: int = 1 << 16) -> bool:
    """Return whether a process named udevd or systemd-udevd is running (bounded scan)."""
    try:
        names = os.listdir(proc)
    except OSError:
        return False
    for name in names[:limit]:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/comm", encoding="utf-8", errors="replace") as handle:
                if handle.read(64).strip() in ("systemd-udevd", "udevd"):
                    return True
        except OSError:
            continue
    return False


def choose_source(source: str) -> tuple[str, str]:
    """Return the event source to listen to and why (``auto``: udev only if udevd answers)."""
    if source == "kernel":
        return "kernel", "as asked"
    alive, why = udev_answers()
    if source == "udev":
        return "udev", "as asked" if alive else f"as asked, but {why}: no event will arrive"
    return ("udev", why) if alive else ("kernel", why)


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def watch(
    checks: Sequence[CheckClass],
    policy: Policy,
    *,
    count: int | None = None,
    timeout: float | None = None,
    source: str = "auto",
    debug: bool = False,
    out: TextIO | None = None,
    log: TextIO | None = None,
    ready: Callable[[], None] | None = None,
) -> int:
    """Watch device events on this host until Ctrl-C, ``count`` events or ``timeout`` s.

    Changes go to ``out`` (stdout), one line each; what the watch does goes to ``log``
    (stderr). Return the number of relevant events seen.
    """
    import pyudev

    from auditor.hosts import LocalHost

    out = out or sys.stdout
    log = log or sys.stderr

    def say(stream: TextIO, line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    # Without udevd nothing is re-broadcast on the udev group: listen to the kernel.
    source, why = choose_source(source)
    try:
        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context, source=source)
        monitor.start()
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot listen for device events ({exc})") from exc
    host = LocalHost()
    watcher = Watcher(host, checks, policy, debug)
    watcher.run([c.id for c in checks])
    baseline = sum(len(f) for f in watcher.last.values())
    say(log, f"audit watch: {host.name}: watching {', '.join(sorted(watcher.checks))} "
             f"({baseline} findings) on {source} events ({why})")
    if ready is not None:
        ready()
    deadline = time.monotonic() + timeout if timeout is not None else None
    seen = 0

    def remaining() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    try:
        while count is None or seen < count:
            left = remaining()
            if left == 0.0:
                break
            device = monitor.poll(timeout=left)
            if device is None:
                continue
            first = _from_pyudev(device)
            wanted = set(affected_checks(first, checks))
            if not wanted:
                continue
            batch = [first]
            seen += 1
            # Drain the rest of a burst so one trigger re-runs each check once.
            while count is None or seen < count:
                window = BATCH_WINDOW_S if deadline is None else min(BATCH_WINDOW_S,
                                                                     remaining() or 0.0)
                more = monitor.poll(timeout=window) if window > 0 else None
                if more is None:
                    break
                event = _from_pyudev(more)
                extra = affected_checks(event, checks)
                if extra:
                    batch.append(event)
                    wanted |= extra
                    seen += 1
            shown = ", ".join(e.describe() for e in batch[:3])
            if len(batch) > 3:
                shown += f", ... ({len(batch) - 3} more)"
            lines = watcher.run(sorted(wanted))
            say(log, f"audit watch: {len(batch)} event{'s' if len(batch) != 1 else ''} "
                     f"({shown}): re-ran {', '.join(sorted(wanted))}: "
                     f"{len(lines) or 'no'} change{'s' if len(lines) != 1 else ''}")
            for line in lines:
                say(out, f"{_stamp()} {host.name} {line}")
    except KeyboardInterrupt:
        pass
    say(log, f"audit watch: stopped after {seen} event{'s' if seen != 1 else ''}")
    return seen
