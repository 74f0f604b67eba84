"""Parse LXC container configs: Proxmox ``/etc/pve/lxc/*.conf`` and plain LXC ``config`` files.

A pure parser (no host access), shared by the ``lxc.device_majors`` check and the
fix scripts that rewrite a container's main section. It follows what the readers
of these files accept:

- Proxmox (``PVE::LXC::Config``): ``key: value``; ``lxc.*`` keys may also be
  written ``key = value``; ``#`` lines are the description. The running config is
  the main section only: everything from the first ``[name]`` line on is a
  snapshot (``[before-upgrade]``) or pending changes (``[pve:pending]``).
- Plain LXC (``confile.c``): ``key = value``, ``#`` comments, surrounding quotes
  stripped from the value; no sections.

Lines are split on ``\\n`` only, as both readers do, so line numbers match an editor's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Flavour = Literal["proxmox", "lxc"]

#: Keys holding device cgroup rules, cgroup v2 first.
ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
DENY_KEYS = ("lxc.cgroup2.devices.deny", "lxc.cgroup.devices.deny")
MOUNT_KEY = "lxc.mount.entry"

_LINE = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*([:=])\s*(.*?)\s*")
_SECTION = re.compile(r"\[[^\[\]\n]+\]\s*")
_DEV_KEY = re.compile(r"dev[0-9]+")
_RULE = re.compile(r"([abc])\s+(\*|[0-9]+):(\*|[0-9]+)(?:\s+(\S*))?\s*", re.ASCII)
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


def parse_line(text: str, flavour: Flavour) -> tuple[str, str] | None:
    """Return the (key, value) of one config line, or None for comments and junk."""
    match = _LINE.fullmatch(text)
    if match is None or text.lstrip().startswith("#"):
        return None
    key, separator, value = match.groups()
    if flavour == "lxc":
        if separator != "=":
            return None
        if len(value) > 1 and value[0] in "'\"" and value[-1] == value[0]:
            value = value[1:-1]
    elif separator == "=" and not key.startswith("lxc."):
        return None
    return key, value


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
        parsed = parse_line(raw, flavour)
        key, value = parsed if parsed is not None else (None, None)
        lines.append(ConfigLine(number, raw, key, value))
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
    match = _RULE.fullmatch(value)
    if match is None:
        return None
    kind, major, minor, access = match.groups()
    access = access or ""
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
