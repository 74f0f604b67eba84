# Copyright: host-auditor contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the audit module and its action plugin share: the options, and one audit (and fix).

The module runs this on the target (host-auditor installed there); the action plugin runs
it on the controller against the files collected over Ansible's connection. Both hand it
a ``Host`` of host-auditor's seam and a way to audit that host again after a fix.
"""

from __future__ import annotations

ARGUMENT_SPEC = {
    "state": {"type": "str", "default": "audited", "choices": ["audited", "tuned"]},
    "checks": {"type": "list", "elements": "str", "default": []},
    "skip": {"type": "list", "elements": "str", "default": []},
    "fail_on": {"type": "str", "default": "fail", "choices": ["fail", "warning", "never"]},
    "policy": {"type": "path"},
    "profile": {"type": "str"},
    "root": {"type": "path"},
    "mode": {"type": "str", "default": "agentless", "choices": ["agentless", "installed"]},
    "executable": {"type": "path", "default": "/usr/local/bin/audit"},
    "timeout": {"type": "float", "default": 60.0},
}

#: Where the engines look for ``audit`` on a node: the single-file build (a zipapp) is
#: imported from there when the target's Python has no host-auditor of its own.
EXECUTABLES = ("/usr/local/bin/audit", "/opt/host-auditor/bin/audit")


def import_auditor(executable=None):
    """Make ``auditor`` importable; return None, or the ImportError when it cannot be.

    The target's Python may have host-auditor installed; otherwise the single-file build
    (``python3 contrib/pyz/build.py``) at ``executable`` or where the engines look is a zip
    that Python imports from as it is.
    """
    import sys
    import zipfile

    try:
        import auditor.hosts
        return None
    except ImportError as exc:
        first = exc
    for candidate in dict.fromkeys([executable, *EXECUTABLES]):
        if not candidate or not zipfile.is_zipfile(candidate):
            continue
        sys.path.insert(0, candidate)
        try:
            import auditor.hosts  # noqa: F401
            return None
        except ImportError:
            sys.path.remove(candidate)
    return first

#: The statuses a fix acts on (host-auditor's FIXABLE).
_FIXABLE = ("fail", "warn")


class AuditFailure(Exception):
    """A problem to report as the task's failure (one line)."""


def load(params):
    """Return the selected check classes and the policy, or raise AuditFailure."""
    from auditor.errors import AuditorError
    from auditor.policy import load_policy
    from auditor.registry import load_checks, select

    try:
        every = load_checks()
        checks = select(every, params.get("checks") or (), params.get("skip") or ())
        if not checks:
            raise AuditFailure("no checks left to run after checks/skip")
        return checks, load_policy(every, params.get("policy"), params.get("profile"))
    except AuditorError as exc:
        raise AuditFailure(" ".join(str(exc).split())) from exc


def _statuses(report):
    """Return each (check, subject)'s worst status and its observed value."""
    found = {}
    for finding in report.findings:
        key = (finding.check, finding.subject)
        if key not in found or finding.status.order > found[key][0].order:
            found[key] = (finding.status, finding.observed)
    return found


def _would_change(report, plan):
    """Return the problem findings the plan's steps act on (check and subject, else check)."""
    acting = [s.remedy for s in plan.sections if s.actions]
    subjects = {(r.check, r.subject) for r in acting}
    checks = {r.check for r in acting}
    named = {check for check, _subject in subjects}
    chosen = []
    for finding in report.findings:
        if finding.status.value not in _FIXABLE or finding.check not in checks:
            continue
        if (finding.check, finding.subject) in subjects or finding.check not in named:
            chosen.append(finding)
    return chosen


def _diff(lines_before, lines_after, before_header, after_header):
    return {
        "before": "".join(line + "\n" for line in lines_before),
        "after": "".join(line + "\n" for line in lines_after),
        "before_header": before_header,
        "after_header": after_header,
    }


def replace_findings(report, findings):
    """Return the report holding only ``findings`` (each check keeps its own)."""
    from dataclasses import replace

    kept = {id(f) for f in findings}
    results = tuple(replace(r, findings=tuple(f for f in r.findings if id(f) in kept))
                    for r in report.results)
    return replace(report, results=results)


def _tripped(report, fail_on):
    from auditor.model import FailOn

    if report.error:
        return True
    if fail_on == "never":
        return False
    return report.exit_code(FailOn(fail_on)) == 1


def _result(report, params, **extra):
    from auditor.engines import report_line
    from auditor.model import FailOn, fingerprint

    code = report.exit_code(FailOn.WARNING if params["fail_on"] == "warning" else FailOn.FAIL)
    result = {
        "changed": False,
        "failed": _tripped(report, params["fail_on"]),
        "msg": report_line(report),
        "rc": code,
        "summary": report.summary(),
        "fingerprint": "" if report.error else fingerprint(report),
        "ansible_facts": {"host_auditor": report.to_dict()},
    }
    result.update(extra)
    return result


def with_privilege(host, report):
    """Add why root-only files are missing to the report's facts, as ``audit host`` does."""
    from dataclasses import replace

    note = getattr(host, "privilege_note", "")
    return replace(report, facts=(*report.facts, ("privilege", note))) if note else report


def run(host, reaudit, params, check_mode=False, diff_mode=False, state_dir=None):
    """Audit ``host`` (and with ``state: tuned`` fix it); return the task's result.

    ``reaudit()`` returns a fresh report after a fix. Raise AuditFailure for a failure
    that has no report (bad options, a fix that cannot be planned). ``state_dir``: the
    ``HOST_AUDITOR_STATE_DIR`` the fix runs with on the target (the task's environment),
    so the rollback handle names where the fix really kept its rollback.
    """
    from auditor.errors import AuditorError
    from auditor.fix import build_fix
    from auditor.render import render_fix
    from auditor.runner import audit

    checks, policy = load(params)
    # The node's deadline (agentless: set when its collection started) bounds the checks too.
    report = with_privilege(host, audit(host, checks, policy,
                                        deadline=getattr(host, "deadline", None)))
    if params["state"] == "audited":
        return _result(report, params)
    try:
        plan = build_fix(host, report, checks, policy)
    except AuditorError as exc:
        raise AuditFailure(" ".join(str(exc).split())) from exc
    planned = [
        {"check": s.remedy.check, "subject": s.remedy.subject, "title": s.remedy.title,
         "steps": len(s.actions), "reboot": s.remedy.reboot}
        for s in plan.sections
    ]
    if check_mode or not plan.actions:
        chosen = _would_change(report, plan)
        extra = {"changed": bool(plan.actions), "fix": planned, "fix_id": plan.fix_id}
        if check_mode and plan.actions:
            # Judged as the host would be after the fix: what it changes does not fail.
            fixed = {id(f) for f in chosen}
            rest = [f for f in report.findings if id(f) not in fixed]
            extra["failed"] = _tripped(replace_findings(report, rest), params["fail_on"])
        if diff_mode and plan.actions:
            extra["diff"] = _diff(
                [f"{f.check} {f.subject}: {f.observed}" for f in chosen],
                [f"{f.check} {f.subject}: {f.expected}" for f in chosen],
                f"{report.host}: observed", f"{report.host}: after the fix (expected)")
        return _result(report, params, **extra)
    scripts = render_fix(plan)
    outcome = host.run_script(scripts.script, sudo=False)
    after = reaudit()
    was, now = _statuses(report), _statuses(after)
    moved = sorted(key for key in set(was) | set(now)
                   if was.get(key, (None,))[0] != now.get(key, (None,))[0])
    # Where the fix kept its rollback: for a sysroot, on the side of whoever ran it (never
    # in the tree); the module runs there itself, the action plugin over the connection.
    from auditor.cli.fix import kept_rollback
    from auditor.hosts import DirectoryHost, LocalHost

    rollback = kept_rollback(plan, local=isinstance(host, (DirectoryHost, LocalHost)))
    if state_dir and plan.sysroot and not isinstance(host, (DirectoryHost, LocalHost)):
        from auditor.shipped.sysroot_fix import state_key

        rollback = "/".join([state_dir.rstrip("/"), state_key(plan.root), plan.fix_id,
                             "rollback.sh"])
    extra = {
        "changed": bool(moved),
        "fix": planned,
        "fix_id": plan.fix_id,
        "rollback": rollback,
        "moved": [
            {"check": check, "subject": subject,
             "before": was[(check, subject)][0].value if (check, subject) in was else "",
             "after": now[(check, subject)][0].value if (check, subject) in now else ""}
            for check, subject in moved
        ],
        "fix_output": outcome.output[-4000:],
    }
    if diff_mode and moved:
        extra["diff"] = _diff(
            [f"{c} {s}: {was[(c, s)][1]}" for c, s in moved if (c, s) in was],
            [f"{c} {s}: {now[(c, s)][1]}" for c, s in moved if (c, s) in now],
            f"{report.host}: before the fix", f"{report.host}: after the fix")
    result = _result(after, params, **extra)
    if outcome.returncode != 0:
        result["failed"] = True
        result["msg"] = f"the fix script exited {outcome.returncode}: {result['msg']}"
    return result
