"""Reading a host's files as the driver checks do: regular files only, bounded.

A sysroot or a capture can put a FIFO, a device node or a socket where a configuration
file is expected (``/etc/cdi/nvidia.yaml`` as a FIFO blocks a reader forever): the checks
read a path only when it is a regular file once its symlinks are followed (sysfs and procfs
attributes are regular files).
"""

from __future__ import annotations

from auditor.hosts.base import Host

DEFAULT_LIMIT = 1 << 20


def regular(host: Host, path: str) -> bool:
    """Return whether ``path`` is a regular file (following symlinks, inside the host)."""
    entry = host.stat(path)
    return entry is not None and entry.kind == "file"


def read_bytes(host: Host, path: str, limit: int = DEFAULT_LIMIT) -> bytes | None:
    """Return at most ``limit`` bytes of a regular file, or None (missing, not a file...)."""
    if not regular(host, path):
        return None
    try:
        return host.read_bytes(path, limit)
    except OSError:
        return None


def read_text(host: Host, path: str, limit: int = DEFAULT_LIMIT) -> str | None:
    """Return a regular file's text (bytes that are not UTF-8 replaced), or None."""
    data = read_bytes(host, path, limit)
    return data.decode("utf-8", "replace") if data is not None else None


def read_optional(host: Host, path: str) -> str | None:
    """Return a regular file's stripped text, or None: ``Host.read_optional`` for files only."""
    text = read_text(host, path)
    return text.strip() if text is not None else None
