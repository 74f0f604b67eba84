"""One exception tree; only the CLI turns these into messages and exit codes."""

from __future__ import annotations


class AuditorError(Exception):
    """Base of every error host-auditor raises on purpose."""

    exit_code = 3


class UsageError(AuditorError):
    """The command line or an input file named something that does not exist or is malformed."""

    exit_code = 2


class PolicyError(UsageError):
    """A policy file could not be read or does not match the checks."""


class SnapshotError(UsageError):
    """A sysroot directory or capture cannot be read."""


class HostUnreachable(AuditorError):
    """A remote host could not be reached or stopped answering."""


class HostKeyRejected(AuditorError):
    """A remote host's key is unknown or has changed."""


class AuthenticationFailed(AuditorError):
    """A remote host refused every credential offered."""
