"""What the ``audit`` commands share: options, the error -> exit code table, output.

Exit codes: 0 nothing at or above ``--fail-on``; 1 findings at or above it (or a
fix that failed or was refused); 2 usage error (unknown check id, bad option,
unreadable root, policy or inventory); 3 a target could not be audited; 4 an
internal error (a defect of host-auditor; ``--debug`` shows the traceback);
130 interrupted.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from auditor.errors import AuditorError, UsageError
from auditor.model import FailOn, Report

if TYPE_CHECKING:
    from auditor.check import CheckClass
    from auditor.hosts.ssh import SshOptions
    from auditor.policy import Policy

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130

#: Each error class's exit code, most specific first: the one place errors become codes.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UsageError, EXIT_USAGE),
    (AuditorError, EXIT_UNREACHABLE),
)


def exit_code_of(error: BaseException) -> int:
    """Return the exit code an error ends the command with."""
    for kind, code in EXIT_CODES:
        if isinstance(error, kind):
            return code
    return EXIT_INTERNAL


def fatal(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with ``code``."""
    print(f"audit: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def note(message: str) -> None:
    """Print one line of information to stderr."""
    print(f"audit: {message}", file=sys.stderr)


@contextlib.contextmanager
def handle_errors(debug: bool = False) -> Iterator[None]:
    """Turn an auditor error into one line on stderr and its exit code (``--debug`` re-raises)."""
    try:
        yield
    except AuditorError as exc:
        if debug:
            raise
        fatal(" ".join(str(exc).split()), exit_code_of(exc))


# -- options every auditing command declares ------------------------------------------------

FormatOpt = Annotated[
    str,
    typer.Option("--format", "-f", help="text, json, markdown, html, junit, prometheus, line "
                 "(one line per host, at most 80 bytes) or nfd (node-feature-discovery labels).",
                 metavar="FORMAT"),
]
OutputOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the report to FILE.", metavar="FILE")
]
CheckOpt = Annotated[
    list[str] | None, typer.Option("--check", help="Run only this check id (repeatable).")
]
SkipOpt = Annotated[
    list[str] | None, typer.Option("--skip", help="Skip this check id (repeatable).")
]
FailOnOpt = Annotated[
    FailOn, typer.Option("--fail-on", help="Lowest status that exits 1: warning or fail.")
]
PolicyOpt = Annotated[
    str | None, typer.Option("--policy", help="TOML policy file of thresholds and waivers.",
                             metavar="FILE")
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="Built-in profile: gpu-inference, latency, throughput."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Re-raise a failing check's exception.")]
RootOpt = Annotated[
    str | None,
    typer.Option("--root", help="Audit a sysroot: a directory or a .tar.gz capture.",
                 metavar="PATH"),
]
FixScriptOpt = Annotated[
    str | None, typer.Option("--fix-script", help="Write a bash script that fixes the "
                             "findings (a dry run: nothing changes).", metavar="FILE")
]
RollbackScriptOpt = Annotated[
    str | None, typer.Option("--rollback-script", help="Write the script that undoes the "
                             "fix (default: FILE.rollback.sh beside --fix-script).",
                             metavar="FILE")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")]

# -- how to reach hosts over SSH (audit host, audit snapshot) --------------------------------

UserOpt = Annotated[str | None, typer.Option("--user", "-u", help="Log in as USER.")]
PortOpt = Annotated[int | None, typer.Option(
    "--port", "-p", min=1, max=65535, help="SSH port (default 22 or the ssh config's).")]
IdentityOpt = Annotated[str | None, typer.Option(
    "--identity", metavar="KEYFILE", help="Private key to offer.")]
SudoOpt = Annotated[bool, typer.Option(
    "--sudo", help="Collect under 'sudo -n' (full PCI config space); without a password-less "
                   "sudo the audit goes on unprivileged and says so.")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", min=0.1, help="Seconds for connecting and for the command.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys",
    help="Trust an unknown host key on first use and record it in known_hosts (a changed key "
         "is still refused).")]
KnownHostsOpt = Annotated[str | None, typer.Option(
    "--known-hosts", metavar="FILE", help="Also trust the keys in FILE (and record new ones "
                                          "there).")]
SshConfigOpt = Annotated[str | None, typer.Option(
    "--ssh-config", metavar="FILE", help="Read this ssh config instead of ~/.ssh/config.")]


def ssh_options(user: str | None, port: int | None, identity: str | None, sudo: bool,
                timeout: float, accept_new_host_keys: bool, known_hosts: str | None,
                ssh_config: str | None, root: str | None = None) -> SshOptions:
    """Return the SSH options the command line asked for."""
    from auditor.hosts.ssh import SshOptions

    return SshOptions(
        user=user, port=port, identity=identity, sudo=sudo, timeout=timeout,
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=(known_hosts,) if known_hosts else (), ssh_config=ssh_config, root=root,
    )


@dataclass(frozen=True)
class AuditOptions:
    """What every auditing command shares: selection, policy and output."""

    fmt: str = "text"
    output: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    fail_on: FailOn = FailOn.FAIL
    policy: str | None = None
    profile: str | None = None
    debug: bool = False

    @classmethod
    def of(cls, fmt: str = "text", output: str | None = None, check: list[str] | None = None,
           skip: list[str] | None = None, fail_on: FailOn = FailOn.FAIL,
           policy: str | None = None, profile: str | None = None,
           debug: bool = False) -> AuditOptions:
        """Build the options from a command's parameters (lists as typer passes them)."""
        return cls(fmt, output, tuple(check or ()), tuple(skip or ()), fail_on, policy,
                   profile, debug)


def prepare(options: AuditOptions) -> tuple[list[CheckClass], Policy]:
    """Return the selected check classes and the policy, or raise a usage error."""
    from auditor.policy import load_policy
    from auditor.registry import load_checks, select
    from auditor.render import FORMATS

    if options.fmt not in FORMATS:
        raise UsageError(f"unknown format {options.fmt!r} (formats: {', '.join(FORMATS)})")
    every = load_checks()
    checks = select(every, options.only, options.skip)
    if not checks:
        raise UsageError("no checks left to run after --check/--skip")
    policy = load_policy(every, options.policy, options.profile)
    return checks, policy


def write_output(text: str, output: str | None) -> None:
    """Write rendered text to stdout, or to a file through a dot-file and a rename."""
    from auditor.engines import write_atomic

    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_atomic(output, text)
    except OSError as exc:
        fatal(f"{output}: cannot write report ({exc.strerror})", EXIT_USAGE)


def exit_code(reports: Sequence[Report], fail_on: FailOn) -> int:
    """Return 3 if a host could not be audited, else 1 if a finding trips ``fail_on``, else 0."""
    codes = [r.exit_code(fail_on) for r in reports]
    if EXIT_UNREACHABLE in codes:
        return EXIT_UNREACHABLE
    return max(codes, default=EXIT_OK)


def emit(reports: Sequence[Report], options: AuditOptions) -> int:
    """Render and write the reports (several hosts: and the fleet table); return the exit code."""
    from auditor.render import render_fleet_table, render_reports

    colour = (
        options.fmt == "text"
        and (options.output in (None, "-"))
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
    )
    with handle_errors(options.debug):
        text = render_reports(reports, options.fmt, fail_on=options.fail_on, colour=colour)
    if options.fmt == "text" and len(reports) > 1:
        text += "\n" + render_fleet_table(reports, colour=colour)
    write_output(text, options.output)
    return exit_code(reports, options.fail_on)
