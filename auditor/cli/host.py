"""``audit host``: audit remote Linux hosts over SSH, one or hundreds at once.

Each host is reached with one SSH connection and one command (see
:mod:`auditor.hosts.ssh`); hosts are audited in parallel by
:class:`auditor.runner.FleetAudit`. A host that cannot be audited gets one line on
stderr and an error report (exit 3) while every other host is still audited.
fabric and paramiko are imported only when the command runs, so ``audit local``
does not pay for them.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from auditor.cli.options import (
    EXIT_USAGE,
    AcceptNewOpt,
    AuditOptions,
    CheckOpt,
    ColorOpt,
    DebugOpt,
    FailOnOpt,
    FixScriptOpt,
    FormatOpt,
    IdentityOpt,
    KnownHostsOpt,
    OutputOpt,
    PolicyOpt,
    PortOpt,
    ProfileOpt,
    QuietOpt,
    RollbackScriptOpt,
    SkipOpt,
    SshConfigOpt,
    SudoOpt,
    TimeoutOpt,
    UserOpt,
    VerboseOpt,
    YesOpt,
    emit,
    fatal,
    handle_errors,
    interrupted_exit,
    note,
    prepare,
    quiet,
    say,
    set_verbosity,
    signal_name,
    ssh_options,
)
from auditor.cli.probe import ProveOpt, ProveProbeOpt, prove_request
from auditor.errors import UsageError
from auditor.model import Report
from auditor.text import printable

if TYPE_CHECKING:
    from auditor.check import CheckClass
    from auditor.cli.fix import FixRequest
    from auditor.hosts.ssh import SshOptions, SshTarget
    from auditor.policy import Policy
    from auditor.probes.run import ProbeRequest
    from auditor.runner import FleetAudit


def _progress(total: int) -> tuple[Callable[[Report], None] | None, Callable[[], None]]:
    """Return a progress callback and a closer for a run of several hosts.

    On a terminal: a bar on stderr. Otherwise: one line on stderr per host that was
    audited (a host that could not be audited already has its error line).
    """
    if total < 2 or quiet():
        return None, lambda: None
    if not sys.stderr.isatty():
        done = 0

        def line(report: Report) -> None:
            nonlocal done
            done += 1
            if not report.error:
                say(f"audit: [{done}/{total}] {progress_line(report)}")

        return line, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("auditing", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(file=sys.stderr), transient=True)
    task = progress.add_task("hosts", total=total)
    progress.start()
    return (lambda report: progress.advance(task)), progress.stop


def progress_line(report: Report) -> str:
    """Return what one finished host's progress line says: the target, the hostname it
    reported where that differs, the status and the times."""
    from auditor.render import one_line

    timing = dict(report.timing)
    phases = ", ".join(f"{name} {timing[name]:.2f} s" for name in ("connect", "collect")
                       if name in timing)
    return (f"{one_line(report.identity)}: {report.status.value} "
            f"({report.duration_s:.2f} s{': ' + phases if phases else ''})")


def _stopped(fleet: FleetAudit, wanted: Sequence[SshTarget], options: AuditOptions,
             interruption: KeyboardInterrupt) -> int:
    """Report a fleet stopped by SIGINT or SIGTERM as such; return 130 or 143.

    The hosts finished are reported as usual; each host not audited is an error entry
    (``not audited: stopped by SIGTERM``), and the report is marked incomplete.
    """
    from auditor.render import NOT_AUDITED
    from auditor.runner import _error_report

    signal = signal_name(interruption)
    finished = list(fleet.reports)
    done = sum(1 for r in finished if r is not None)
    reports = [
        report if report is not None else _error_report(
            target, dt.datetime.now(dt.timezone.utc), 0.0,
            f"{NOT_AUDITED}: the run was stopped by {signal}", f"ssh://{target.host}")
        for target, report in zip(wanted, finished, strict=True)
    ]
    say(f"audit: {'terminated' if signal == 'SIGTERM' else 'interrupted'} ({signal}): {done} of "
        f"{len(wanted)} hosts audited; the report lists the rest as not audited")
    try:
        emit(reports, options, incomplete=signal)
    except typer.Exit:
        pass  # the output could not be written: said on stderr; the signal's code stands
    return interrupted_exit(interruption)


def _fix_remote(target: SshTarget, options: SshOptions, checks: Sequence[CheckClass],
                policy: Policy, audit_options: AuditOptions, request: FixRequest,
                probes: ProbeRequest | None = None) -> int:
    """Audit one host with the fix's extra reads, then write and/or apply its fix on the
    same connection."""
    import datetime as dt
    import time

    from auditor.cli.fix import fix
    from auditor.hosts.ssh import SshHost
    from auditor.registry import collected_paths
    from auditor.runner import audit, remote_report, sudo_fell_back

    patterns = collected_paths(checks, fix=True)
    with handle_errors(audit_options.debug), SshHost(target, options) as host:
        started_at, started = dt.datetime.now(dt.timezone.utc), time.perf_counter()
        host.connect()
        host.collect(patterns, keep_open=request.apply)
        report = remote_report(host, audit(host, checks, policy, debug=audit_options.debug),
                               started_at, time.perf_counter() - started)
        fell_back = sudo_fell_back(host, options.sudo)
        if fell_back:
            note(f"warning: {fell_back}")

        def reaudit() -> Report:
            again_at, again = dt.datetime.now(dt.timezone.utc), time.perf_counter()
            host.collect(patterns, keep_open=True)
            return remote_report(host, audit(host, checks, policy, debug=audit_options.debug),
                                 again_at, time.perf_counter() - again)

        def run_probes() -> Report:
            # The probes run on the fix's connection, as the login user (no sudo).
            from auditor.probes.run import SshRunner, run_probes

            assert probes is not None
            return run_probes(SshRunner(host), probes, target=host.target, say=note)

        report, fix_code = fix(host, report, checks, policy, request, reaudit=reaudit,
                               where=target.display, remote=True, sudo=True,
                               prove=run_probes if probes is not None else None)
    return max(emit([report], audit_options), fix_code)


def host_command(
    targets: Annotated[
        list[str] | None,
        typer.Argument(metavar="[USER@]HOST[:PORT]...",
                       help="Hosts to audit: addresses or ~/.ssh/config aliases."),
    ] = None,
    inventory: Annotated[
        list[str] | None,
        typer.Option("--inventory", "-i", metavar="FILE",
                     help="Hosts from a file: one per line, or an Ansible INI/YAML inventory."),
    ] = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    sudo: SudoOpt = False,
    timeout: TimeoutOpt = 10.0,
    parallel: Annotated[int, typer.Option("--parallel", min=1, metavar="N",
                                          help="Hosts audited at once.")] = 32,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, metavar="N",
        help="Processes the hosts are spread over (default: one per 16 hosts, up to the "
             "CPUs, from 4 CPUs up).")] = None,
    accept_new_host_keys: AcceptNewOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    root: Annotated[str | None, typer.Option(
        "--root", metavar="DIR",
        help="Audit (and fix) the sysroot directory DIR on the host, such as an image "
             "being prepared, instead of the host itself.")] = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
    check: CheckOpt = None,
    skip: SkipOpt = None,
    fail_on: FailOnOpt = "fail",
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    debug: DebugOpt = False,
    fix_script: FixScriptOpt = None,
    rollback_script: RollbackScriptOpt = None,
    apply: Annotated[bool, typer.Option(
        "--apply", help="Upload and run the fix with sudo, then audit again.")] = False,
    yes: YesOpt = False,
    prove: ProveOpt = False,
    probe: ProveProbeOpt = None,
    color: ColorOpt = "auto",
    quiet_: QuietOpt = False,
    verbose_: VerboseOpt = False,
) -> None:
    """Audit remote Linux hosts over SSH; nothing is installed on them."""
    from auditor.cli.fix import FixRequest
    from auditor.hosts.ssh import parse_target, sysroot_path
    from auditor.inventory import load_inventory
    from auditor.runner import FleetAudit

    options = AuditOptions.of(fmt, output, check, skip, fail_on, policy, profile, debug, color)
    request = FixRequest(fix_script, rollback_script, apply, yes)
    with handle_errors(debug):
        set_verbosity(quiet_, verbose_)
        probes = prove_request(prove, probe, apply, root)
        wanted = [parse_target(t) for t in targets or ()]
        for path in inventory or ():
            wanted.extend(load_inventory(path, note=lambda line: note(f"note: {line}")))
        if not wanted:
            raise UsageError("no hosts given: name hosts, or pass --inventory FILE")
        if request.wanted and len(wanted) != 1:
            raise UsageError("--fix-script, --rollback-script and --apply take exactly one host")
        request.check_paths()
        checks, loaded = prepare(options, len(wanted))
        reach = ssh_options(user, port, identity, sudo, timeout, accept_new_host_keys,
                            known_hosts, ssh_config, root)
        sysroot_path(root)  # a bad --root is a usage error before any connection
    if request.wanted:
        raise typer.Exit(_fix_remote(wanted[0], reach, checks, loaded, options, request,
                                     probes))
    fleet = FleetAudit(wanted, reach, checks, loaded, parallel=parallel, debug=debug,
                       workers=workers,
                       on_error=lambda line: say(f"audit: error: {printable(line)}"),
                       on_note=lambda line: note(f"warning: {printable(line)}"))
    fleet.start()  # fork any workers before the progress bar starts its thread
    on_done, stop_progress = _progress(len(wanted))
    try:
        reports = fleet.run(on_done)
    except KeyboardInterrupt as exc:
        stop_progress()
        raise typer.Exit(_stopped(fleet, wanted, options, exc)) from None
    finally:
        stop_progress()
    if not reports:
        fatal("no host was audited", EXIT_USAGE)
    raise typer.Exit(emit(reports, options))
