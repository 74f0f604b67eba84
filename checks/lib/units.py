"""systemd units as files show them: the unit file, its drop-ins, ExecStart and enablement.

Shared by ``nvidia.persistence`` and ``nvidia.fabricmanager``. It follows systemd.unit(5):
a unit file is looked up in ``/etc/systemd/system``, ``/run/systemd/system``,
``/usr/local/lib/systemd/system``, ``/usr/lib/systemd/system`` and ``/lib/systemd/system``,
the first found wins; drop-ins ``<unit>.d/*.conf`` come from all of them, sorted by name (a
name in an earlier directory hides the same name in a later one) and are applied after the
unit. An empty ``ExecStart=`` resets the list (systemd.service(5)); a unit is enabled when a
``*.wants``/``*.requires`` directory under ``/etc/systemd/system`` links it.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host

UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system")
UDEV_RULES = ("/etc/udev/rules.d/*.rules", "/run/udev/rules.d/*.rules",
              "/usr/lib/udev/rules.d/*.rules", "/lib/udev/rules.d/*.rules")


def reads(unit: str) -> tuple[str, ...]:
    """Return the paths :func:`read_unit` reads for one unit."""
    return (*(f"{d}/{unit}" for d in UNIT_DIRS), *(f"{d}/{unit}.d/*.conf" for d in UNIT_DIRS),
            f"/etc/systemd/system/*.wants/{unit}", f"/etc/systemd/system/*.requires/{unit}")


class Unit(NamedTuple):
    """A unit as systemd would load it."""

    name: str
    #: The unit file, "" when none is installed.
    path: str
    #: The ExecStart command in effect (argv), () when none.
    exec_start: tuple[str, ...]
    #: Where that ExecStart is written.
    exec_start_at: str
    #: ``WantedBy=`` targets of its [Install] section.
    wanted_by: tuple[str, ...]
    #: The enablement links under /etc/systemd/system.
    enabled_by: tuple[str, ...]

    @property
    def installed(self) -> bool:
        """Return whether a unit file exists."""
        return bool(self.path)


def _sections(text: str) -> list[tuple[str, str, str, int]]:
    """Return (section, key, value, line number) of a unit file, continuations joined."""
    found: list[tuple[str, str, str, int]] = []
    section = ""
    pending, start = "", 0
    for number, raw in enumerate(text.split("\n")[:4096], start=1):
        line = raw[:4096]
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if sep:
            found.append((section, key.strip(), value.strip(), start))
    return found


def read_unit(host: Host, name: str) -> Unit:
    """Return a unit's file, effective ExecStart, [Install] targets and enablement links."""
    path = next((f"{d}/{name}" for d in UNIT_DIRS if host.exists(f"{d}/{name}")), "")
    drop_ins: dict[str, str] = {}
    for directory in UNIT_DIRS:
        for conf in host.glob(f"{directory}/{name}.d/*.conf")[:64]:
            drop_ins.setdefault(conf.rsplit("/", 1)[1], conf)
    sources = ([path] if path else []) + [drop_ins[n] for n in sorted(drop_ins)]
    exec_start: tuple[str, ...] = ()
    exec_at = ""
    wanted: list[str] = []
    for file in sources:
        text = files.read_optional(host, file) or ""
        for section, key, value, number in _sections(text):
            if section == "Service" and key == "ExecStart":
                if not value:
                    exec_start, exec_at = (), f"{file}:{number}"
                    continue
                try:
                    argv = shlex.split(value.lstrip("-@+!:"))
                except ValueError:
                    argv = value.split()
                exec_start, exec_at = tuple(argv[:256]), f"{file}:{number}"
            elif section == "Install" and key == "WantedBy" and file == path:
                wanted += value.split()[:16]
    enabled = [p for pattern in (f"/etc/systemd/system/*.wants/{name}",
                                 f"/etc/systemd/system/*.requires/{name}")
               for p in host.glob(pattern)[:16]]
    return Unit(name, path, exec_start, exec_at, tuple(wanted), tuple(enabled))


def udev_starts(host: Host, unit: str) -> str:
    """Return a udev rules file that starts ``unit`` (``systemctl start`` or SYSTEMD_WANTS)."""
    for pattern in UDEV_RULES:
        for path in host.glob(pattern)[:512]:
            name = path.rsplit("/", 1)[1]
            if "nvidia" not in name:
                continue
            text = files.read_optional(host, path) or ""
            if unit.removesuffix(".service") in text[:1 << 16]:
                return path
    return ""
