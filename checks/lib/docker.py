"""Docker's daemon configuration as its file shows it: ``/etc/docker/daemon.json``.

Shared by ``ipc.shm`` (``default-shm-size``), ``rdma.memlock`` (``default-ulimits``) and
``container.toolkit`` (the ``nvidia`` runtime, ``exec-opts`` and the cgroup driver). The
file is one JSON object (dockerd(8), "Daemon configuration file"); sizes are go-units'
``RAMInBytes`` strings (``64m``, ``1g``, ``16GiB``: binary multiples, case-insensitive).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

DAEMON_JSON = "/etc/docker/daemon.json"
#: The daemon itself: Docker is installed where one of these exists.
DOCKERD = ("/usr/bin/dockerd", "/usr/sbin/dockerd", "/usr/local/bin/dockerd")
READS: tuple[str, ...] = (DAEMON_JSON, *DOCKERD)
#: Docker's own default for a container's /dev/shm (moby/moby PR #16168: 64 MiB).
DEFAULT_SHM_BYTES = 64 << 20
_MAX_BYTES = 1 << 20
#: go-units ``RAMInBytes``: a number, an optional binary unit, an optional ``i`` and ``b``.
_SIZE = lazy_re(r"([0-9]{1,15}(?:\.[0-9]{1,6})?) ?([kmgtp]?)i?b?", 0)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


class DaemonConfig(NamedTuple):
    """What daemon.json says, and whether Docker is installed at all."""

    #: Docker's daemon binary or its configuration file exists.
    installed: bool
    #: The file exists.
    present: bool
    #: The parsed object ({} when the file is absent); None when it does not parse.
    values: dict[str, Any] | None
    #: Why it does not parse ("" when it does).
    error: str = ""


def parse_size(text: object) -> int | None:
    """Return a go-units size (``64m``, ``1g``, ``16GiB``, a plain byte count) in bytes."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text >= 0 else None
    if not isinstance(text, str):
        return None
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _read(host: Host) -> DaemonConfig:
    installed = any(host.exists(p) for p in DOCKERD)
    if not host.exists(DAEMON_JSON):
        return DaemonConfig(installed, False, {})
    text = files.read_text(host, DAEMON_JSON, _MAX_BYTES)
    if text is None:
        return DaemonConfig(True, True, None, "not a readable regular file")
    try:
        values = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError) as error:
        return DaemonConfig(True, True, None, f"not valid JSON ({str(error)[:80]})")
    if not isinstance(values, dict):
        return DaemonConfig(True, True, None, "not a JSON object")
    return DaemonConfig(True, True, values)


def daemon_config(host: Host) -> DaemonConfig:
    """Return Docker's daemon configuration, read once per host."""
    return host.fact("docker.daemon", _read)


def with_values(config: DaemonConfig, **changes: Any) -> str:
    """Return daemon.json's text with some top-level keys set (others kept, in order)."""
    values = dict(config.values or {})
    values.update(changes)
    return json.dumps(values, indent=2) + "\n"
