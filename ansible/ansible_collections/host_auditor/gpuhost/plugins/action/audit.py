# Copyright: host-auditor contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action plugin of host_auditor.gpuhost.audit: agentless over Ansible's own connection.

host-auditor's one-command collector (``auditor.hosts.collect.remote_command``: the
target's ``python3``, else POSIX ``sh``) travels on the connection's stdin, so ssh
options, ``become``, jump hosts and the inventory are Ansible's. The tar it prints comes
back and the checks run here, on the controller. A fix script goes the same way (``bash
-s`` under ``become``). ``mode: installed`` runs the module on the target instead.

Each node has a deadline (``timeout``, as ``audit host --timeout``): the collecting
command, reading and parsing its answer and the checks share it. A node that trickles
its answer, or sends one within the caps that is slow to read, fails its task at the
deadline with one line; the fix has its own limit (``audit host --apply``'s 10 minutes).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
import time

from ansible.plugins.action import ActionBase
from ansible_collections.host_auditor.gpuhost.plugins.module_utils.host_auditor import (
    ARGUMENT_SPEC,
    AuditFailure,
    load,
    run,
    with_privilege,
)

#: The most bytes one collection may send back (as ``audit host``).
MAX_OUTPUT = 64 << 20
#: How long a fix may take on a node (upload, run and output), as ``audit host --apply``.
APPLY_LIMIT_S = 600


class NodeTimeout(AuditFailure):
    """The node's deadline passed."""


@contextlib.contextmanager
def deadline_alarm(seconds, label, what):
    """Raise NodeTimeout in this process's main thread after ``seconds``.

    Ansible runs each task in a forked worker whose main thread runs the action, and stops
    a task at its own ``timeout:`` keyword the same way (SIGALRM): an outer alarm is kept
    and set again afterwards. Off the main thread no alarm can be set; the parsing and the
    checks are still bounded by the deadline they are given.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        del signum, frame
        raise NodeTimeout(f"{label}: timed out after {seconds:g} s ({what})")

    started = time.monotonic()
    outer_left = signal.alarm(0)  # seconds left of an alarm already set (0: none)
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds if not outer_left
                                             else min(seconds, outer_left)))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            signal.alarm(max(1, round(outer_left - (time.monotonic() - started))))


def _connection_host_class():
    """Return the Host class served from a collection made over an Ansible connection."""
    from auditor.hosts.archive import ArchiveHost
    from auditor.hosts.base import Host, ScriptResult
    from auditor.hosts.collect import parse_output, remote_command

    class ConnectionHost(Host):
        """A target read through Ansible's connection: collected once, read from memory."""

        def __init__(self, execute, label, root, timeout):
            self._execute = execute
            self.timeout = timeout
            #: When this audit of the node must be over (``time.monotonic()``); set when
            #: the collection starts, and shared by the parsing and the checks.
            self.deadline = None
            self.label = label
            self.name = label
            self.root = root
            self.kind = "sysroot" if root else "ssh"
            self.target = f"ansible://{label}" + (f":{root}" if root else "")
            self.privilege_note = ""
            self._archive = None

        def collect(self, patterns):
            from auditor.errors import AuditorError, CollectError
            from auditor.shipped.collector_script import denied

            command = remote_command(patterns, root=self.root)
            self.deadline = time.monotonic() + self.timeout
            with deadline_alarm(self.timeout, self.label, "collecting, reading the answer and "
                                "the checks share the timeout"):
                rc, stdout, stderr = self._execute("/bin/sh -s", command.encode())
                try:
                    return self._load(rc, stdout, stderr, CollectError, denied)
                except AuditorError as exc:
                    raise AuditFailure(" ".join(str(exc).split())) from exc

        def _load(self, rc, stdout, stderr, error, denied):
            if rc != 0:
                detail = stderr.strip().splitlines()
                raise AuditFailure(f"{self.label}: the collecting command exited {rc}"
                                   + (f": {detail[-1][:200]}" if detail else ""))
            if len(stdout) > MAX_OUTPUT:
                raise AuditFailure(f"{self.label}: the collection exceeded "
                                   f"{MAX_OUTPUT >> 20} MiB")
            collection = parse_output(stdout, self.label, cap=MAX_OUTPUT,
                                      deadline=self.deadline)
            del stdout
            self.privilege_note = collection.privilege_note
            # As audit host reads an answer: uncompressed only, within the caps and the
            # deadline, and nothing the collector never collects read from it.
            self._archive = ArchiveHost(collection.tar, self.label, name=None,
                                        allowed={"none"}, cap=MAX_OUTPUT,
                                        deadline=self.deadline, error=error, skip=denied)
            hostname = (self._archive.read_optional("/etc/hostname")
                        or self._archive.read_optional("/proc/sys/kernel/hostname") or "")
            words = hostname.split()
            clean = "".join(c for c in (words[0] if words else "") if c.isprintable())
            self.name = clean[:253] or self.label
            return self

        def _loaded(self):
            if self._archive is None:
                raise OSError(f"{self.label}: nothing collected yet")
            return self._archive

        def lstat(self, path):
            return self._loaded().lstat(path)

        def _read_resolved(self, path, limit):
            return self._loaded()._read_resolved(path, limit)

        def _listdir_resolved(self, path):
            return self._loaded()._listdir_resolved(path)

        def processes(self):
            archive = self._loaded()
            try:
                pids = [p for p in archive.listdir("/proc") if p.isdigit()]
            except OSError:
                return None
            names = {archive.read_optional(f"/proc/{pid}/comm") for pid in pids}
            names.discard(None)
            names.discard("")
            return frozenset(names) if names else None

        def run_script(self, script, *, sudo=False):
            with deadline_alarm(APPLY_LIMIT_S, self.label, "the fix's own limit"):
                rc, stdout, stderr = self._execute("bash -s", script.encode())
            output = (stdout + stderr).decode("utf-8", "replace")
            return ScriptResult(rc, output)

    return ConnectionHost


class ActionModule(ActionBase):
    """Audit (and tune) the target over the task's connection."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def _execute(self, command, stdin):
        """Run ``command`` (a shell word list) with ``stdin`` on the target, under become,
        with the play's and task's ``environment:`` (as a module gets it: the shell
        plugin's prefix, inside become, so sudo does not reset it)."""
        environment = self._compute_environment_string()
        if environment:
            command = f"{environment} {command}"
        result = self._low_level_execute_command(
            command, sudoable=True, in_data=stdin, encoding_errors="surrogateescape")
        # The connection's bytes, as they were: the tar is binary.
        stdout = result.get("stdout", "").encode("utf-8", "surrogateescape")
        stderr = result.get("stderr", "").encode("utf-8", "surrogateescape")
        return result.get("rc", 1), stdout, stderr

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["mode"] == "installed":
            result.update(self._execute_module(module_name="host_auditor.gpuhost.audit",
                                               module_args=args, task_vars=task_vars))
            return result
        try:
            import auditor  # noqa: F401 - the controller judges: it needs host-auditor
        except ImportError:
            result.update(failed=True, msg="host-auditor is not installed in the controller's "
                          "Python (pip install host-auditor), or use mode=installed")
            return result
        from auditor.registry import collected_paths

        label = (task_vars or {}).get("inventory_hostname") or self._play_context.remote_addr
        root = args["root"]
        if root is not None and (not root.startswith("/") or "\x00" in root):
            result.update(failed=True, msg=f"root {shlex.quote(root)}: give an absolute path")
            return result
        host_class = _connection_host_class()
        timeout = float(args["timeout"])
        try:
            checks, _policy = load(args)
            patterns = collected_paths(checks, fix=args["state"] == "tuned")
            host = host_class(self._execute, str(label), root, timeout).collect(patterns)

            def reaudit():
                from auditor.runner import audit

                fresh_checks, policy = load(args)
                fresh = host_class(self._execute, str(label), root, timeout).collect(patterns)
                return with_privilege(fresh, audit(fresh, fresh_checks, policy,
                                                   deadline=fresh.deadline))

            environment = {}
            self._compute_environment_string(environment)
            outcome = run(host, reaudit, args, check_mode=bool(self._task.check_mode),
                          diff_mode=bool(self._task.diff),
                          state_dir=environment.get("HOST_AUDITOR_STATE_DIR"))
        except AuditFailure as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except Exception as exc:  # host-auditor's own errors: one line, no traceback
            result.update(failed=True, msg=f"{type(exc).__name__}: {' '.join(str(exc).split())}")
            return result
        result.update(outcome)
        return result
