"""LXC containers on a host: where their configs are, and a parser of those configs.

Shared by the ``lxc.device_majors`` check and its remediation, which rewrites a
container's main section with the same parser. :func:`find_containers`,
:func:`parse_proc_devices` and :func:`cgroup_mode` read facts through the Host seam;
the rest is a pure parser of Proxmox ``/etc/pve/lxc/*.conf`` and plain LXC ``config``
files. It follows what the readers of these files accept:

- Proxmox (``PVE::LXC::Config``): ``key: value``; ``lxc.*`` keys may also be
  written ``key = value``; ``#`` lines are the description. The running config is
  the main section only: everything from the first ``[name]`` line on is a
  snapshot (``[before-upgrade]``) or pending changes (``[pve:pending]``).
- Plain LXC (``confile.c``): ``key = value``, ``#`` comments, surrounding quotes
  stripped from the value; no sections.

Lines are split on ``\\n`` only, as both readers do, so line numbers match an editor's.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Literal

from auditor.hosts.base import Host

Flavour = Literal["proxmox", "lxc"]
CgroupMode = Literal["v2", "v1", "unknown"]

PROC_DEVICES = "/proc/devices"
PROC_CGROUP = "/proc/1/cgroup"
PVE_ROOT = "/etc/pve"
PLAIN_LXC_GLOB = "/var/lib/lxc/*/config"

#: Keys holding device cgroup rules, cgroup v2 first.
ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
DENY_KEYS = ("lxc.cgroup2.devices.deny", "lxc.cgroup.devices.deny")
MOUNT_KEY = "lxc.mount.entry"

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
#: The longest config line parsed; a longer one is junk (real ones are well under 4 KiB).
MAX_LINE = 1 << 16
_ASCII_SPACE = " \t\n\r\f\v"
_SECTION = re.compile(r"\[[^\[\]\n]+\]\s*")
_DEV_KEY = re.compile(r"dev[0-9]+")
_ACCESS = frozenset("rwm")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class ConfigLine:
    """One line of a config as written, with its key and value when it has them."""

    #: 1-based line number in the file.
    number: int
    #: The line as written, without its newline.
    text: str
    #: None for blank lines, comments and lines the reader would not parse.
    key: str | None = None
    value: str | None = None
    #: Where the value starts in ``text`` (inside any quotes), -1 without a value.
    value_start: int = field(default=-1, compare=False)

    def with_value(self, value: str) -> str:
        """Return the line with its value replaced and every other byte as written."""
        if self.value is None or self.value_start < 0:
            raise ValueError(f"line {self.number} has no value")
        end = self.value_start + len(self.value)
        return self.text[: self.value_start] + value + self.text[end:]


@dataclass(frozen=True)
class MainSection:
    """The running part of a config: the lines before the first section header."""

    lines: tuple[ConfigLine, ...]
    #: 1-based line number of the first ``[name]`` header, None when there is none.
    header_line: int | None
    #: Index in the text where that header starts (the text's length when none):
    #: ``text[:header_offset]`` is the main section, ``text[header_offset:]`` the rest.
    header_offset: int

    def entries(self, *keys: str) -> list[ConfigLine]:
        """Return the lines whose key is one of ``keys``, in file order."""
        return [line for line in self.lines if line.key in keys]


@dataclass(frozen=True)
class DeviceRule:
    """One device cgroup rule (``c 195:* rwm``); None major or minor means ``*``."""

    #: ``a`` (every device), ``b`` (block) or ``c`` (character).
    type: str
    major: int | None
    minor: int | None
    #: Subset of ``rwm``; ``a`` rules carry ``rwm``.
    access: frozenset[str]

    def format(self, major: int | None = None) -> str:
        """Return the rule as LXC writes it, optionally with another major."""
        if self.type == "a":
            return "a"
        major = self.major if major is None else major
        access = "".join(c for c in "rwm" if c in self.access)
        return f"{self.type} {_star(major)}:{_star(self.minor)} {access}".rstrip()


@dataclass(frozen=True)
class MountEntry:
    """An ``lxc.mount.entry`` value: an fstab line."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    @property
    def is_bind(self) -> bool:
        """Return whether the entry bind-mounts its source."""
        return "bind" in self.options or "rbind" in self.options


def _star(number: int | None) -> str:
    return "*" if number is None else str(number)


def _fields(text: str) -> tuple[str, str, str, int] | None:
    """Split ``KEY [:=] VALUE`` (blanks around each trimmed) in one pass: (key, separator,
    value, where the value starts), or None. Linear: no regex backtracking on a long line."""
    if len(text) > MAX_LINE:
        return None
    rest = text.lstrip()
    end = 0
    while end < len(rest) and rest[end] in _KEY_CHARS:
        end += 1
    if end == 0:
        return None
    after_key = rest[end:].lstrip()
    if not after_key or after_key[0] not in ":=" or "\n" in after_key:
        return None
    tail = after_key[1:]
    value = tail.strip()
    return rest[:end], after_key[0], value, len(text) - len(tail.lstrip())


def _parse(text: str, flavour: Flavour) -> tuple[str, str, int] | None:
    """Return (key, value, where the value starts) of one config line, or None."""
    fields = _fields(text)
    if fields is None or text.lstrip().startswith("#"):
        return None
    key, separator, value, start = fields
    if flavour == "lxc":
        if separator != "=":
            return None
        if len(value) > 1 and value[0] in "'\"" and value[-1] == value[0]:
            value, start = value[1:-1], start + 1
    elif separator == "=" and not key.startswith("lxc."):
        return None
    return key, value, start


def parse_line(text: str, flavour: Flavour) -> tuple[str, str] | None:
    """Return the (key, value) of one config line, or None for comments and junk."""
    parsed = _parse(text, flavour)
    return None if parsed is None else (parsed[0], parsed[1])


def is_section_header(text: str) -> bool:
    """Return whether a line opens a Proxmox snapshot or pending section."""
    return _SECTION.fullmatch(text) is not None


def parse_main_section(text: str, flavour: Flavour) -> MainSection:
    """Return the main section's lines with numbers and parsed (key, value), and its end."""
    lines: list[ConfigLine] = []
    offset = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        if flavour == "proxmox" and is_section_header(raw):
            return MainSection(tuple(lines), number, offset)
        parsed = _parse(raw, flavour)
        if parsed is None:
            lines.append(ConfigLine(number, raw))
        else:
            lines.append(ConfigLine(number, raw, parsed[0], parsed[1], parsed[2]))
        offset += len(raw) + 1
    # A trailing newline leaves an empty last piece that is not a line.
    if lines and lines[-1].text == "" and text.endswith("\n"):
        lines.pop()
    return MainSection(tuple(lines), None, len(text))


def format_line(key: str, value: str, flavour: Flavour) -> str:
    """Return a config line in the flavour's own form (``key: value`` or ``key = value``)."""
    return f"{key}: {value}" if flavour == "proxmox" else f"{key} = {value}"


def parse_device_rule(value: str) -> DeviceRule | None:
    """Parse a ``devices.allow``/``devices.deny`` value, or return None if it does not parse."""
    value = value.strip()
    if value == "a" or value.startswith("a "):
        # The kernel (and LXC's cgroup2 emulation) read any rule starting with "a" as "all".
        return DeviceRule("a", None, None, _ACCESS)
    parsed = _rule_fields(value)
    if parsed is None:
        return None
    kind, major, minor, access = parsed
    if not set(access) <= _ACCESS:
        return None
    try:
        return DeviceRule(
            kind,
            None if major == "*" else int(major),
            None if minor == "*" else int(minor),
            frozenset(access),
        )
    except ValueError:  # digits the int() of this Python refuses (too long)
        return None


def _number_or_star(text: str) -> bool:
    return text == "*" or (text != "" and all(c in "0123456789" for c in text))


def _rule_fields(value: str) -> tuple[str, str, str, str] | None:
    """Split ``TYPE MAJOR:MINOR [ACCESS]`` into its fields in one pass, or None."""
    if len(value) < 2 or value[0] not in "abc" or value[1] not in _ASCII_SPACE:
        return None
    rest = value[1:].lstrip(_ASCII_SPACE)
    end = 0
    while end < len(rest) and rest[end] not in _ASCII_SPACE:
        end += 1
    major, colon, minor = rest[:end].partition(":")
    if not colon or not _number_or_star(major) or not _number_or_star(minor):
        return None
    access = rest[end:].strip(_ASCII_SPACE)
    if any(c in _ASCII_SPACE for c in access):
        return None
    return value[0], major, minor, access


def parse_mount_entry(value: str) -> MountEntry | None:
    """Parse an ``lxc.mount.entry`` value (fstab form, ``\\040`` escapes), or None."""
    fields = value.split()
    if len(fields) < 4:
        return None
    source, target, fstype, options = (_unescape(f) for f in fields[:4])
    return MountEntry(source, target, fstype, tuple(options.split(",")))


def parse_dev_entry(value: str) -> str | None:
    """Return the host path of a Proxmox ``devN:`` value (``/dev/nvidia0,gid=44``)."""
    for item in value.split(","):
        name, sep, setting = item.partition("=")
        if not sep:
            return item.strip() or None
        if name.strip() == "path":
            return setting.strip() or None
    return None


def is_dev_key(key: str) -> bool:
    """Return whether a Proxmox key is a device passthrough entry (``dev0``)."""
    return _DEV_KEY.fullmatch(key) is not None


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


# -- the containers on a host --------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """One container config found on the host."""

    id: str
    path: str
    flavour: Flavour


def parse_proc_devices(text: str) -> dict[str, list[int]]:
    """Return the character drivers of ``/proc/devices``: name -> majors."""
    majors: dict[str, list[int]] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        number, _, name = stripped.partition(" ")
        name = name.strip()
        if not in_char or not name or not number.isascii() or not number.isdigit():
            continue
        if len(number) > 9:  # no real major is that long; keep int() cheap and sane
            continue
        majors.setdefault(name, []).append(int(number))
    return majors


def cgroup_mode(text: str | None) -> CgroupMode:
    """Return how device rules are enforced, from ``/proc/1/cgroup``.

    On a pure cgroup2 host LXC ignores every ``lxc.cgroup.*`` key ("Ignoring legacy
    cgroup limits on pure cgroup2 system"); with a v1 ``devices`` controller the
    legacy keys apply.
    """
    if not text:
        return "unknown"
    hierarchies = [line.split(":", 2) for line in text.splitlines() if line.strip()]
    if any(len(parts) != 3 for parts in hierarchies):
        return "unknown"
    if all(parts[0] == "0" and parts[1] == "" for parts in hierarchies):
        return "v2"
    if any("devices" in parts[1].split(",") for parts in hierarchies):
        return "v1"
    return "unknown"


def find_containers(host: Host) -> tuple[list[Container], str]:
    """Return the container configs on the host, and a note when Proxmox's are unclear."""
    containers: list[Container] = []
    pve_dir, note = _pve_lxc_dir(host)
    pve_ids: set[str] = set()
    if pve_dir is not None:
        for name in listdir(host, pve_dir):
            if name.endswith(".conf") and not name.startswith("."):
                path = posixpath.join(pve_dir, name)
                if host.is_dir(path):
                    continue
                containers.append(Container(name[: -len(".conf")], path, "proxmox"))
                pve_ids.add(name[: -len(".conf")])
    for path in host.glob(PLAIN_LXC_GLOB):
        name = path.split("/")[-2]
        # Proxmox writes /var/lib/lxc/<id>/config from <id>.conf at every start.
        if name not in pve_ids:
            containers.append(Container(name, path, "lxc"))
    return containers, note


def listdir(host: Host, path: str) -> list[str]:
    """Return the names in a directory, or [] when it cannot be listed."""
    try:
        return host.listdir(path)
    except OSError:
        return []


def _pve_lxc_dir(host: Host) -> tuple[str | None, str]:
    # /etc/pve/lxc and /etc/pve/local are links to this node's nodes/<name>; the
    # nodes/ tree holds every cluster member's containers, only one of them runs here.
    for candidate in (f"{PVE_ROOT}/lxc", f"{PVE_ROOT}/local/lxc"):
        if host.is_dir(candidate):
            return candidate, ""
    nodes = [n for n in listdir(host, f"{PVE_ROOT}/nodes")
             if host.is_dir(f"{PVE_ROOT}/nodes/{n}/lxc")]
    if not nodes:
        return None, ""
    hostname = (host.read_optional("/etc/hostname") or host.name).split(".")[0]
    if hostname in nodes:
        return f"{PVE_ROOT}/nodes/{hostname}/lxc", ""
    if len(nodes) == 1:
        return f"{PVE_ROOT}/nodes/{nodes[0]}/lxc", ""
    return None, (
        f"{PVE_ROOT}/nodes holds {len(nodes)} cluster nodes and none is named "
        f"{hostname!r}, so which containers run here is unknown"
    )
