"""sysctl settings as the boot applies them, and the other mechanisms that set one at boot.

Shared by ``numa.balancing`` (what the boot will set, and who) and its remediation
(which lines to change so the boot sets the value wanted).

- systemd-sysctl, which applies sysctls at boot (Debian's ``procps.service`` is an
  alias of it), reads every ``*.conf`` of /etc/sysctl.d, /run/sysctl.d,
  /usr/local/lib/sysctl.d and /usr/lib/sysctl.d (and /lib/sysctl.d where /usr is
  split), a name in an earlier directory masking it in a later one, all sorted by file
  name; a later line overwrites an earlier one (src/sysctl/sysctl.c ``parse_file``,
  ``conf_files_list_nulstr``; sysctl.d(5): "Files in /etc/ override files with the same
  name in /run/, /usr/local/lib/, and /usr/lib/ ... All configuration files are sorted by
  their filename in lexicographic order, regardless of which of the directories they
  reside in. If multiple files specify the same option, the entry in the file with the
  lexicographically latest name will take precedence"). It has not read /etc/sysctl.conf
  since v207: that file counts only through a ``99-sysctl.conf`` symlink in a sysctl.d
  directory, at the place that name sorts to. Debian 13 and Proxmox VE 9 no longer ship the link.
- procps ``sysctl --system`` reads the same directories and then /etc/sysctl.conf
  last, but only when someone (or an init without systemd) runs it.
- Later at boot: a tuned profile's ``[sysctl]`` (then, with tuned's default
  ``reapply_sysctl``, /run/sysctl.d, /etc/sysctl.d and /etc/sysctl.conf again:
  tuned/plugins/plugin_sysctl.py ``_apply_system_sysctl``), a systemd unit or root's
  ``@reboot`` crontab running ``sysctl -w`` or ``echo > /proc/sys/...``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from auditor.checks.lib import tuned
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

#: Directories systemd-sysctl reads, in priority order: a file name in an earlier
#: directory masks the same name in a later one.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d",
               "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
#: What says the boot runs systemd (and so systemd-sysctl): its runtime directory, or
#: the unit file of systemd-sysctl.
SYSTEMD_EVIDENCE = ("/run/systemd/system", "/usr/lib/systemd/system/systemd-sysctl.service",
                    "/lib/systemd/system/systemd-sysctl.service")
#: Init scripts that run ``sysctl --system`` at boot where systemd does not (OpenRC, sysvinit).
PROCPS_INIT = ("/etc/init.d/sysctl", "/etc/init.d/procps")
CRONTABS = ("/var/spool/cron/crontabs/root", "/var/spool/cron/root", "/etc/crontab",
            "/etc/cron.d/*")
UNIT_DIR = "/etc/systemd/system"
#: Every path this module may read.
READS: tuple[str, ...] = (
    *(f"{d}/*.conf" for d in SYSCTL_DIRS),
    SYSCTL_CONF,
    *SYSTEMD_EVIDENCE,
    *PROCPS_INIT,
    *CRONTABS,
    f"{UNIT_DIR}/*.service",
    f"{UNIT_DIR}/*.wants/*",
    *tuned.READS,
)

_MAX_LINES = 4096
_MAX_LINE = 4096
_VALUE = lazy_re(r"[0-9A-Za-z_.:-]{1,64}")


class Setting(NamedTuple):
    """One line of a sysctl file that sets a key."""

    path: str
    #: 1-based line number.
    line: int
    #: The line as written.
    raw: str
    value: str

    @property
    def where(self) -> str:
        """Return ``path:line``."""
        return f"{self.path}:{self.line}"


class Writer(NamedTuple):
    """Something that sets a sysctl at boot, and the value it sets."""

    #: ``cmdline``, ``sysctl.d``, ``tuned``, ``unit`` or ``cron``: also the order at boot.
    mechanism: str
    value: str
    #: Where it is written (``file:line``, or a description).
    where: str
    #: How a report names it.
    label: str
    #: The sysctl file line, for a ``sysctl.d`` writer.
    setting: Setting | None = None


def normalise(key: str) -> str:
    """Return a sysctl name with dots (``kernel/numa_balancing`` as ``kernel.numa_balancing``)."""
    return key.strip().lstrip("-").replace("/", ".")


def booted_by_systemd(host: Host) -> bool:
    """Return whether sysctls are applied at boot by systemd-sysctl (the usual case).

    Only an init script that runs ``sysctl --system`` and no trace of systemd says
    otherwise; a tree with neither is taken as systemd's.
    """
    if any(host.exists(path) for path in SYSTEMD_EVIDENCE):
        return True
    return not any(host.exists(path) for path in PROCPS_INIT)


def sysctl_files(host: Host, *, systemd: bool = True, dirs: tuple[str, ...] = SYSCTL_DIRS
                 ) -> list[str]:
    """Return the sysctl files the boot applies, in the order they are applied.

    ``systemd``: as systemd-sysctl (the sysctl.d directories only); otherwise as
    ``sysctl --system``, which applies /etc/sysctl.conf after them.
    """
    chosen: dict[str, str] = {}
    for directory in dirs:
        for path in host.glob(f"{directory}/*.conf"):
            chosen.setdefault(path.rsplit("/", 1)[1], path)
    ordered = [chosen[name] for name in sorted(chosen)]
    if not systemd and host.exists(SYSCTL_CONF):
        ordered.append(SYSCTL_CONF)
    return ordered


def settings_in(text: str, key: str, path: str = "") -> list[Setting]:
    """Return every line of a sysctl file's text that sets ``key`` (``a.b`` or ``a/b``)."""
    wanted = normalise(key)
    found: list[Setting] = []
    for number, raw in enumerate(text.split("\n")[:_MAX_LINES], start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        if sep and normalise(name) == wanted:
            found.append(Setting(path, number, raw, value.strip()))
    return found


def settings(host: Host, key: str, *, systemd: bool = True) -> list[Setting]:
    """Return every line that sets ``key`` in the files boot applies, in the order applied."""
    found: list[Setting] = []
    for path in sysctl_files(host, systemd=systemd):
        try:
            text = host.read_text(path)
        except OSError:
            continue
        found.extend(settings_in(text, key, path))
    return found


def boot_value(host: Host, key: str, *, systemd: bool | None = None) -> Setting | None:
    """Return the setting boot applies last for a key, or None when no file sets it."""
    if systemd is None:
        systemd = booted_by_systemd(host)
    found = settings(host, key, systemd=systemd)
    return found[-1] if found else None


def unread_sysctl_conf(host: Host, key: str) -> list[Setting]:
    """Return /etc/sysctl.conf's lines for ``key`` when systemd-sysctl does not read it.

    It does only through a link to it among the sysctl.d files (``99-sysctl.conf``).
    """
    for path in sysctl_files(host):
        try:
            if host.resolve(path) == host.resolve(SYSCTL_CONF):
                return []
        except OSError:
            continue
    try:
        return settings_in(host.read_text(SYSCTL_CONF), key, SYSCTL_CONF)
    except OSError:
        return []


# -- other mechanisms that set a sysctl at boot ---------------------------------------------


def _commands(text: str) -> list[str]:
    return [part.strip() for part in re.split(r"&&|\|\||;|\n", text[:_MAX_LINE]) if part.strip()]


def command_sets(command: str, key: str) -> str | None:
    """Return the value a shell command writes to sysctl ``key``, or None if it does not.

    Knows ``sysctl [-w|-q] key=value`` and ``echo value > /proc/sys/key`` (also through
    ``tee``, and inside ``sh -c '...'``), the forms a crontab or a unit uses.
    """
    wanted = normalise(key)
    proc = "/proc/sys/" + wanted.replace(".", "/")
    unquoted = command[:_MAX_LINE].replace("'", " ").replace('"', " ")
    for part in _commands(unquoted):
        words = part.replace(">", " > ").replace("|", " | ").split()[:64]
        names = [w.rsplit("/", 1)[-1] for w in words]
        if "sysctl" in names:
            for word in words[names.index("sysctl") + 1:]:
                name, sep, value = word.partition("=")
                if sep and normalise(name) == wanted and _VALUE.fullmatch(value):
                    return value
        if proc in words:
            target = words.index(proc)
            if target < 1 or words[target - 1] not in (">", "tee"):
                continue
            echo = max((i for i in range(target) if names[i] in ("echo", "printf")),
                       default=-1)
            values = [w for w in words[echo + 1:target] if not w.startswith("-")]
            if echo >= 0 and values and _VALUE.fullmatch(values[0]):
                return values[0]
    return None


def cron_writers(host: Host, key: str) -> list[Writer]:
    """Return the ``@reboot`` crontab lines of root or the system that set ``key``."""
    found: list[Writer] = []
    for pattern in CRONTABS:
        for path in host.glob(pattern) if "*" in pattern else [pattern]:
            text = host.read_optional(path)
            if text is None:
                continue
            system = not path.startswith("/var/spool/")
            for number, raw in enumerate(text.split("\n")[:_MAX_LINES], start=1):
                words = raw.strip().split(None, 2 if system else 1)
                if not words or words[0] != "@reboot" or len(words) < (3 if system else 2):
                    continue
                value = command_sets(words[-1], key)
                if value is not None:
                    owner = "root's crontab" if not system else "the system crontab"
                    found.append(Writer("cron", value, f"{path}:{number}",
                                        f"an @reboot line of {owner} ({path}:{number})"))
    return found


def unit_writers(host: Host, key: str) -> list[Writer]:
    """Return the enabled local systemd units whose commands set ``key``."""
    found: list[Writer] = []
    for path in host.glob(f"{UNIT_DIR}/*.service")[:512]:
        name = path.rsplit("/", 1)[1]
        if any(c in name for c in "*?[") or not host.glob(f"{UNIT_DIR}/*.wants/{name}"):
            continue
        text = host.read_optional(path)
        if text is None:
            continue
        for number, raw in enumerate(text.split("\n")[:_MAX_LINES], start=1):
            directive, sep, command = raw.strip().partition("=")
            if not sep or directive.strip() not in ("ExecStart", "ExecStartPre",
                                                    "ExecStartPost"):
                continue
            value = command_sets(command.lstrip("-@:+!"), key)
            if value is not None:
                found.append(Writer("unit", value, f"{path}:{number}",
                                    f"the systemd unit {name} ({path}:{number})"))
    return found


def tuned_writers(host: Host, key: str) -> list[Writer]:
    """Return what tuned sets ``key`` to at boot, where its active profile sets it."""
    state = tuned.active(host)
    if state is None:
        return []
    found = state.sysctl.get(normalise(key))
    if found is None:
        return []
    value, where = found
    return [Writer("tuned", value, where,
                   f"tuned's active profile {state.profiles_text} ([sysctl] in {where})")]
