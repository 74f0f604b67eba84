"""lxc.device_majors: rewrite stale device allow rules in a container's main section."""

from __future__ import annotations

import re
from collections.abc import Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from remediations.base import Advice, Context, InsertLine, Remedy, ReplaceLine, Step, evidence

READS: tuple[str, ...] = ()

_SECTION = re.compile(r"^\s*\[")
_ALLOW = re.compile(
    r"^(?P<head>\s*lxc\.cgroup2?\.devices\.allow\s*[:=]\s*[cb]\s+)(?P<major>[0-9]+)(?P<tail>:.*)$"
)
_ALLOW_KEY = re.compile(r"lxc\.cgroup2?\.devices\.allow")
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def main_section(text: str) -> list[str]:
    """Return the lines of a container config before its first ``[snapshot]`` section."""
    lines: list[str] = []
    for raw in text.split("\n"):
        if _SECTION.match(raw):
            break
        lines.append(raw)
    return lines


def restart_command(flavour: str, container: str) -> tuple[str, ...]:
    """Return the command that restarts a container so it picks up its config."""
    if flavour == "proxmox":
        return ("pct", "reboot", container)
    return ("lxc-stop", "-n", container, "-r")


def _insert_after(main: list[str]) -> int:
    """Return the line after which a rule joins the main section: its last non-blank line."""
    for number in range(len(main), 0, -1):
        if main[number - 1].strip():
            return number
    return 0


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Point each stale allow rule at the device's current major; advise a restart."""
    remedies: list[Remedy] = []
    planned: dict[tuple[str, int], str] = {}
    inserted: set[tuple[str, str]] = set()
    for finding in findings:
        ev = evidence(finding)
        config, rule = ev.get("config", ""), ev.get("rule", "").strip()
        stale, current = ev.get("allowed_major", ""), ev.get("current_major", "")
        flavour = ev.get("flavour", "lxc")
        if not (config.startswith("/") and current.isdigit()):
            continue
        try:
            text = host.read_text(config)
        except OSError:
            continue
        real = host.resolve(config)
        main = main_section(text)
        notes: list[str] = []
        steps: list[Step] = []
        for number, raw in enumerate(main, start=1):
            if not (rule and stale.isdigit()):
                break
            match = _ALLOW.match(raw)
            if not match or match.group("major") != stale or "\ufffd" in raw:
                continue
            if raw.strip() != rule:
                continue
            new = f"{match.group('head')}{current}{match.group('tail')}"
            if planned.get((real, number), new) != new:
                notes.append(f"line {number} also serves another device: add an allow rule "
                             f"for {ev.get('device', '')} (major {current}) by hand")
                continue
            if (real, number) not in planned:
                planned[(real, number)] = new
                steps.append(ReplaceLine(real, number, raw, new))
        if not rule:
            # No single stale rule to rewrite: add one for the current major to the main section.
            key = ev.get("allow_key", "")
            if not _ALLOW_KEY.fullmatch(key):
                key = "lxc.cgroup2.devices.allow"
            line = f"{key}{': ' if flavour == 'proxmox' else ' = '}c {current}:* rwm"
            after = _insert_after(main)
            anchor = main[after - 1] if after else ""
            if (real, line) not in inserted and "\ufffd" not in anchor:
                inserted.add((real, line))
                steps.append(InsertLine(real, after, anchor, line))
        container = finding.subject
        advice: list[Advice] = []
        if _CONTAINER.fullmatch(container):
            advice.append(Advice(f"restart container {container} to apply the new rule",
                                 restart_command(flavour, container)))
        else:
            advice.append(Advice("restart the container to apply the new rule"))
        if flavour == "proxmox":
            notes.append("on Proxmox VE 8.1+, devN: entries (dev0: /dev/nvidia-uvm) pass the "
                         "device with its current numbers at every start: the lasting fix")
        remedies.append(Remedy(
            check="lxc.device_majors",
            subject=container,
            title=f"allow {ev.get('device', 'the device')} by its current major {current}"
                  + (f" (was {stale})" if stale else ""),
            persistent=tuple(steps),
            notes=tuple(notes),
            advice=tuple(advice),
        ))
    return remedies
