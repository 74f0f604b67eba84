"""One exception tree; only the CLI turns these into messages and exit codes.

Each error's message is one line that names what was wrong (a file, a host, an
option). The exit code each class maps to is the CLI's table
(:data:`auditor.cli.options.EXIT_CODES`), not an attribute here.
"""

from __future__ import annotations


class AuditorError(Exception):
    """Base of every error host-auditor raises on purpose."""


class UsageError(AuditorError):
    """The command line or an input file named something that does not exist or is malformed."""


class PolicyError(UsageError):
    """A policy file could not be read or does not match the checks."""


class SnapshotError(UsageError):
    """A sysroot directory or capture cannot be read."""


class RegistryError(UsageError):
    """A registered check class does not declare what the registry needs."""


class HostUnreachable(AuditorError):
    """A remote host could not be reached or stopped answering."""


class HostKeyRejected(AuditorError):
    """A remote host's key is unknown or has changed."""


class AuthenticationFailed(AuditorError):
    """A remote host refused every credential offered."""


class CollectError(HostUnreachable):
    """A remote collection answered with something that is not a collection."""
