"""tuned: the active profile and what it sets at boot ([sysctl], [cpu] force_latency).

Shared by ``numa.balancing`` (a profile's ``[sysctl]`` sets a sysctl after
systemd-sysctl) and ``cpu.cstates`` (``force_latency`` holds a PM QoS limit through
/dev/cpu_dma_latency, which keeps deeper idle states unused). Profiles are read as
tuned reads them (tuned/consts.py, tuned/profiles): the names in
/etc/tuned/active_profile, each from the first of /etc/tuned/profiles, /etc/tuned,
/usr/lib/tuned/profiles, /usr/lib/tuned that has it, ``[main] include=`` profiles
first and the including profile's options over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from auditor.hosts.base import Host
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    import configparser

ACTIVE_PROFILE = "/etc/tuned/active_profile"
MAIN_CONF = "/etc/tuned/tuned-main.conf"
ENABLED = "/etc/systemd/system/multi-user.target.wants/tuned.service"
PROFILE_DIRS = ("/etc/tuned/profiles", "/etc/tuned", "/usr/lib/tuned/profiles", "/usr/lib/tuned")
READS: tuple[str, ...] = (ACTIVE_PROFILE, MAIN_CONF, ENABLED,
                          *(f"{d}/*/tuned.conf" for d in PROFILE_DIRS))

_NAME = lazy_re(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_MAX_DEPTH = 8
_MAX_TEXT = 256 * 1024


@dataclass
class Tuned:
    """What tuned's active profile sets, with where each option is written."""

    profiles: tuple[str, ...]
    #: sysctl name (dotted) -> (value, ``file``).
    sysctl: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: ``[cpu] force_latency`` -> (value as written, ``file``), or None.
    force_latency: tuple[str, str] | None = None
    #: tuned re-applies /run/sysctl.d, /etc/sysctl.d and /etc/sysctl.conf after its own
    #: [sysctl] (``reapply_sysctl``, on by default).
    reapply_sysctl: bool = True

    @property
    def profiles_text(self) -> str:
        """Return the active profile names as tuned-adm shows them."""
        return " ".join(self.profiles)


def profile_file(host: Host, name: str) -> str | None:
    """Return the tuned.conf of a profile, the first directory that has it winning."""
    if not _NAME.fullmatch(name):
        return None
    for directory in PROFILE_DIRS:
        path = f"{directory}/{name}/tuned.conf"
        if host.exists(path):
            return path
    return None


def _parse(text: str) -> configparser.ConfigParser | None:
    import configparser  # only where a tuned profile is read

    parser = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",),
                                       comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text[:_MAX_TEXT])
    except configparser.Error:
        return None
    return parser


def _sections(parser: configparser.ConfigParser, plugin: str) -> list[str]:
    """Return the sections that configure ``plugin`` (named so, or with ``type=plugin``)."""
    return [s for s in parser.sections()
            if s == plugin or parser.get(s, "type", fallback="").strip() == plugin]


def _load(host: Host, name: str, state: Tuned, depth: int, seen: set[str]) -> None:
    if depth > _MAX_DEPTH or name in seen:
        return
    seen.add(name)
    path = profile_file(host, name)
    if path is None:
        return
    text = host.read_optional(path)
    parser = _parse(text or "")
    if parser is None:
        return
    for include in parser.get("main", "include", fallback="").split(","):
        include = include.strip()
        if include and "${" not in include:
            _load(host, include, state, depth + 1, seen)
    for section in _sections(parser, "sysctl"):
        for key, value in parser.items(section):
            if key == "type" or "${" in value:
                continue
            state.sysctl[key.strip().replace("/", ".")] = (value.strip(), path)
    for section in _sections(parser, "cpu"):
        if not parser.has_option(section, "force_latency"):
            continue
        value = parser.get(section, "force_latency")
        if "${" not in value:
            state.force_latency = (value.strip(), path)


def processes(host: Host) -> frozenset[str] | None:
    """Return the names of running processes, listed once per host (several checks ask)."""
    return host.fact("processes", lambda h: h.processes())


def active(host: Host) -> Tuned | None:
    """Return what tuned's active profile sets, or None when tuned does not run at boot.

    tuned counts when its unit is enabled or its daemon is seen running. Read once per host.
    """
    return host.fact("tuned", _active)


def _active(host: Host) -> Tuned | None:
    names = (host.read_optional(ACTIVE_PROFILE) or "").split()
    if not names:
        return None
    running = processes(host)
    if not (host.exists(ENABLED) or (running is not None and "tuned" in running)):
        return None
    state = Tuned(tuple(n for n in names[:8] if _NAME.fullmatch(n)))
    main = _parse("[main]\n" + (host.read_optional(MAIN_CONF) or ""))
    if main is not None:
        flag = main.get("main", "reapply_sysctl", fallback="1").strip().lower()
        state.reapply_sysctl = flag not in ("0", "false", "no", "off")
    seen: set[str] = set()
    for name in state.profiles:
        _load(host, name, state, 0, seen)
    return state
