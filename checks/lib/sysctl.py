"""sysctl settings as the boot applies them: the drop-in directories and the lines that set a key.

Shared by ``numa.balancing`` (what the boot will set) and its remediation (which lines
to change so the boot sets 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.hosts.base import Host

#: Directories systemd-sysctl reads, in priority order: a file name in an earlier
#: directory masks the same name in a later one.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
#: Every path :func:`sysctl_files` may return.
READS: tuple[str, ...] = (*(f"{d}/*.conf" for d in SYSCTL_DIRS), SYSCTL_CONF)


@dataclass(frozen=True)
class Setting:
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


def sysctl_files(host: Host) -> list[str]:
    """Return the sysctl files boot applies, in the order they are applied."""
    chosen: dict[str, str] = {}
    for directory in SYSCTL_DIRS:
        for path in host.glob(f"{directory}/*.conf"):
            chosen.setdefault(path.rsplit("/", 1)[1], path)
    ordered = [chosen[name] for name in sorted(chosen)]
    if host.exists(SYSCTL_CONF):
        ordered.append(SYSCTL_CONF)
    return ordered


def settings_in(text: str, key: str, path: str = "") -> list[Setting]:
    """Return every line of a sysctl file's text that sets ``key`` (``a.b`` or ``a/b``)."""
    wanted = key.replace("/", ".")
    found: list[Setting] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        if sep and name.strip().lstrip("-").replace("/", ".") == wanted:
            found.append(Setting(path, number, raw, value.strip()))
    return found


def settings(host: Host, key: str) -> list[Setting]:
    """Return every line that sets ``key`` in the files boot applies, in the order applied."""
    found: list[Setting] = []
    for path in sysctl_files(host):
        try:
            text = host.read_text(path)
        except OSError:
            continue
        found.extend(settings_in(text, key, path))
    return found


def boot_value(host: Host, key: str) -> Setting | None:
    """Return the setting boot applies last for a key, or None when no file sets it."""
    found = settings(host, key)
    return found[-1] if found else None
