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
from collections.abc import Callable, Iterable, Sequence
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


#: Fewest hosts worth a worker process of their own (below, the fork costs more).
HOSTS_PER_WORKER = 16
#: Fewest usable CPUs before a fleet is spread over processes unasked: with two,
#: measured, the targets' sshd (on loopback in the benchmark) or the rest of the
#: machine needs the second one and one process is as fast.
AUTO_WORKER_CPUS = 4


def usable_cpus() -> int:
    """Return how many CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(hosts: int, cpus: int, asked: int | None = None) -> int:
    """Return how many processes audit ``hosts`` hosts: ``asked``, or one per 16 hosts and CPU."""
    if asked is not None:
        return max(1, min(asked, hosts))
    if cpus < AUTO_WORKER_CPUS:
        return 1
    return max(1, min(cpus, hosts // HOSTS_PER_WORKER))


class FleetAudit:
    """Audit many hosts on a thread pool, or on several processes' pools; failures stay per host.

    paramiko does its packet work in Python, so one process's threads share one
    core (the GIL). With many hosts and CPUs, forked worker processes each audit
    a share of the hosts on their own thread pool and send each host's report
    back as it finishes (the parent keeps the progress bar and the order).
    """

    def __init__(self, targets: Sequence[SshTarget], options: SshOptions,
                 checks: Sequence[type[Check]], policy: Policy, *, parallel: int = 32,
                 debug: bool = False, workers: int | None = None) -> None:
        from auditor.collect import patterns_for
        from auditor.hosts.ssh import SshContext

        self.targets = list(targets)
        self.options = options
        self.checks = list(checks)
        self.policy = policy
        self.parallel = max(1, parallel)
        self.debug = debug
        # --debug raises a host's exception: that needs the host's thread in this process.
        self.workers = 1 if debug else worker_count(len(self.targets), usable_cpus(), workers)
        self._processes: list[tuple[Any, Any, list[int]]] = []
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
        self.start()
        if self._processes:
            self._gather(on_done)
        else:
            self._run_threads(range(len(self.targets)), self.parallel,
                              lambda index, report: on_done(report) if on_done else None)
        return [r for r in self.reports if r is not None]

    def _run_threads(self, indices: Iterable[int], parallel: int,
                     on_done: Callable[[int, Report], None]) -> None:
        wanted = list(indices)
        pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(wanted))),
                                  thread_name_prefix="host")
        try:
            futures: dict[Future[Report | None], int] = {
                pool.submit(self.audit_one, i): i for i in wanted
            }
            pending = set(futures)
            while pending:
                # A short wait keeps the main thread responsive to Ctrl-C.
                done, pending = wait(pending, timeout=0.2, return_when="FIRST_COMPLETED")
                for future in done:
                    report = future.result()
                    if report is not None:
                        on_done(futures[future], report)
        except KeyboardInterrupt:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def start(self) -> None:
        """Fork the worker processes, if the fleet uses them (before any thread is started)."""
        if self.workers <= 1 or self._processes:
            return
        import multiprocessing

        context = multiprocessing.get_context("fork")
        parallel = max(1, -(-self.parallel // self.workers))
        for first in range(self.workers):
            share = list(range(first, len(self.targets), self.workers))
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=self._worker, args=(share, parallel, writer),
                                      name="audit-worker", daemon=True)
            process.start()
            writer.close()
            self._processes.append((process, reader, share))

    def _worker(self, share: list[int], parallel: int, writer: Any) -> None:
        """Audit a share of the hosts in a worker process, sending (index, report) pairs."""
        import signal

        # Ctrl-C reaches the whole process group: the parent decides, and ends the workers.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._processes = []
        self._run_threads(share, parallel, lambda index, report: writer.send((index, report)))
        writer.close()

    def _gather(self, on_done: Callable[[Report], None] | None) -> None:
        from multiprocessing.connection import wait as wait_any

        readers: list[Any] = [reader for _, reader, _ in self._processes]
        try:
            while readers:
                # A short wait keeps the main thread responsive to Ctrl-C.
                ready: list[Any] = wait_any(readers, timeout=0.2)
                for reader in ready:
                    try:
                        index, report = reader.recv()
                    except (EOFError, OSError):
                        readers.remove(reader)  # the worker is done (or dead)
                        continue
                    self.reports[index] = report
                    if on_done is not None:
                        on_done(report)
            for process, _, share in self._processes:
                process.join()
                if process.exitcode == 0:
                    continue
                # A worker that died (killed, out of memory) fails only its unfinished hosts.
                for index in share:
                    if self.reports[index] is None:
                        target = self.targets[index]
                        message = (f"{target.display}: the worker process auditing it ended "
                                   f"(exit code {process.exitcode})")
                        print(f"audit: error: {message}", file=sys.stderr, flush=True)
                        report = _error_report(target, dt.datetime.now(dt.timezone.utc), 0.0,
                                               message, f"ssh://{target.host}")
                        self.reports[index] = report
                        if on_done is not None:
                            on_done(report)
        except KeyboardInterrupt:
            self._stopping.set()
            for process, _, _ in self._processes:
                if process.is_alive():
                    process.terminate()  # its connections close with it
            for process, _, _ in self._processes:
                process.join()
            raise
        finally:
            for _, reader, _ in self._processes:
                reader.close()


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
    from auditor.hosts.ssh import SshContext, SshHost
    from auditor.runner import audit

    patterns = list(dict.fromkeys([*patterns_for(checks), *REMEDIATION_READS]))
    # The audit, the fix's upload and the audit after it read ssh config and known_hosts once.
    context = SshContext(ssh_options)

    def execute(script: str) -> ScriptResult:
        runner = SshHost(target, ssh_options, context)
        try:
            runner.connect()
            code, output = runner.run_script(script, sudo=True)
        finally:
            runner.close()
        return ScriptResult(code, output)

    try:
        host = SshHost.open(target, ssh_options, patterns, context)
        report = audit(host, checks, policy, debug=options.debug)
        report, fix_code = fix_local(
            host, report, checks, policy,
            LocalFixRequest(None, fix_script, rollback_script, apply, yes),
            reopen=lambda: SshHost.open(target, ssh_options, patterns, context),
            debug=options.debug, execute=execute, where=target.display, remote=True,
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
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1,
        help="Processes the hosts are spread over (default: one per 16 hosts, up to the "
             "CPUs, from 4 CPUs up).")] = None,
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
    root: Annotated[str | None, typer.Option(
        "--root", metavar="DIR",
        help="Audit (and fix) the sysroot directory DIR on the host, such as an image "
             "being prepared, instead of the host itself.")] = None,
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
        from auditor.hosts.ssh import SshOptions, parse_target, sysroot_path
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
            root=root,
        )
        sysroot_path(root)  # a bad --root is a usage error before any connection
    except AuditorError as exc:
        if debug:
            raise
        fatal(str(exc), exc.exit_code)
    if fix_script or rollback_script or apply:
        if len(wanted) != 1:
            fatal("--fix-script, --rollback-script and --apply take exactly one host", EXIT_USAGE)
        raise typer.Exit(_fix_remote(wanted[0], ssh_options, checks, loaded, options,
                                     fix_script, rollback_script, apply, yes))
    fleet = FleetAudit(wanted, ssh_options, checks, loaded, parallel=parallel, debug=debug,
                       workers=workers)
    fleet.start()  # fork any workers before the progress bar starts its thread
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
