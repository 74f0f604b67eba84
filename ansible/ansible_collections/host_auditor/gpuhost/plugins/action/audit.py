# Copyright: host-auditor contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action plugin of host_auditor.gpuhost.audit: agentless over Ansible's own connection.

host-auditor's one-command collector (``auditor.hosts.collect.remote_command``: the
target's ``python3``, else POSIX ``sh``) travels on the connection's stdin, so ssh
options, ``become``, jump hosts and the inventory are Ansible's. The tar it prints comes
back and the checks run here, on the controller. A fix script goes the same way (``bash
-s`` under ``become``). ``mode: installed`` runs the module on the target instead.
"""

from __future__ import annotations

import shlex

from ansible.plugins.action import ActionBase
from ansible_collections.host_auditor.gpuhost.plugins.module_utils.host_auditor import (
    ARGUMENT_SPEC,
    AuditFailure,
    load,
    run,
    with_privilege,
)

#: The most bytes one collection may send back (as ``audit host``).
MAX_OUTPUT = 256 << 20


def _connection_host_class():
    """Return the Host class served from a collection made over an Ansible connection."""
    from auditor.hosts.archive import ArchiveHost
    from auditor.hosts.base import Host, ScriptResult
    from auditor.hosts.collect import parse_output, remote_command

    class ConnectionHost(Host):
        """A target read through Ansible's connection: collected once, read from memory."""

        def __init__(self, execute, label, root):
            self._execute = execute
            self.label = label
            self.name = label
            self.root = root
            self.kind = "sysroot" if root else "ssh"
            self.target = f"ansible://{label}" + (f":{root}" if root else "")
            self.privilege_note = ""
            self._archive = None

        def collect(self, patterns):
            command = remote_command(patterns, root=self.root)
            rc, stdout, stderr = self._execute("/bin/sh -s", command.encode())
            if rc != 0:
                detail = stderr.strip().splitlines()
                raise AuditFailure(f"{self.label}: the collecting command exited {rc}"
                                   + (f": {detail[-1][:200]}" if detail else ""))
            if len(stdout) > MAX_OUTPUT:
                raise AuditFailure(f"{self.label}: the collection exceeded "
                                   f"{MAX_OUTPUT >> 20} MiB")
            collection = parse_output(stdout, self.label)
            self.privilege_note = collection.privilege_note
            self._archive = ArchiveHost(collection.tar, self.label, name=None)
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
        """Run ``command`` (a shell word list) with ``stdin`` on the target, under become."""
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
        try:
            checks, _policy = load(args)
            patterns = collected_paths(checks, fix=args["state"] == "tuned")
            host = host_class(self._execute, str(label), root).collect(patterns)

            def reaudit():
                from auditor.runner import audit

                fresh_checks, policy = load(args)
                fresh = host_class(self._execute, str(label), root).collect(patterns)
                return with_privilege(fresh, audit(fresh, fresh_checks, policy))

            outcome = run(host, reaudit, args, check_mode=bool(self._task.check_mode),
                          diff_mode=bool(self._task.diff))
        except AuditFailure as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except Exception as exc:  # host-auditor's own errors: one line, no traceback
            result.update(failed=True, msg=f"{type(exc).__name__}: {' '.join(str(exc).split())}")
            return result
        result.update(outcome)
        return result
