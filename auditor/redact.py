"""What a snapshot keeps of the files that can hold secrets: only what the checks judge.

``audit snapshot`` keeps only the paths the selected checks declare in ``reads`` (the
allow-list); some of those are files where administrators also keep secrets. Of them a
capture keeps what the checks read and nothing else, line numbers unchanged (a dropped
line becomes a ``#`` comment), so a replay gives the same findings, naming the same lines:

- crontabs (root's, ``/etc/crontab``, ``/etc/cron.d``): only the ``@reboot`` commands that
  set a sysctl (``sysctl -w``, ``> /proc/sys/...``), which ``numa.balancing`` judges; every
  other job and every variable (``MAILTO``, tokens) is dropped, and a crontab with no such
  command is not kept at all;
- systemd unit files and drop-ins: the values of ``Environment=``, ``EnvironmentFile=``
  and the credential settings (``SetCredential=``, ``LoadCredential=``, ...);
- LXC, Incus and Proxmox container configs: the value of each ``lxc.environment``
  variable but the device selections the nvidia hook reads (``NVIDIA_VISIBLE_DEVICES``,
  ``NVIDIA_MIG_CONFIG_DEVICES``, ``NVIDIA_MIG_MONITOR_DEVICES``);
- in every file outside ``/proc``, ``/sys`` and ``/dev``: the user and password of a URL
  (``Acquire::http::Proxy "http://user:pass@proxy"`` in apt's configuration).

A value taken out is written ``(withheld)``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

#: A function of (line, whether the line before continues into it) -> (line kept, whether
#: it continues).
LineChange = Callable[[str, bool], tuple[str, bool]]
WITHHELD = "(withheld)"
#: Files read as crontabs: root's (``crontab -e``) and the system's (with a user field).
_USER_CRONTABS = ("/var/spool/cron/crontabs/", "/var/spool/cron/")
_SYSTEM_CRONTABS = ("/etc/crontab", "/etc/cron.d/")
#: Unit-file settings whose values are secrets or say where secrets are
#: (systemd.exec(5): "Environment", "Credentials").
_UNIT_SECRETS = frozenset({
    "Environment", "EnvironmentFile", "SetCredential", "SetCredentialEncrypted",
    "LoadCredential", "LoadCredentialEncrypted", "ImportCredential",
})
#: lxc.environment variables a check reads (LXC's hooks/nvidia): device selections.
KEPT_ENVIRONMENT = frozenset({
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
})
_UNIT_KEY = re.compile(r"\s*([A-Za-z]+)\s*=")
#: ``lxc.environment[.runtime|.hooks] = NAME=VALUE`` (``:`` in Proxmox's pct configs).
_LXC_ENVIRONMENT = re.compile(r"(\s*lxc\.environment(?:\.[a-z]{1,16})?\s*[=:]\s*)([^=\n]*)=")
#: A URL's user information (RFC 3986 ``userinfo@``), bounded.
_URL_USERINFO = re.compile(rb"([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^\s/@\"'<>;]{1,512}@")
#: What separates the commands of a crontab line (as checks/lib/sysctl.py splits them).
_COMMANDS = re.compile(r"&&|\|\||;")
_MAX_LINES = 65536


def redact(path: str, data: bytes) -> bytes | None:
    """Return what a snapshot keeps of the file at ``path``: ``data`` less its secrets, or
    None where nothing of it is kept."""
    if path.startswith(("/proc/", "/sys/", "/dev/")):
        return data
    if path.startswith(_USER_CRONTABS) or path.startswith(_SYSTEM_CRONTABS):
        kept = _crontab(data, system=path.startswith(_SYSTEM_CRONTABS))
        if kept is None:
            return None
        data = kept
    elif "/systemd/" in path:
        data = _lines(data, _unit_line)
    if b"lxc.environment" in data:
        data = _lines(data, _lxc_line)
    return _URL_USERINFO.sub(rb"\1" + WITHHELD.encode() + rb"@", data)


def _lines(data: bytes, change: LineChange) -> bytes:
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if len(lines) > _MAX_LINES:  # nothing reads past this: keep none of the rest
        lines = lines[:_MAX_LINES]
    out: list[str] = []
    carry = False
    for line in lines:
        changed, carry = change(line, carry)
        out.append(changed)
    return "\n".join(out).encode("utf-8", "surrogateescape")


def _unit_line(line: str, carry: bool) -> tuple[str, bool]:
    """Withhold the value of a secret-bearing unit setting, and of its continuation lines."""
    continues = line.rstrip().endswith("\\")
    if carry:
        return "#", continues
    match = _UNIT_KEY.match(line)
    if match is None or match.group(1) not in _UNIT_SECRETS:
        return line, False
    key = match.group(1)
    if key == "Environment":
        value = line[match.end():].rstrip().removesuffix("\\")
        try:
            words = shlex.split(value)
        except ValueError:
            words = []
        names = [word.split("=", 1)[0] for word in words]
        value = " ".join(f"{name}={WITHHELD}" for name in names if name.isidentifier())
        return f"{key}={value}", continues
    return f"{key}={WITHHELD}", continues


def _lxc_line(line: str, carry: bool) -> tuple[str, bool]:
    """Withhold the value of an ``lxc.environment`` variable a check does not read."""
    match = _LXC_ENVIRONMENT.match(line)
    if match is None or match.group(2).strip() in KEPT_ENVIRONMENT:
        return line, False
    return f"{match.group(1)}{match.group(2)}={WITHHELD}", False


def _crontab(data: bytes, *, system: bool) -> bytes | None:
    """Return the ``@reboot`` commands of a crontab that set a sysctl (other lines as ``#``:
    a reader that strips the text keeps their numbers), or None where it has none."""
    text = data.decode("utf-8", "surrogateescape")
    out: list[str] = []
    kept = False
    for line in text.split("\n")[:_MAX_LINES]:
        words = line.strip().split(None, 2 if system else 1)
        if not words or words[0] != "@reboot" or len(words) < (3 if system else 2):
            out.append("#")
            continue
        unquoted = words[-1].replace("'", " ").replace('"', " ")
        parts = [part.strip() for part in _COMMANDS.split(unquoted)
                 if "sysctl" in part or "/proc/sys/" in part]
        if not parts:
            out.append("#")
            continue
        kept = True
        out.append(" ".join([*words[:-1], "; ".join(parts)]))
    if not kept:
        return None
    return "\n".join(out).encode("utf-8", "surrogateescape")
