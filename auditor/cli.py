"""The ``audit`` command line: the only place errors become messages and exit codes.

Exit codes: 0 nothing at or above ``--fail-on``; 1 findings at or above it;
2 usage error (unknown check id, bad option, unreadable root or policy);
3 a target could not be audited.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from auditor.errors import AuditorError
from auditor.model import FailOn, Report

if TYPE_CHECKING:
    from auditor.check import Check
    from auditor.policy import Policy

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

app = typer.Typer(
    name="audit",
    help="Audit and tune GPU / LLM-inference Linux hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def fatal(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with ``code``."""
    print(f"audit: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


FormatOpt = Annotated[
    str,
    typer.Option("--format", "-f", help="text, json, markdown, html, junit or prometheus.",
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


def prepare(options: AuditOptions) -> tuple[list[type[Check]], Policy]:
    """Return the selected check classes and the policy, or raise a usage error."""
    from auditor.errors import UsageError
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
    """Write rendered text to a file, or to stdout."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        fatal(f"{output}: cannot write report ({exc.strerror})", EXIT_USAGE)


def emit(reports: Sequence[Report], options: AuditOptions) -> int:
    """Render and write the reports; return the exit code they call for."""
    from auditor.render import render_reports

    colour = (
        options.fmt == "text"
        and (options.output in (None, "-"))
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
    )
    text = render_reports(reports, options.fmt, fail_on=options.fail_on, colour=colour)
    write_output(text, options.output)
    codes = [r.exit_code(options.fail_on) for r in reports]
    if EXIT_UNREACHABLE in codes:
        return EXIT_UNREACHABLE
    return max(codes, default=EXIT_OK)


@app.command("local")
def local_command(
    root: Annotated[
        str | None,
        typer.Option("--root", help="Audit a sysroot: a directory or a .tar.gz capture.",
                     metavar="PATH"),
    ] = None,
    fmt: FormatOpt = "text",
    output: OutputOpt = None,
    check: CheckOpt = None,
    skip: SkipOpt = None,
    fail_on: FailOnOpt = FailOn.FAIL,
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    debug: DebugOpt = False,
    fix_script: FixScriptOpt = None,
    rollback_script: RollbackScriptOpt = None,
    apply: Annotated[bool, typer.Option("--apply", help="Run the fix, then audit again and "
                                        "show before and after.")] = False,
    yes: YesOpt = False,
) -> None:
    """Audit this machine, or a captured sysroot with --root."""
    options = AuditOptions(fmt, output, tuple(check or ()), tuple(skip or ()), fail_on,
                           policy, profile, debug)
    try:
        from auditor.hosts import LocalHost, open_sysroot
        from auditor.runner import audit

        checks, loaded = prepare(options)
        host = open_sysroot(root) if root is not None else LocalHost()
        fix_code = EXIT_OK
        with host:
            report = audit(host, checks, loaded, debug=debug)
            if fix_script or rollback_script or apply:
                from auditor.fix import LocalFixRequest, fix_local

                report, fix_code = fix_local(
                    host, report, checks, loaded,
                    LocalFixRequest(root, fix_script, rollback_script, apply, yes),
                    reopen=lambda: open_sysroot(root) if root is not None else LocalHost(),
                    debug=debug,
                )
    except AuditorError as exc:
        if debug:
            raise
        fatal(str(exc), exc.exit_code)
    raise typer.Exit(max(emit([report], options), fix_code))


@app.command("checks")
def checks_command() -> None:
    """List the checks with id, severity and one line each."""
    from auditor.registry import load_checks

    try:
        classes = load_checks()
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)
    width = max(len(c.id) for c in classes)
    for cls in classes:
        print(f"{cls.id.ljust(width)}  {cls.severity.value:<8}  {cls.summary()}")


@app.command("explain")
def explain_command(check_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Explain what a check looks at, why it matters for inference, and how it is fixed."""
    import textwrap

    from auditor.registry import load_checks

    try:
        classes = {c.id: c for c in load_checks()}
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)
    if check_id not in classes:
        fatal(f"unknown check id {check_id!r} (known: {', '.join(sorted(classes))})", EXIT_USAGE)
    cls = classes[check_id]

    def para(text: str) -> str:
        return textwrap.fill(" ".join(text.split()), width=88, initial_indent="  ",
                             subsequent_indent="  ")

    lines = [f"{cls.id}  ({cls.severity.value})", "", para(cls.summary()), "", "Looks at:"]
    lines += [f"  {pattern}" for pattern in cls.reads]
    lines += ["", "Why it matters for inference:", para(cls.rationale), "", "How it is fixed:",
              para(cls.remedy)]
    if cls.defaults:
        lines += ["", "Policy options (defaults):"]
        lines += [f"  {key} = {value!r}" for key, value in cls.defaults.items()]
    print("\n".join(lines))



def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``audit`` command; return its exit code."""
    try:
        app(args=list(argv) if argv is not None else None, prog_name="audit",
            standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        print("audit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``audit ... | head``): not an error of the audit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return EXIT_OK


from auditor import cli_host  # noqa: E402, F401 - registers ``audit host``
from auditor.cli_fleet import register as register_fleet_commands  # noqa: E402

register_fleet_commands(app)


if __name__ == "__main__":
    # Under ``python -m`` this file is ``__main__``, a copy apart from ``auditor.cli``;
    # the command modules registered on the imported one, so run that.
    from auditor.cli import main as registered_main

    sys.exit(registered_main())
