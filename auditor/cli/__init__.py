"""The ``audit`` command line.

The commands live in :mod:`auditor.cli.local`, :mod:`auditor.cli.host` and
:mod:`auditor.cli.fleet` as plain functions, registered on :data:`app` here;
what they share (options, the error -> exit code table, output) is
:mod:`auditor.cli.options`. Exit codes are documented there and in the README.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import typer

from auditor.cli import fleet, host, local
from auditor.cli.options import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from auditor.text import printable

app = typer.Typer(
    name="audit",
    help="Audit and tune GPU / LLM-inference Linux hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("local")(local.local_command)
app.command("checks")(local.checks_command)
app.command("explain")(local.explain_command)
app.command("host")(host.host_command)
app.command("snapshot")(fleet.snapshot_command)
app.command("fingerprint")(fleet.fingerprint_command)
app.command("merge")(fleet.merge_command)
app.command("watch")(fleet.watch_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``audit`` command; return its exit code."""
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        app(args=args, prog_name="audit", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        print("audit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
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
    return EXIT_OK
