"""systemd's own configuration files (logind.conf, system.conf) with their drop-ins.

Shared by ``ipc.shm`` (logind's ``RemoveIPC``) and ``rdma.memlock`` (``DefaultLimitMEMLOCK``).
As systemd.syntax(5) and e.g. logind.conf(5) say: the main file ``/etc/systemd/NAME.conf``
(newer systemd also ships ``/usr/lib/systemd/NAME.conf`` and reads the first of
``/etc``, ``/run``, ``/usr/local/lib``, ``/usr/lib``), then the drop-ins ``*.conf`` of
``NAME.conf.d`` in ``/etc/systemd``, ``/run/systemd``, ``/usr/local/lib/systemd`` and
``/usr/lib/systemd``, sorted by file name across them (a name in an earlier directory masks
it in a later one); a later assignment overrides an earlier one. The shipped main file lists
the compiled-in defaults as comments (``#RemoveIPC=yes``), which is how a capture tells a
distribution's default.
"""

from __future__ import annotations

from typing import NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host

BASES = ("/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd")
_MAX_LINES = 4096
_MAX_DROP_INS = 128


def reads(name: str) -> tuple[str, ...]:
    """Return the paths :func:`setting` reads for ``NAME.conf``."""
    return (*(f"{b}/{name}.conf" for b in BASES), *(f"{b}/{name}.conf.d/*.conf" for b in BASES))


class Assignment(NamedTuple):
    """One ``Key=value`` of a section, where it is written."""

    value: str
    path: str
    line: int

    @property
    def where(self) -> str:
        """Return ``path:line``."""
        return f"{self.path}:{self.line}"


class Setting(NamedTuple):
    """A key as systemd reads it: the assignment in effect, and the documented default."""

    #: The last assignment, None when no file sets the key.
    effective: Assignment | None
    #: The default the shipped main file documents in a comment ("" when none does).
    documented_default: str
    #: The files read, in order.
    sources: tuple[str, ...]


def _main_file(host: Host, name: str) -> str:
    return next((f"{b}/{name}.conf" for b in BASES if files.regular(host, f"{b}/{name}.conf")),
                "")


def _drop_ins(host: Host, name: str) -> list[str]:
    found: dict[str, str] = {}
    for base in BASES:
        for path in host.glob(f"{base}/{name}.conf.d/*.conf")[:_MAX_DROP_INS]:
            found.setdefault(path.rsplit("/", 1)[1], path)
    return [found[n] for n in sorted(found)]


def setting(host: Host, name: str, section: str, key: str) -> Setting:
    """Return how ``[section] key`` of systemd's ``name.conf`` ends up after every file."""
    main = _main_file(host, name)
    sources = ([main] if main else []) + _drop_ins(host, name)
    effective: Assignment | None = None
    documented = ""
    for path in sources:
        current = ""
        for number, raw in enumerate((files.read_text(host, path) or "").split("\n")[:_MAX_LINES],
                                     start=1):
            line = raw[:4096].strip()
            if line.startswith("[") and line.endswith("]"):
                current = line[1:-1].strip()
                continue
            if current != section:
                continue
            if line.startswith("#") and path == main:
                left, sep, right = line.lstrip("#").strip().partition("=")
                if sep and left.strip() == key and not documented:
                    documented = right.strip()
                continue
            if not line or line[0] in "#;":
                continue
            left, sep, right = line.partition("=")
            if sep and left.strip() == key:
                effective = Assignment(right.strip(), path, number)
    return Setting(effective, documented, tuple(sources))
