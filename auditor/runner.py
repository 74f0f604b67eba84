"""The runners: every check of one host on a pool, and many hosts at once.

:func:`audit` runs every check against one host in parallel, each timed, each
failure contained. :class:`FleetAudit` audits many SSH hosts on a thread pool (or
on several forked processes' pools) and reports each host's result and each
failure through callbacks: nothing here prints.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from auditor.check import CheckClass
from auditor.environment import environment
from auditor.errors import AuditorError, UsageError
from auditor.hosts.base import Host
from auditor.manifest import Manifest, read_manifest
from auditor.model import CheckResult, Finding, Report, Status
from auditor.policy import Policy

if TYPE_CHECKING:
    from concurrent.futures import Future

    from auditor.hosts.ssh import SshHost, SshOptions, SshTarget


def _error(check: CheckClass, message: str) -> Finding:
    return Finding(
        check=check.id,
        status=Status.ERROR,
        severity=check.severity,
        subject="check",
        message=message,
    )


def run_check(host: Host, check: CheckClass, policy: Policy, debug: bool = False,
              manifest: Manifest | None = None) -> CheckResult:
    """Run one check agent against a host; an exception becomes one ``error`` finding.

    With the ``manifest`` of a capture, a check whose reads the capture did not collect is
    not run: it is one ``skip`` that says so (what was never collected is not absent).
    """
    started = time.perf_counter()
    lacking = manifest.missing(check) if manifest is not None else []
    if manifest is not None and lacking:
        findings = [Finding(check=check.id, status=Status.SKIP, severity=check.severity,
                            subject="capture", message=manifest.skip_reason(lacking))]
    else:
        try:
            findings = list(check(policy.options_for(check)).evaluate(host))
            if not findings:
                findings = [_error(check, "the check returned no findings")]
        except Exception as exc:
            if debug:
                raise
            findings = [_error(check, f"check raised {type(exc).__name__}: {exc}")]
    today = dt.date.today()
    stamped = tuple(
        policy.apply_waivers(replace(f, host=host.name, check=check.id), today)
        for f in _unique_keys(findings)
    )
    return CheckResult(check=check.id, duration_s=time.perf_counter() - started, findings=stamped)


def _unique_keys(findings: list[Finding]) -> list[Finding]:
    """Keep each finding's key (check, subject, aspect) unique within the check's findings.

    A check that judges two things of one subject names each with an aspect; one that
    does not gets a stable one here (``2``, ``3``, ... in the order it yields them), so
    the text view, the golden diff and the fingerprint never merge two findings.
    """
    seen: dict[tuple[str, str], int] = {}
    unique: list[Finding] = []
    for finding in findings:
        key = (finding.subject, finding.aspect)
        count = seen.get(key, 0) + 1
        seen[key] = count
        if count > 1:
            aspect = f"{finding.aspect}#{count}" if finding.aspect else str(count)
            finding = replace(finding, aspect=aspect)
        unique.append(finding)
    return unique


#: host-auditor's application id for machine-id(5)'s app-specific ids.
APP_ID = bytes.fromhex("f36936c499aa4b7299e711b301f336f9")


def app_machine_id(machine_id: str) -> str:
    """Return the app-specific id of a machine-id, never the machine-id itself.

    machine-id(5): the id is confidential, "should be hashed with a cryptographic, keyed
    hash function, using a fixed, application-specific key"; this is systemd's
    ``sd_id128_get_machine_app_specific()``: HMAC-SHA256 of the app id keyed by the
    machine id, its first 16 bytes made a version 4 UUID. Stable per host, so fleets can
    still tell hosts apart by it.
    """
    text = machine_id.strip().lower()
    key = bytes.fromhex(text) if len(text) == 32 and all(
        c in "0123456789abcdef" for c in text) else text.encode("utf-8", "replace")
    digest = bytearray(hmac.new(key, APP_ID, hashlib.sha256).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x40
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest.hex()


def host_facts(host: Host, manifest: Manifest | None = None) -> tuple[tuple[str, str], ...]:
    """Return a few facts that identify the host in a report (and the capture replayed)."""
    facts: list[tuple[str, str]] = []
    kernel = host.read_optional("/proc/sys/kernel/osrelease")
    if kernel:
        facts.append(("kernel", kernel))
    os_release = host.read_optional("/etc/os-release") or ""
    for line in os_release.splitlines():
        if line.startswith("PRETTY_NAME="):
            facts.append(("os", line.partition("=")[2].strip().strip('"')))
    machine_id = host.read_optional("/etc/machine-id")
    if machine_id:
        facts.append(("machine_id", app_machine_id(machine_id)))
    facts.append(("environment", environment(host).describe()))
    if manifest is not None:
        facts.append(("capture", manifest.describe()))
    return tuple(facts)


#: Agents that run checks at once on a host whose reads can block.
PARALLEL_AGENTS = 8


def audit(
    host: Host,
    checks: Sequence[CheckClass],
    policy: Policy,
    *,
    debug: bool = False,
    workers: int | None = None,
    deadline: float | None = None,
) -> Report:
    """Run every check against ``host`` on a pool of agents and collect the report.

    On a host whose reads can block (the live machine: a wedged device's sysfs file can
    hang a read), the checks run in parallel, so one stuck read holds no other check up.
    Elsewhere (a capture, a directory, a collection held in memory) every read is a few
    microseconds of Python holding the GIL, and agents in parallel only trade it back and
    forth (measured: a 512-CPU sysroot audits in 0.3 s on one agent, 0.6 s on eight):
    they run one after another, in this thread where no deadline is set, on one agent
    under the deadline otherwise. ``workers`` overrides either.

    ``deadline`` (``time.monotonic()``): a check still running then becomes an ``error``
    finding (its thread is left to finish on its own).

    A capture that carries a manifest (:mod:`auditor.manifest`) is judged on what it
    collected: a check whose reads it did not cover is a skip "not collected in this
    capture"; a bad manifest is refused (SnapshotError) before any check runs.
    """
    from auditor import __version__

    started_at = dt.datetime.now(dt.timezone.utc)
    started = time.perf_counter()
    default = PARALLEL_AGENTS if host.blocking_reads else 1
    pool_size = max(1, min(len(checks), workers or default))
    manifest = read_manifest(host)
    if pool_size == 1 and deadline is None:
        results = tuple(run_check(host, check, policy, debug, manifest) for check in checks)
        facts = host_facts(host, manifest)
    else:
        results, facts = _audit_on_agents(host, checks, policy, debug, pool_size, deadline,
                                          started, manifest)
    return Report(
        host=host.name,
        target=host.target,
        # Sub-second: two reports of one host from one second still order (audit merge).
        started=started_at.isoformat(timespec="microseconds"),
        duration_s=time.perf_counter() - started,
        results=results,
        facts=facts,
        version=__version__,
        policy=policy.provenance(),
    )


def _audit_on_agents(
    host: Host, checks: Sequence[CheckClass], policy: Policy, debug: bool, agents: int,
    deadline: float | None, started: float, manifest: Manifest | None = None,
) -> tuple[tuple[CheckResult, ...], tuple[tuple[str, str], ...]]:
    """Run the checks on a pool of ``agents`` threads; see :func:`audit`."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    pool = ThreadPoolExecutor(max_workers=agents, thread_name_prefix="check")
    try:
        futures = [pool.submit(run_check, host, check, policy, debug, manifest)
                   for check in checks]
        facts = host_facts(host, manifest)
        done: list[CheckResult] = []
        for check, future in zip(checks, futures, strict=True):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                done.append(future.result(timeout=left))
            except FutureTimeout:
                done.append(CheckResult(check.id, time.perf_counter() - started, (replace(
                    _error(check, "timed out: the host's --timeout passed before the check "
                           "finished"), host=host.name),)))
        return tuple(done), facts
    finally:
        pool.shutdown(wait=deadline is None, cancel_futures=True)


# -- many hosts --------------------------------------------------------------------------


#: The longest error line kept for one host (an exception's text can be anything).
MAX_ERROR_LINE = 400


def one_line(text: str, limit: int = MAX_ERROR_LINE) -> str:
    """Fold a message onto one bounded line: a host's error is always exactly one line."""
    folded = " ".join(text.split())
    return folded if len(folded) <= limit else folded[: limit - 3].rstrip() + "..."


def _error_report(target: SshTarget, started: dt.datetime, elapsed: float, message: str,
                  ssh_target: str, timing: tuple[tuple[str, float], ...] = ()) -> Report:
    from auditor import __version__

    return Report(
        host=target.display,
        target=ssh_target,
        name=target.display,
        started=started.isoformat(timespec="microseconds"),
        duration_s=elapsed,
        results=(),
        error=message,
        timing=timing,
        version=__version__,
    )


def remote_timing(host: SshHost, checks_s: float | None = None) -> tuple[tuple[str, float], ...]:
    """Return the phases a remote audit spent its time on: connect, collect, checks."""
    phases = [("connect", host.connect_s), ("collect", host.collect_s)]
    if checks_s is not None:
        phases.append(("checks", checks_s))
    return tuple((name, seconds) for name, seconds in phases if seconds or name == "checks")


def remote_report(host: SshHost, report: Report, started: dt.datetime, elapsed: float) -> Report:
    """Return a remote host's report with its whole time, its phases and its privilege."""
    facts = report.facts
    if host.privilege_note:
        # Reports show why root-only reads (PCI config past 64 bytes) are missing.
        facts = (*facts, ("privilege", host.privilege_note))
    return replace(report, started=started.isoformat(timespec="microseconds"),
                   duration_s=elapsed, facts=facts, name=host.spec.display,
                   timing=remote_timing(host, report.duration_s))


def sudo_fell_back(host: SshHost, sudo: bool) -> str:
    """Return the line that says --sudo was asked for and the audit ran without root, or ""."""
    collection = host.collection
    if not sudo or collection is None or collection.root:
        return ""
    return (f"{host.spec.display}: --sudo: {host.privilege_note or 'not run as root'}; "
            "audited without root")


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
                 checks: Sequence[CheckClass], policy: Policy, *, parallel: int = 32,
                 debug: bool = False, workers: int | None = None,
                 on_error: Callable[[str], None] | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        from auditor.hosts.ssh import SshContext
        from auditor.registry import collected_paths

        self.targets = list(targets)
        self.options = options
        self.checks = list(checks)
        self.policy = policy
        self.parallel = max(1, parallel)
        self.debug = debug
        # --debug raises a host's exception: that needs the host's thread in this process.
        self.workers = 1 if debug else worker_count(len(self.targets), usable_cpus(), workers)
        self._processes: list[tuple[Any, Any, list[int]]] = []
        self.patterns = collected_paths(self.checks)
        #: One fabric config and one read of known_hosts for every host of the run.
        self.context = SshContext(options)
        self.reports: list[Report | None] = [None] * len(self.targets)
        self._live: dict[int, SshHost] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: Called with one line for each host that could not be audited, as it happens.
        self.on_error = on_error or (lambda line: None)
        #: Called with one line for a host audited with less than was asked (--sudo denied).
        self.on_note = on_note or (lambda line: None)

    def audit_one(self, index: int) -> Report | None:
        """Connect to one host, collect, run the checks; an unreachable host is an error report."""
        from auditor.hosts.ssh import SshHost

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
            report = audit(host, self.checks, self.policy, debug=self.debug, workers=1,
                           deadline=host.deadline)
            report = remote_report(host, report, started_at, time.perf_counter() - started)
            fell_back = sudo_fell_back(host, self.options.sudo)
            if fell_back:
                self.on_note(fell_back)
        except AuditorError as exc:
            if self._stopping.is_set():
                return None  # closed by Ctrl-C: not this host's fault
            if self.debug and not isinstance(exc, UsageError):
                raise
            message = one_line(str(exc))
            self.on_error(message)
            report = _error_report(target, started_at, time.perf_counter() - started, message,
                                   host.target, remote_timing(host))
        except Exception as exc:
            if self._stopping.is_set():
                return None
            if self.debug:
                raise
            message = one_line(f"{target.display}: {type(exc).__name__}: {exc}")
            self.on_error(message)
            report = _error_report(target, started_at, time.perf_counter() - started, message,
                                   host.target, remote_timing(host))
        finally:
            host.close()
            host.release_memory()
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
        from concurrent.futures import ThreadPoolExecutor, wait

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

        # Ctrl-C (and a SIGTERM sent to the group) reaches every process: the parent
        # decides, reports, and ends the workers (SIGKILL: they ignore both).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._processes = []
        # The run's memory budget is shared out: each worker holds its share.
        from auditor.hosts.ssh import MemoryBudget

        self.context.budget = MemoryBudget(self.context.budget.total // self.workers)
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
                        self.on_error(message)
                        report = _error_report(target, dt.datetime.now(dt.timezone.utc), 0.0,
                                               message, f"ssh://{target.host}")
                        self.reports[index] = report
                        if on_done is not None:
                            on_done(report)
        except KeyboardInterrupt:
            self._stopping.set()
            for process, _, _ in self._processes:
                if process.is_alive():
                    process.kill()  # its connections close with it
            for process, _, _ in self._processes:
                process.join()
            raise
        finally:
            for _, reader, _ in self._processes:
                reader.close()
