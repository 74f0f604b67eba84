"""Backends of the host seam, one module per way of reaching a machine."""

from __future__ import annotations

import os

from auditor.errors import SnapshotError
from auditor.hosts.base import Entry, Host
from auditor.hosts.local import DirectoryHost, LocalHost

__all__ = ["DirectoryHost", "Entry", "Host", "LocalHost", "open_sysroot"]


def open_sysroot(path: str) -> Host:
    """Open a sysroot given as a directory or a tar capture (``.tar``, ``.tar.gz``)."""
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise SnapshotError(f"{path}: sysroot directory is not readable")
        return DirectoryHost(path)
    if os.path.isfile(path):
        from auditor.hosts.archive import ArchiveHost

        return ArchiveHost.from_path(path)
    raise SnapshotError(f"{path}: no such sysroot directory or capture file")
