"""``audit host``: audit remote Linux hosts over SSH, one or hundreds at once.

Each host is reached with one SSH connection and one command (see
:mod:`auditor.hosts.ssh`); hosts are audited in parallel. A host that cannot
be audited gets one line on stderr and an error report (exit 3) while every
other host is still audited. fabric and paramiko are imported only when the
command runs, so ``audit local`` does not pay for them.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from auditor.cli import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    AuditOptions,
    CheckOpt,
    DebugOpt,
    FailOnOpt,
    FixScriptOpt,
    FormatOpt,
    OutputOpt,
    PolicyOpt,
    ProfileOpt,
    RollbackScriptOpt,
    SkipOpt,
    YesOpt,
    app,
    fatal,
    prepare,
    write_output,
)
from auditor.errors import AuditorError, UsageError
from auditor.model import FailOn, Report, Status

if TYPE_CHECKING:
    from auditor.check import Check
    from auditor.hosts.ssh import SshHost, SshOptions, SshTarget
    from auditor.policy import Policy

EXIT_INTERRUPTED = 130


def _error_report(target: SshTarget, started: dt.datetime, elapsed: float, message: str,
                  ssh_target: str) -> Report:
    return Report(
        host=target.display,
        target=ssh_target,
        started=started.isoformat(timespec="seconds"),
        duration_s=elapsed,
        results=(),
        error=message,
    )


class FleetAudit:
    """Audit many hosts on a thread pool; each failure stays with its host."""

    def __init__(self, targets: Sequence[SshTarget], options: SshOptions,
                 checks: Sequence[type[Check]], policy: Policy, *, parallel: int = 32,
                 debug: bool = False) -> None:
        from auditor.collect import patterns_for
        from auditor.hosts.ssh import SshContext

        self.targets = list(targets)
        self.options = options
        self.checks = list(checks)
        self.policy = policy
        self.parallel = max(1, parallel)
        self.debug = debug
        self.patterns = patterns_for(self.checks)
        #: One fabric config and one read of known_hosts for every host of the run.
        self.context = SshContext(options)
        self.reports: list[Report | None] = [None] * len(self.targets)
        self._live: dict[int, SshHost] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def audit_one(self, index: int) -> Report | None:
        """Connect to one host, collect, run the checks; an unreachable host is an error report."""
        from auditor.hosts.ssh import SshHost
        from auditor.runner import audit

        target = self.targets[index]
        started_at = dt.datetime.now(dt.timezone.utc)
        started = time.perf_counter()
        host = SshHost(target, self.options, self.context)
        with self._lock:
            self._live[index] = host
        try:
            if self._stopping.is_set():
                raise KeyboardInterrupt
            host.connect()
            host.collect(self.patterns)
            report = audit(host, self.checks, self.policy, debug=self.debug, workers=1)
            if host.privilege_note:
                # Reports show why root-only reads (PCI config past 64 bytes) are missing.
                report = replace(report, facts=(*report.facts,
                                                ("privilege", host.privilege_note)))
        except AuditorError as exc:
            if self._stopping.is_set():
                return None  # closed by Ctrl-C: not this host's fault
            if self.debug and not isinstance(exc, UsageError):
                raise
            message = str(exc)
            print(f"audit: error: {message}", file=sys.stderr, flush=True)
            report = _error_report(target, started_at, time.perf_counter() - started, message,
                                   host.target)
        except Exception as exc:
            if self._stopping.is_set():
                return None
            if self.debug:
                raise
            message = f"{target.display}: {type(exc).__name__}: {exc}"
            print(f"audit: error: {message}", file=sys.stderr, flush=True)
            report = _error_report(target, started_at, time.perf_counter() - started, message,
                                   host.target)
        finally:
            host.close()
            with self._lock:
                self._live.pop(index, None)
        self.reports[index] = report
        return report

    def stop(self) -> None:
        """Stop: no new host starts, and connections in flight are closed."""
        self._stopping.set()
        with self._lock:
            live = list(self._live.values())
        for host in live:
            host.close()

    def run(self, on_done: Callable[[Report], None] | None = None) -> list[Report]:
        """Audit every host; return the reports in target order (interrupted: those finished)."""
        pool = ThreadPoolExecutor(max_workers=min(self.parallel, len(self.targets)),
                                  thread_name_prefix="host")
        try:
            pending: set[Future[Report | None]] = {
                pool.submit(self.audit_one, i) for i in range(len(self.targets))
            }
            while pending:
                # A short wait keeps the main thread responsive to Ctrl-C.
                done, pending = wait(pending, timeout=0.2, return_when="FIRST_COMPLETED")
                for future in done:
                    report = future.result()
                    if on_done is not None and report is not None:
                        on_done(report)
        except KeyboardInterrupt:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return [r for r in self.reports if r is not None]


def _progress(total: int) -> tuple[Callable[[Report], None] | None, Callable[[], None]]:
    """Return a progress callback and a closer: a bar on a terminal's stderr, else nothing."""
    if total < 2 or not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("auditing", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(file=sys.stderr), transient=True)
    task = progress.add_task("hosts", total=total)
    progress.start()
    return (lambda report: progress.advance(task)), progress.stop


def fleet_rows(reports: Sequence[Report]) -> tuple[list[str], list[dict[str, Any]]]:
    """Return the check ids and one row per host (status per check) for the fleet table."""
    checks: dict[str, None] = {}
    for report in reports:
        for result in report.results:
            checks.setdefault(result.check, None)
    rows = []
    for report in reports:
        statuses = {r.check: r.status.value for r in report.results}
        rows.append({
            "host": report.host,
            "target": report.target,
            "error": report.error,
            "cells": [statuses.get(check, "-") for check in checks],
            "status": report.status.value,
        })
    return list(checks), rows


def render_fleet(reports: Sequence[Report], colour: bool = False) -> str:
    """Render the hosts-by-checks table that follows several hosts' text reports."""
    from auditor.render import make_environment

    checks, rows = fleet_rows(reports)
    env = make_environment("text", colour=colour)
    counts = {s.value: 0 for s in Status}
    for report in reports:
        counts[report.status.value] += 1
    return env.get_template("fleet.txt.j2").render(
        checks=checks,
        rows=rows,
        counts=counts,
        unreachable=sum(1 for r in reports if r.error),
        host_width=max([len("HOST"), *(len(r["host"]) for r in rows)]),
        target_width=max([len("TARGET"), *(len(r["target"]) for r in rows)]),
        widths=[max(len(c), 5) for c in checks],
    )


def emit_fleet(reports: Sequence[Report], options: AuditOptions) -> int:
    """Render and write the hosts' reports (and the fleet table); return the exit code."""
    from auditor.render import render_reports

    colour = (options.fmt == "text" and options.output in (None, "-") and sys.stdout.isatty()
              and "NO_COLOR" not in os.environ)
    text = render_reports(reports, options.fmt, fail_on=options.fail_on, colour=colour)
    if options.fmt == "text" and len(reports) > 1:
        text += "\n" + render_fleet(reports, colour=colour)
    write_output(text, options.output)
    codes = [r.exit_code(options.fail_on) for r in reports]
    if EXIT_UNREACHABLE in codes:
        return EXIT_UNREACHABLE
    return max(codes, default=EXIT_OK)


def _fix_remote(target: SshTarget, ssh_options: SshOptions, checks: Sequence[type[Check]],
                policy: Policy, options: AuditOptions, fix_script: str | None,
                rollback_script: str | None, apply: bool, yes: bool) -> int:
    """Audit one host with the remediations' extra reads, then write and/or apply its fix."""
    from auditor.collect import patterns_for
    from auditor.fix import REMEDIATION_READS, LocalFixRequest, ScriptResult, fix_local
    from auditor.hosts.ssh import SshHost
    from auditor.runner import audit

    patterns = list(dict.fromkeys([*patterns_for(checks), *REMEDIATION_READS]))

    def execute(script: str) -> ScriptResult:
        runner = SshHost(target, ssh_options)
        try:
            runner.connect()
            code, output = runner.run_script(script, sudo=True)
        finally:
            runner.close()
        return ScriptResult(code, output)

    try:
        host = SshHost.open(target, ssh_options, patterns)
        report = audit(host, checks, policy, debug=options.debug)
        report, fix_code = fix_local(
            host, report, checks, policy,
            LocalFixRequest(None, fix_script, rollback_script, apply, yes),
            reopen=lambda: SshHost.open(target, ssh_options, patterns),
            debug=options.debug, execute=execute, where=target.display,
        )
    except AuditorError as exc:
        if options.debug:
            raise
        fatal(str(exc), exc.exit_code)
    return max(emit_fleet([report], options), fix_code)


@app.command("host")
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
    user: Annotated[str | None, typer.Option("--user", "-u", help="Log in as USER.")] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535,
                                             help="SSH port (default 22 or the ssh config's).")
                    ] = None,
    identity: Annotated[str | None, typer.Option("--identity", metavar="KEYFILE",
                                                 help="Private key to offer.")] = None,
    sudo: Annotated[bool, typer.Option(
        "--sudo", help="Collect under 'sudo -n' (full PCI config space); without a "
                       "password-less sudo the audit goes on unprivileged and says so.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1,
                                           help="Seconds for connecting and for the command.")
                       ] = 10.0,
    parallel: Annotated[int, typer.Option("--parallel", min=1,
                                          help="Hosts audited at once.")] = 32,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys",
        help="Trust an unknown host key on first use and record it in known_hosts "
             "(a changed key is still refused).")] = False,
    known_hosts: Annotated[str | None, typer.Option(
        "--known-hosts", metavar="FILE",
        help="Also trust the keys in FILE (and record new ones there).")] = None,
    ssh_config: Annotated[str | None, typer.Option(
        "--ssh-config", metavar="FILE",
        help="Read this ssh config instead of ~/.ssh/config.")] = None,
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
    apply: Annotated[bool, typer.Option(
        "--apply", help="Upload and run the fix with sudo, then audit again.")] = False,
    yes: YesOpt = False,
) -> None:
    """Audit remote Linux hosts over SSH; nothing is installed on them."""
    options = AuditOptions(fmt, output, tuple(check or ()), tuple(skip or ()), fail_on,
                           policy, profile, debug)
    try:
        from auditor.hosts.ssh import SshOptions, parse_target
        from auditor.inventory import load_inventory

        checks, loaded = prepare(options)
        wanted = [parse_target(t) for t in targets or ()]
        for path in inventory or ():
            wanted.extend(load_inventory(path))
        if not wanted:
            raise UsageError("no hosts given: name hosts, or pass --inventory FILE")
        ssh_options = SshOptions(
            user=user, port=port, identity=identity, sudo=sudo, timeout=timeout,
            accept_new_host_keys=accept_new_host_keys,
            known_hosts=(known_hosts,) if known_hosts else (), ssh_config=ssh_config,
        )
    except AuditorError as exc:
        if debug:
            raise
        fatal(str(exc), exc.exit_code)
    if fix_script or rollback_script or apply:
        if len(wanted) != 1:
            fatal("--fix-script, --rollback-script and --apply take exactly one host", EXIT_USAGE)
        raise typer.Exit(_fix_remote(wanted[0], ssh_options, checks, loaded, options,
                                     fix_script, rollback_script, apply, yes))
    fleet = FleetAudit(wanted, ssh_options, checks, loaded, parallel=parallel, debug=debug)
    on_done, stop_progress = _progress(len(wanted))
    interrupted = False
    try:
        reports = fleet.run(on_done)
    except KeyboardInterrupt:
        interrupted = True
        reports = [r for r in fleet.reports if r is not None]
    finally:
        stop_progress()
    if interrupted:
        print(f"audit: interrupted: {len(reports)} of {len(wanted)} hosts audited",
              file=sys.stderr)
        if reports:
            emit_fleet(reports, options)
        raise typer.Exit(EXIT_INTERRUPTED)
    if not reports:
        fatal("no host was audited", EXIT_USAGE)
    raise typer.Exit(emit_fleet(reports, options))
