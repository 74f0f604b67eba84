"""LXC containers on a host: where their configs are, what LXC reads from them, and a parser.

Shared by the ``lxc.device_majors`` check and its remediation, which rewrites a
container's main section with the same parser. :func:`find_containers`,
:func:`parse_proc_devices`, :func:`cgroup_mode`, :func:`load_entries` and the
running-container readers read facts through the Host seam; the rest is a pure
parser of Proxmox ``/etc/pve/lxc/*.conf`` and plain LXC ``config`` files. It follows
what the readers of these files accept:

- Proxmox (``PVE::LXC::Config``): ``key: value``; ``lxc.*`` keys may also be
  written ``key = value``; ``#`` lines are the description. The running config is
  the main section only: everything from the first ``[name]`` line on is a
  snapshot (``[before-upgrade]``) or pending changes (``[pve:pending]``).
- Plain LXC (``confile.c``): ``key = value``, ``#`` comments, surrounding quotes
  stripped from the value; no sections.

Lines are split on ``\\n`` only, as both readers do, so line numbers match an editor's.
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from auditor.hosts.base import Host
from auditor.parsing import lazy_re

Flavour = Literal["proxmox", "lxc"]
CgroupMode = Literal["v2", "v1", "unknown"]

PROC_DEVICES = "/proc/devices"
PROC_CGROUP = "/proc/1/cgroup"
PVE_ROOT = "/etc/pve"
PLAIN_LXC_GLOB = "/var/lib/lxc/*/config"
#: Where lxc-start runs on Proxmox, which opens a relative lxc.include from there:
#: ``pct start`` starts the pve-container@<id> unit (``ExecStart=/usr/bin/lxc-start -F -n
#: %i``, no WorkingDirectory=, so a system service's "/"), and lxc-start reads the config
#: before it changes directory.
PVE_START_DIR = "/"
#: Incus and LXD: (manager, the directory of its containers, the directory where it writes
#: the LXC config it generates at each start: ``<logs>/<name>/lxc.conf``; driver_lxc.go
#: ``configPath := filepath.Join(d.LogPath(), "lxc.conf")``).
INSTANCE_DIRS: tuple[tuple[str, str, str], ...] = (
    ("incus", "/var/lib/incus/containers", "/var/log/incus"),
    ("lxd", "/var/snap/lxd/common/lxd/containers", "/var/snap/lxd/common/lxd/logs"),
    ("lxd", "/var/lib/lxd/containers", "/var/log/lxd"),
)
MAX_INSTANCES = 4096

#: Keys holding device cgroup rules, cgroup v2 first.
ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
DENY_KEYS = ("lxc.cgroup2.devices.deny", "lxc.cgroup.devices.deny")
MOUNT_KEY = "lxc.mount.entry"

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
#: The longest config line parsed; a longer one is junk (real ones are well under 4 KiB).
MAX_LINE = 1 << 16
_ASCII_SPACE = " \t\n\r\f\v"
_SECTION = lazy_re(r"\[[^\[\]\n]+\]\s*")
_DEV_KEY = lazy_re(r"dev[0-9]+")
_ACCESS = frozenset("rwm")
_OCTAL_ESCAPE = lazy_re(r"\\([0-7]{3})")


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


class MainSection(NamedTuple):
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
    #: The value is exactly ``a``: LXC's cgroup2 program reads only that as the switch
    #: between allow-list and deny-list (cgroup2_devices.c ``bpf_list_add_device``);
    #: ``a *:* rwm`` is an ordinary rule there that matches every device.
    switch: bool = field(default=False, compare=False)

    def format(self, major: int | None = None) -> str:
        """Return the rule as LXC writes it, optionally with another major."""
        if self.type == "a":
            return "a"
        major = self.major if major is None else major
        access = "".join(c for c in "rwm" if c in self.access)
        return f"{self.type} {_star(major)}:{_star(self.minor)} {access}".rstrip()


class MountEntry(NamedTuple):
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
        # The kernel's v1 controller reads any rule starting with "a" as "all".
        return DeviceRule("a", None, None, _ACCESS, switch=value == "a")
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


class Container(NamedTuple):
    """One container config found on the host."""

    id: str
    path: str
    flavour: Flavour
    #: ``incus`` or ``lxd`` for an instance those managers start (``path`` is the LXC
    #: config they generated at its last start); "" for Proxmox and plain LXC.
    manager: str = ""

    @property
    def kind(self) -> str:
        """Return who manages the container: ``proxmox``, ``lxc``, ``incus`` or ``lxd``."""
        return self.manager or self.flavour


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
    for manager, instances, logs in INSTANCE_DIRS:
        seen: set[str] = set()
        for path in host.glob(f"{instances}/*")[:MAX_INSTANCES]:
            name = path.rsplit("/", 1)[1]
            if name in seen:
                continue
            seen.add(name)
            containers.append(Container(name, f"{logs}/{name}/lxc.conf", "lxc", manager))
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


# -- what LXC reads: the settings of a config, its includes followed ------------------------

#: LXC's own configuration directory: common.conf, userns.conf, the distributions' files
#: that include them, and their ``.conf.d`` directories.
LXC_CONFIG_DIR = "/usr/share/lxc/config"
#: Where an ``lxc.include`` may point that this audit reads (the collector fetches these):
#: LXC's shipped configs and their .conf.d directories, shared profiles in /etc/lxc, and
#: files beside a container's config. An include anywhere else is reported as unread.
INCLUDE_READS: tuple[str, ...] = (
    f"{LXC_CONFIG_DIR}/*",
    f"{LXC_CONFIG_DIR}/*/*",
    "/etc/lxc/*",
    "/etc/lxc/*/*",
    "/etc/lxc/*/*/*",
    "/var/lib/lxc/*/*.conf",
    "/var/lib/lxc/*/*/*.conf",
)
#: LXC follows includes without a limit (a loop recurses until it fails); these bound ours.
MAX_INCLUDE_DEPTH = 8
MAX_INCLUDED_FILES = 64
#: An included config is a few dozen lines; more than this is not read.
MAX_INCLUDE_BYTES = 256 * 1024
#: The most lines one line of a config may hold through carriage returns.
MAX_PIECES = 64
#: Running containers: a cgroup v2 directory exists while a container runs (Proxmox puts
#: its containers at lxc/<id>, ``lxc.cgroup.dir.container = lxc/$vmid`` in PVE::LXC
#: ``update_lxc_config``; LXC >= 4 at lxc.payload.<name>, older LXC at lxc/<name>), and on
#: cgroup v1 the devices controller lists what the container may open.
CGROUP_V2_DIRS = ("/sys/fs/cgroup/lxc/{name}", "/sys/fs/cgroup/lxc.payload.{name}")
CGROUP_V1_LISTS = ("/sys/fs/cgroup/devices/lxc/{name}/devices.list",
                   "/sys/fs/cgroup/devices/lxc.payload.{name}/devices.list")
RUNNING_READS: tuple[str, ...] = (
    "/sys/fs/cgroup/lxc/*/cgroup.type",
    "/sys/fs/cgroup/lxc.payload.*/cgroup.type",
    "/sys/fs/cgroup/devices/lxc/*/devices.list",
    "/sys/fs/cgroup/devices/lxc.payload.*/devices.list",
)
#: Every path the container readers here may read, beside the configs themselves.
READS: tuple[str, ...] = (
    *INCLUDE_READS,
    *RUNNING_READS,
    *(f"{instances}/*" for _, instances, _ in INSTANCE_DIRS),
    *(f"{logs}/*/lxc.conf" for _, _, logs in INSTANCE_DIRS),
)

_SAFE_NAME = lazy_re(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Entry(NamedTuple):
    """One ``lxc.*`` setting as LXC applies it, and where it is written."""

    key: str
    value: str
    #: The file it is written in; "" for a setting Proxmox generates or one assumed.
    path: str = ""
    #: The line as written (a fix rewrites it); None for generated or assumed settings.
    line: ConfigLine | None = None
    #: How a report names where it comes from (``/etc/lxc/gpu.conf:3``, ``dev0``).
    origin: str = ""


class Refused(NamedTuple):
    """An include LXC fails on, and why."""

    path: str
    #: Completes "lxc.include PATH ...": ``does not exist``, ``is a directory``.
    why: str = "does not exist"


@dataclass
class Loaded:
    """A config's settings in the order LXC applies them, with what reading them found."""

    entries: list[Entry] = field(default_factory=list)
    #: Files read through lxc.include.
    included: list[str] = field(default_factory=list)
    #: LXC's own files that were not in the tree and whose device settings were assumed.
    assumed: list[str] = field(default_factory=list)
    #: Includes this audit could not follow: what they set is unknown.
    unknown: list[str] = field(default_factory=list)
    #: Includes LXC refuses (a file that does not exist, a directory it must read as a
    #: file): the config does not load, so the container does not start.
    fatal: list[Refused] = field(default_factory=list)


def _rules(key_suffix: str, *values: str) -> list[tuple[str, str]]:
    return [(f"lxc.cgroup2.devices.{key_suffix}", v) for v in values] + [
        (f"lxc.cgroup.devices.{key_suffix}", v) for v in values]


#: The device settings of LXC's shipped files, for trees that lack them (a capture made
#: without /usr/share/lxc): common.conf starts an allow-list and allows the standard
#: devices (config/templates/common.conf.in); userns.conf clears the device rules
#: (config/templates/userns.conf.in); Proxmox's userns.conf.d/01-pve.conf then makes
#: unprivileged containers a deny-list, "allow = a" (pve-container src/lxc-pve-userns.conf).
#: Older LXC wrote the same rules with the cgroup v1 keys; a v2 host ignores those.
_COMMON = [
    ("lxc.cgroup2.devices.deny", "a"), ("lxc.cgroup.devices.deny", "a"),
    *_rules("allow", "c *:* m", "b *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm",
            "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 1:8 rwm", "c 1:9 rwm",
            "c 136:* rwm", "c 10:229 rwm"),
]
_USERNS = [("lxc.cgroup2.devices.deny", ""), ("lxc.cgroup2.devices.allow", ""),
           ("lxc.cgroup.devices.deny", ""), ("lxc.cgroup.devices.allow", "")]
_PVE_USERNS = [*_USERNS, ("lxc.cgroup2.devices.allow", "a")]


def _shipped(path: str, proxmox: bool) -> list[tuple[str, str]] | None:
    """Return the settings of one of LXC's own files as shipped, or None if it is not one."""
    if path == f"{LXC_CONFIG_DIR}/userns.conf.d":
        # Proxmox installs 01-pve.conf there; plain LXC ships the directory empty.
        return list(_PVE_USERNS) if proxmox else []
    directory, _, name = path.rpartition("/")
    if directory != LXC_CONFIG_DIR:
        return None
    if name == "common.conf":
        return [*_COMMON, ("lxc.include", f"{LXC_CONFIG_DIR}/common.conf.d/")]
    if name == "userns.conf":
        return [*_USERNS, ("lxc.include", f"{LXC_CONFIG_DIR}/userns.conf.d/")]
    if name.endswith(".common.conf") and _SAFE_NAME.fullmatch(name):
        return [("lxc.include", f"{LXC_CONFIG_DIR}/common.conf")]
    if name.endswith(".userns.conf") and _SAFE_NAME.fullmatch(name):
        return [("lxc.include", f"{LXC_CONFIG_DIR}/userns.conf")]
    return None


def readable_include(path: str) -> bool:
    """Return whether an include path is one this audit reads (matches INCLUDE_READS)."""
    parts = path.strip("/").split("/")
    return any(
        len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w)
                                          for p, w in zip(parts, wanted, strict=True))
        for wanted in (p.strip("/").split("/") for p in INCLUDE_READS)
    )


def config_entries(text: str, path: str) -> list[Entry]:
    """Return the ``lxc.*`` settings of a plain LXC config file's text, in order.

    LXC applies only keys that start with ``lxc.`` ("martian option", confile.c
    ``parse_line``); a value may be quoted. LXC ends a line at ``\r`` as well as at
    ``\n`` (parse.c ``lxc_file_for_each_line_mmap`` splits on "\r\n\0"): a line
    that holds a carriage return is read as the lines it separates, all under the
    editor's line number (a fix, which matches whole lines, leaves such a line alone).
    """
    entries: list[Entry] = []
    for line in parse_main_section(text, "lxc").lines:
        pieces = line.text.split("\r") if "\r" in line.text.rstrip("\r") else None
        if pieces is None:
            if line.key is not None and line.key.startswith("lxc."):
                entries.append(Entry(line.key, line.value or "", path, line,
                                     f"{path}:{line.number}"))
            continue
        for piece in pieces[:MAX_PIECES]:
            parsed = _parse(piece, "lxc")
            if parsed is not None and parsed[0].startswith("lxc."):
                part = ConfigLine(line.number, piece, parsed[0], parsed[1], parsed[2])
                entries.append(Entry(parsed[0], parsed[1], path, part,
                                     f"{path}:{line.number}"))
    return entries


def _split_value(entry: Entry) -> list[Entry]:
    """Return an entry whose value holds ``\r`` as the lines LXC reads from it.

    Proxmox splits its file on ``\n`` only and writes each ``lxc.*`` value into the
    config LXC starts from (PVE::LXC ``update_lxc_config``: ``"$k = $v\n"``), where
    LXC splits it again at every ``\r``.
    """
    first, *rest = entry.value.split("\r")[:MAX_PIECES]
    out = [entry._replace(value=first.strip())]
    for piece in rest:
        parsed = _parse(piece, "lxc")
        if parsed is not None and parsed[0].startswith("lxc."):
            out.append(Entry(parsed[0], parsed[1], entry.path, None, entry.origin))
    return out


class _Reader:
    """Follows lxc.include as confile.c does, bounded, through the Host seam.

    confile.c ``set_config_includefiles``: a value ending in ``/`` or naming a
    directory (``stat``, links followed) reads every ``*.conf`` in it
    (``do_includedir``: names of six bytes or more ending ``.conf``, hidden ones too,
    no recursion into subdirectories); anything else is read as one file
    (``lxc_config_read``), whose own ``lxc.include`` lines are followed the same way.
    LXC itself bounds neither depth nor count (a loop recurses until it fails); a path
    is opened as given, so a relative one is taken from LXC's working directory.
    """

    def __init__(self, host: Host, proxmox: bool, loaded: Loaded, cwd: str | None) -> None:
        self.host = host
        self.proxmox = proxmox
        self.loaded = loaded
        self.cwd = cwd
        self.files = 0

    def expand(self, entries: list[Entry], depth: int, stack: tuple[str, ...]) -> list[Entry]:
        out: list[Entry] = []
        for item in entries:
            for entry in _split_value(item) if "\r" in item.value else (item,):
                if entry.key != "lxc.include":
                    out.append(entry)
                elif entry.value:
                    # An empty value only clears the list lxc-info shows: nothing is read.
                    out.extend(self.include(entry.value, entry.origin, depth, stack))
        return out

    def include(self, value: str, origin: str, depth: int,
                stack: tuple[str, ...]) -> list[Entry]:
        where = f"{value!r} ({origin})" if origin else repr(value)
        if not value.startswith("/"):
            if self.cwd is None:
                self.loaded.unknown.append(f"{where}: a relative path, resolved from wherever "
                                           "LXC was started")
                return []
            value = posixpath.join(self.cwd, value)
        path = posixpath.normpath(value)
        if depth >= MAX_INCLUDE_DEPTH:
            self.loaded.unknown.append(f"{where}: includes nest more than "
                                       f"{MAX_INCLUDE_DEPTH} deep or loop")
            return []
        # A trailing slash asks for a directory whatever the path is (opendir); a path
        # that stat finds to be a directory is read as one too.
        if value.endswith("/") or (
                (readable_include(path) or readable_include(path + "/x.conf"))
                and self.host.is_dir(path)):
            return self.include_dir(path, where, depth, stack)
        return self.include_file(path, where, depth, stack)

    def reached(self, path: str, where: str, wanted: str) -> str | None:
        """Return the path ``path`` reaches, links followed, or None (noted) when that is
        outside the paths this audit reads: a link is followed as LXC follows it, but only
        to where a capture of the declared reads holds the same file."""
        try:
            real = self.host.resolve(path)
        except OSError as exc:
            self.loaded.unknown.append(f"{where}: {path} cannot be resolved ({exc})")
            return None
        if real != path and not readable_include(real + wanted):
            self.loaded.unknown.append(f"{where}: {path} is a link to {real}, which is not "
                                       "among the paths this audit reads")
            return None
        return real

    def assumed(self, path: str, depth: int, stack: tuple[str, ...]) -> list[Entry] | None:
        settings = _shipped(path, self.proxmox)
        if settings is None:
            return None
        if settings:
            self.loaded.assumed.append(path)
        entries = [Entry(k, v, origin=f"{path} (as LXC ships it)") for k, v in settings]
        return self.expand(entries, depth + 1, (*stack, path))

    def include_dir(self, path: str, where: str, depth: int,
                    stack: tuple[str, ...]) -> list[Entry]:
        if not readable_include(path + "/x.conf"):
            self.loaded.unknown.append(f"{where}: not among the paths this audit reads")
            return []
        if self.reached(path, where, "/x.conf") is None:
            return []
        entry = self.host.stat(path)
        if entry is None:
            # A missing directory is skipped (do_includedir returns 0 on ENOENT).
            return self.assumed(path, depth, stack) or []
        if entry.kind != "dir":
            # opendir fails with ENOTDIR, and the config with it.
            self.loaded.fatal.append(Refused(path, f"is a {_kind(entry.kind)}, not a "
                                                   "directory (it ends in '/')"))
            return []
        # do_includedir reads entries in readdir order, which the file system decides;
        # sorted is the order of every common file system for a handful of files.
        names = [n for n in listdir(self.host, path) if len(n) >= 6 and n.endswith(".conf")]
        out: list[Entry] = []
        for name in names:
            if self.files >= MAX_INCLUDED_FILES:
                self.loaded.unknown.append(f"{where}: {path} holds more included files than "
                                           f"this audit follows ({MAX_INCLUDED_FILES})")
                break
            out.extend(self.include_file(posixpath.join(path, name), where, depth, stack,
                                         in_dir=True))
            if self.loaded.fatal:
                break
        return out

    def include_file(self, path: str, where: str, depth: int, stack: tuple[str, ...], *,
                     in_dir: bool = False) -> list[Entry]:
        if not readable_include(path):
            self.loaded.unknown.append(f"{where}: {path} is not among the paths this audit "
                                       "reads")
            return []
        # Loops are told by the file a path reaches, links followed (never out of the
        # host's root: the seam clamps them there).
        real = self.reached(path, where, "")
        if real is None:
            return []
        if real in stack:
            # LXC has no condition to stop on: it opens the file again and again until it
            # runs out of file descriptors, and the config fails to load.
            self.loaded.fatal.append(Refused(path, "is included again by a file it "
                                                   "includes (a loop LXC follows until it "
                                                   "fails)"))
            return []
        entry = self.host.stat(path)
        if entry is None:
            assumed = self.assumed(path, depth, stack)
            if assumed is not None:
                return assumed
            # lxc_config_read fails on a missing file (a dangling link too), and with it
            # the whole config.
            self.loaded.fatal.append(Refused(path))
            return []
        if entry.kind == "dir":
            # A directory reached as a file (a '*.conf' directory inside an included one):
            # lxc_config_read's read() fails with EISDIR, and the config with it.
            self.loaded.fatal.append(Refused(path, "is a directory, which LXC reads as a "
                                                   "file" + (" (its name ends in .conf)"
                                                             if in_dir else "")))
            return []
        if entry.kind != "file" or self.files >= MAX_INCLUDED_FILES:
            why = ("more included files than this audit follows" if entry.kind == "file"
                   else f"a {_kind(entry.kind)}, not a file")
            self.loaded.unknown.append(f"{where}: {path} is {why}")
            return []
        try:
            text = self.host.read_text(path, MAX_INCLUDE_BYTES + 1)
        except OSError as exc:
            self.loaded.unknown.append(f"{where}: {path} cannot be read ({exc})")
            return []
        if len(text) > MAX_INCLUDE_BYTES:
            self.loaded.unknown.append(f"{where}: {path} is larger than "
                                       f"{MAX_INCLUDE_BYTES // 1024} KiB")
            return []
        self.files += 1
        self.loaded.included.append(path)
        return self.expand(config_entries(text, path), depth + 1, (*stack, real))


def _kind(kind: str) -> str:
    return {"chr": "character device", "blk": "block device", "dir": "directory",
            "link": "symbolic link", "other": "FIFO or socket"}.get(kind, kind)


def load_entries(host: Host, entries: list[Entry], *, proxmox: bool,
                 cwd: str | None = None) -> Loaded:
    """Return ``entries`` with every lxc.include replaced by the settings it reads.

    ``proxmox``: the host runs Proxmox VE, whose userns.conf.d makes unprivileged
    containers a deny-list; it is assumed where that directory is not in the tree.
    ``cwd``: the directory LXC starts in, where it is known (a relative include is
    opened from there); None leaves relative includes unread.
    """
    loaded = Loaded()
    loaded.entries = _Reader(host, proxmox, loaded, cwd).expand(entries, 0, ())
    return loaded


def proxmox_entries(
    section: MainSection, path: str, dev_rules: list[tuple[str, str, str]]
) -> tuple[list[Entry], bool]:
    """Return the settings Proxmox writes for a container at ``pct start``, in its order.

    PVE::LXC ``update_lxc_config``: the distribution's common config (common.conf
    through ``<ostype>.common.conf``), the userns config for an unprivileged container,
    one ``lxc.cgroup2.devices.allow`` per devN entry at the numbers its node has at
    that moment (``dev_rules``: key, allow value, deny value or ""), and then the
    container's own ``lxc.*`` lines in their order. Returns the settings and whether
    the container is unprivileged.
    """
    values = {line.key: line.value or "" for line in section.lines if line.key}
    raw = [
        Entry(line.key, line.value or "", path, line, f"{path}:{line.number}")
        for line in section.lines
        if line.key is not None and line.key.startswith("lxc.")
        # PVE::LXC::Config parse_pct_config keeps this one for the init's environment.
        and line.key != "lxc.environment.runtime"
    ]
    unprivileged = values.get("unprivileged", "0").strip() == "1" or any(
        e.key == "lxc.idmap" for e in raw)
    ostype = values.get("ostype", "").strip()
    common = (f"{LXC_CONFIG_DIR}/{ostype}.common.conf"
              if _SAFE_NAME.fullmatch(ostype) else f"{LXC_CONFIG_DIR}/common.conf")
    generated = [Entry("lxc.include", common, origin=f"Proxmox's base for {ostype or 'it'}")]
    if unprivileged:
        userns = (f"{LXC_CONFIG_DIR}/{ostype}.userns.conf"
                  if _SAFE_NAME.fullmatch(ostype) else f"{LXC_CONFIG_DIR}/userns.conf")
        generated.append(Entry("lxc.include", userns, origin="Proxmox, unprivileged"))
    for key, allow, deny in dev_rules:
        generated.append(Entry("lxc.cgroup2.devices.allow", allow, origin=f"{key} in {path}"))
        if deny:
            generated.append(Entry("lxc.cgroup2.devices.deny", deny, origin=f"{key} in {path}"))
    return [*generated, *raw], unprivileged


def proxmox_common_conf(host: Host, ostype: str) -> str:
    """Return the common config Proxmox includes: ``<ostype>.common.conf`` if it exists."""
    if _SAFE_NAME.fullmatch(ostype):
        candidate = f"{LXC_CONFIG_DIR}/{ostype}.common.conf"
        if host.exists(candidate):
            return candidate
    return f"{LXC_CONFIG_DIR}/common.conf"


def running(host: Host, name: str) -> bool:
    """Return whether a container of this name has a cgroup, that is, runs now."""
    if not _SAFE_NAME.fullmatch(name):
        return False
    return any(host.exists(f"{d.format(name=name)}/cgroup.type") for d in CGROUP_V2_DIRS) or any(
        host.exists(p.format(name=name)) for p in CGROUP_V1_LISTS)


def devices_list(host: Host, name: str) -> tuple[str, str] | None:
    """Return (path, text) of a running container's cgroup v1 ``devices.list``, or None."""
    if not _SAFE_NAME.fullmatch(name):
        return None
    for pattern in CGROUP_V1_LISTS:
        path = pattern.format(name=name)
        text = host.read_optional(path)
        if text is not None:
            return path, text
    return None


def parse_devices_list(text: str) -> list[DeviceRule]:
    """Parse a cgroup v1 ``devices.list``: what the group may access, one rule a line.

    The kernel prints ``a *:* rwm`` alone when the group allows everything
    (security/device_cgroup.c ``devcgroup_seq_show``), else each allowed exception.
    """
    rules: list[DeviceRule] = []
    for raw in text.splitlines()[:4096]:
        parsed = parse_device_rule(raw)
        if parsed is not None:
            rules.append(parsed)
    return rules


def environment_of(entries: list[Entry]) -> dict[str, str]:
    """Return the environment LXC gives hooks: ``lxc.environment`` and ``.hooks``, in order.

    An empty value clears what came before (confile.c ``set_config_environment_impl``);
    a name without ``=`` inherits LXC's own environment, unknown here.
    """
    env: dict[str, str] = {}
    for entry in entries:
        if entry.key not in ("lxc.environment", "lxc.environment.hooks"):
            continue
        if not entry.value:
            env.clear()
            continue
        name, sep, value = entry.value.partition("=")
        if sep:
            env[name.strip()] = value
    return env


def mount_hooks(entries: list[Entry]) -> list[Entry]:
    """Return the ``lxc.hook.mount`` settings LXC runs (an empty value clears them)."""
    hooks: list[Entry] = []
    for entry in entries:
        if entry.key != "lxc.hook.mount":
            continue
        if not entry.value:
            hooks.clear()
        else:
            hooks.append(entry)
    return hooks
