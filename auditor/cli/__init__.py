"""The ``audit`` command line.

The commands live in :mod:`auditor.cli.local`, :mod:`auditor.cli.host` and
:mod:`auditor.cli.fleet` as plain functions, registered on :data:`app` here;
what they share (options, the error -> exit code table, output) is
:mod:`auditor.cli.options`. Exit codes are documented there and in the README.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

# typer carries its own copy of click (typer._click, in every version pyproject allows):
# its exceptions are how a bad command line is told from the rest.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from auditor import __version__
from auditor.cli import fleet, host, local, options, probe
from auditor.cli.options import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    Terminated,
    interrupted_exit,
    raise_terminated,
    signal_name,
)
from auditor.text import printable

#: Every command, by name: the one table both command lines below are built from.
COMMANDS: dict[str, Callable[..., Any]] = {
    "local": local.local_command,
    "checks": local.checks_command,
    "explain": local.explain_command,
    "profiles": local.profiles_command,
    "completion": local.completion_command,
    "host": host.host_command,
    "snapshot": fleet.snapshot_command,
    "fingerprint": fleet.fingerprint_command,
    "merge": fleet.merge_command,
    "watch": fleet.watch_command,
    "probe": probe.probe_command,
}


def _print_version(value: bool) -> None:
    if value:
        print(f"audit (host-auditor) {__version__}")
        raise typer.Exit(EXIT_OK)


def _root(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version and exit.")] = False,
) -> None:
    """Audit and tune GPU / LLM-inference Linux hosts."""


def build(only: str | None = None) -> typer.Typer:
    """Return the ``audit`` command line: every command, or only the one named ``only``."""
    built = typer.Typer(
        name="audit",
        help="Audit and tune GPU / LLM-inference Linux hosts.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    built.callback()(_root)
    for name, function in COMMANDS.items():
        if only is None or name == only:
            built.command(name)(function)
    return built


#: The whole command line (``audit -h`` lists every command).
app = build()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``audit`` command; return its exit code."""
    args = list(argv) if argv is not None else sys.argv[1:]
    # typer builds every command's options from its signature on each start (~3 ms a
    # command): a command named first is run from a command line holding only it (its
    # help, options and errors are the same); anything else gets the whole one.
    if COMPLETE_ENV in os.environ:
        # The shell asks for completions (the script ``audit completion SHELL`` prints):
        # typer's shells are registered only then, so a plain run does not pay for them.
        from typer._completion_classes import completion_init

        completion_init()
    chosen = build(args[0]) if args and args[0] in COMMANDS else app
    # SIGTERM (a scheduler's time limit, systemd stopping a unit, kill) stops the run as
    # Ctrl-C does, so what was done is reported as such (exit 143), never lost in silence.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        options.nagios_emitted = False
        code = _run(chosen, args)
        # A Nagios/Icinga plugin says UNKNOWN (3) for bad arguments and its own faults, and
        # keeps 2 for CRITICAL.
        if code in (EXIT_USAGE, EXIT_INTERNAL) and _nagios(args) and not options.nagios_emitted:
            return NAGIOS_UNKNOWN
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


#: The variable click's shell completion reads (``_<PROG>_COMPLETE``).
COMPLETE_ENV = local.COMPLETE_ENV
#: The Nagios plugin state for an argument error or a fault of the plugin.
NAGIOS_UNKNOWN = 3


def _nagios(args: Sequence[str]) -> bool:
    """Return whether the command line asks for the Nagios plugin output."""
    for index, arg in enumerate(args):
        if arg in ("--format=nagios", "-fnagios"):
            return True
        if arg in ("--format", "-f") and index + 1 < len(args) and args[index + 1] == "nagios":
            return True
    return False


def _run(chosen: typer.Typer, args: list[str]) -> int:
    """Run a command line; turn every way it ends into an exit code and at most one line."""
    try:
        # Not standalone: a bad command line comes back as an exception, said in one line.
        code = chosen(args=args, prog_name="audit", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
        return EXIT_USAGE
    except ClickException as exc:
        hint = ""
        context = getattr(exc, "ctx", None)
        if context is not None:
            hint = f" (see {context.command_path} -h)"
        print(f"audit: error: {' '.join(exc.format_message().split())}{hint}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        print("audit: error: aborted", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except KeyboardInterrupt as exc:
        print(f"audit: {'terminated' if isinstance(exc, Terminated) else 'interrupted'} "
              f"({signal_name(exc)})", file=sys.stderr)
        return interrupted_exit(exc)
    except BrokenPipeError:
        # The reader went away (``audit ... | head``): not an error of the audit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        # A defect of host-auditor, not a finding: one line, its own exit code, and the
        # traceback only when asked for.
        if "--debug" in args:
            raise
        message = printable(" ".join(f"{type(exc).__name__}: {exc}".split())[:400])
        print(f"audit: internal error: {message} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
    return code if isinstance(code, int) else EXIT_OK
