"""The tuner: findings -> a fix plan -> a fix script and its rollback -> applied -> re-audited.

``build_fix`` asks each check's remediation (``remediations/``) for remedies,
reading more of the host through the Host seam where it needs to; the plan is
rendered through ``templates/fix.sh.j2`` and ``templates/rollback.sh.j2`` in
the shell environment, where every value is quoted. Nothing changes the host
here: ``apply`` hands the rendered script to a callable that runs it (a local
``bash``, or an upload and ``sudo bash`` on a remote host).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.errors import AuditorError, UsageError
from auditor.hosts.base import Host
from auditor.model import Finding, Report, Status
from auditor.policy import Policy
from remediations import remediation_reads, remediations
from remediations.base import (
    AppendLine,
    Context,
    InsertLine,
    MakeSymlink,
    Remedy,
    ReplaceLine,
    RunCommand,
    SetValue,
    Step,
    WriteFile,
    parse_os_release,
)
from remediations.boot import boot_remedy

#: Paths remediations read beyond the checks' own ``reads``: a remote collector
#: fetches these too, so ``build_fix`` sees the same files over SSH.
REMEDIATION_READS: tuple[str, ...] = remediation_reads()

#: Statuses whose findings get a remedy.
FIXABLE = (Status.FAIL, Status.WARN)


class FixError(AuditorError):
    """A fix could not be planned or applied."""

    exit_code = 1


@dataclass(frozen=True)
class Action:
    """One step of the plan, with the id its state files carry on the host."""

    id: str
    phase: str
    step: Step
    #: For a command: the ids of the steps whose change makes it run.
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """One remedy and its steps, as the scripts show them."""

    remedy: Remedy
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class FixPlan:
    """Everything the fix and rollback scripts do on one host."""

    host: str
    target: str
    #: The guard: the scripts refuse to run where these differ.
    hostname: str
    machine_id: str
    #: A sysroot directory, or "" for a booted machine.
    root: str
    fix_id: str
    created: str
    sections: tuple[Section, ...]
    #: Problem findings no remediation handles, with why.
    unhandled: tuple[tuple[Finding, str], ...] = ()

    @property
    def sysroot(self) -> bool:
        return bool(self.root)

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(a for s in self.sections for a in s.actions)

    @property
    def reboot(self) -> bool:
        """Return whether some remedy only takes effect after a reboot."""
        return any(s.remedy.reboot for s in self.sections)

    @property
    def empty(self) -> bool:
        return not self.actions and not any(s.remedy.advice for s in self.sections)

    def summary(self) -> str:
        """Return a few lines saying what the fix script changes."""
        lines = [f"fix {self.fix_id} for {self.host}: {len(self.actions)} step(s)"]
        for section in self.sections:
            r = section.remedy
            lines.append(f"  {r.check} {r.subject}: {r.title} ({len(section.actions)} step(s)"
                         f"{', advice only' if not section.actions and r.advice else ''})")
        for finding, why in self.unhandled:
            lines.append(f"  not fixed: {finding.check} {finding.subject}: {why}")
        return "\n".join(lines)


def _clean(value: Any) -> bool:
    """Return whether every string in a step can be written into a script (no NUL, UTF-8)."""
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, tuple):
        return all(_clean(v) for v in value)
    if dataclasses.is_dataclass(value):
        return all(_clean(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True


def _clean_remedy(remedy: Remedy) -> Remedy:
    runtime = tuple(s for s in remedy.runtime if _clean(s))
    persistent = tuple(s for s in remedy.persistent if _clean(s))
    notes = tuple(n if _clean(n) else "a note was dropped: unprintable text" for n in remedy.notes)
    dropped = len(remedy.runtime) + len(remedy.persistent) - len(runtime) - len(persistent)
    if dropped:
        notes += (f"{dropped} step(s) left out: a path or value holds a NUL or non-UTF-8 "
                  "bytes; fix those by hand",)
    if len(persistent) != len(remedy.persistent):
        # Commands name steps by index: drop them rather than point at the wrong step.
        persistent = tuple(s for s in persistent if not isinstance(s, RunCommand))
    return dataclasses.replace(
        remedy,
        check=remedy.check if _clean(remedy.check) else "?",
        subject=remedy.subject if _clean(remedy.subject) else "?",
        title=remedy.title if _clean(remedy.title) else "?",
        runtime=runtime,
        persistent=persistent,
        notes=notes,
        advice=tuple(a for a in remedy.advice if _clean(a)),
    )


def _resolve(host: Host, step: Step) -> Step:
    try:
        if isinstance(step, MakeSymlink):
            parent, _, name = step.path.rpartition("/")
            return dataclasses.replace(step, path=host.resolve(parent or "/").rstrip("/")
                                       + "/" + name)
        if isinstance(step, SetValue):
            return dataclasses.replace(step, path=host.resolve(step.path))
        if isinstance(step, WriteFile):
            return dataclasses.replace(step, path=host.resolve(step.path))
        if isinstance(step, ReplaceLine):
            return dataclasses.replace(step, path=host.resolve(step.path))
        if isinstance(step, AppendLine):
            return dataclasses.replace(step, path=host.resolve(step.path))
        if isinstance(step, InsertLine):
            return dataclasses.replace(step, path=host.resolve(step.path))
    except OSError:
        pass
    return step


def _resolved(host: Host, remedy: Remedy) -> Remedy:
    """Follow a sysroot's symlinks inside it, so the script writes where the host would."""
    return dataclasses.replace(
        remedy,
        runtime=tuple(_resolve(host, s) for s in remedy.runtime),
        persistent=tuple(_resolve(host, s) for s in remedy.persistent),
    )


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _sysroot_dir(host: Host) -> str:
    if host.kind != "sysroot":
        return ""
    root = getattr(host, "root", None)
    if not isinstance(root, str):
        raise UsageError(
            f"{host.target}: a fix script needs a sysroot directory; unpack the capture "
            "(tar -xzf) and pass the directory to --root"
        )
    return root


def build_fix(
    host: Host,
    report: Report,
    policy: Policy,
    *,
    now: dt.datetime | None = None,
    fix_id: str | None = None,
) -> FixPlan:
    """Plan the fix of a report's problem findings on ``host`` (reads only, changes nothing)."""
    root = _sysroot_dir(host)
    now = now or dt.datetime.now(dt.timezone.utc)
    os_release = parse_os_release(host.read_optional("/etc/os-release") or "")
    if root:
        hostname = _first_line(host.read_optional("/etc/hostname"))
    else:
        hostname = _first_line(host.read_optional("/proc/sys/kernel/hostname")
                               or host.read_optional("/etc/hostname")) or host.name
    machine_id = _first_line(host.read_optional("/etc/machine-id"))
    table = remediations()
    problems: dict[str, list[Finding]] = {}
    unhandled: list[tuple[Finding, str]] = []
    for finding in report.findings:
        if finding.status not in FIXABLE:
            continue
        if finding.check in table:
            problems.setdefault(finding.check, []).append(finding)
        else:
            unhandled.append((finding, "no remediation for this check"))
    remedies: list[Remedy] = []
    for check_id, findings in problems.items():
        context = Context(sysroot=bool(root), options=dict(policy.options.get(check_id, {})),
                          os_release=os_release)
        remedies.extend(table[check_id](host, findings, context))
    params = [p for r in remedies for p in r.boot_params]
    if params:
        remedies.append(boot_remedy(host, params, os_release))
    remedies = [_clean_remedy(r) for r in remedies]
    if root:
        remedies = [_resolved(host, r) for r in remedies]
    sections: list[Section] = []
    counter = 0
    for remedy in remedies:
        actions: list[Action] = []
        persistent_ids: list[str] = []
        for phase, steps in (("runtime", remedy.runtime), ("persistent", remedy.persistent)):
            for step in steps:
                counter += 1
                action_id = f"s{counter:03d}"
                after: tuple[str, ...] = ()
                if isinstance(step, RunCommand):
                    after = tuple(persistent_ids[i] for i in step.after if i < len(persistent_ids))
                if phase == "persistent":
                    persistent_ids.append(action_id)
                actions.append(Action(action_id, phase, step, after))
        if actions or remedy.advice or remedy.notes:
            sections.append(Section(remedy, tuple(actions)))
    digest = hashlib.sha256(
        repr((report.host, root, hostname, [s.actions for s in sections])).encode()
    ).hexdigest()[:8]
    return FixPlan(
        host=report.host,
        target=report.target,
        hostname=hostname,
        machine_id=machine_id,
        root=root,
        fix_id=fix_id or f"{now:%Y%m%dT%H%M%SZ}-{digest}",
        created=now.isoformat(timespec="seconds"),
        sections=tuple(sections),
        unhandled=tuple(unhandled),
    )


def _render(template: str, plan: FixPlan, **extra: Any) -> str:
    from auditor.render import make_environment

    env = make_environment("shell")
    return env.get_template(template).render(plan=plan, **extra)


def render_rollback_script(plan: FixPlan) -> str:
    """Render the bash script that undoes what the fix script changed, from its saved state."""
    return _render("rollback.sh.j2", plan)


def render_fix_script(plan: FixPlan) -> str:
    """Render the bash script that applies the plan (it keeps its rollback on the host too)."""
    return _render("fix.sh.j2", plan, rollback_text=render_rollback_script(plan))


def default_rollback_path(fix_script: str) -> str:
    """Return where the rollback goes beside a fix script: ``fix.sh`` -> ``fix.rollback.sh``."""
    base, ext = os.path.splitext(fix_script)
    return f"{base}.rollback{ext or '.sh'}"


@dataclass(frozen=True)
class ScriptResult:
    """What running a script returned."""

    returncode: int
    output: str


@dataclass(frozen=True)
class ApplyResult:
    """The script's outcome and the audits before and after it."""

    script: ScriptResult
    before: Report
    after: Report


def run_local_script(script: str) -> ScriptResult:
    """Run a script with this machine's bash, echoing its output; return code and output."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="host-auditor-fix-",
                                     delete=False, encoding="utf-8") as handle:
        handle.write(script)
        path = handle.name
    try:
        proc = subprocess.run(["bash", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False)
    finally:
        os.unlink(path)
    return ScriptResult(proc.returncode, proc.stdout)


def apply(
    plan: FixPlan,
    before: Report,
    execute: Callable[[str], ScriptResult],
    reaudit: Callable[[], Report],
) -> ApplyResult:
    """Run the plan's fix script through ``execute``, then audit again."""
    result = execute(render_fix_script(plan))
    return ApplyResult(result, before, reaudit())


def compare(before: Report, after: Report) -> str:
    """Return each check's worst status before and after, naming subjects still at fault."""
    from auditor.model import worst

    checks = list(dict.fromkeys([r.check for r in before.results]
                                + [r.check for r in after.results]))
    if not checks:
        return "before -> after: no checks ran\n"
    width = max(len(c) for c in checks)
    lines = ["before -> after:"]
    for check in checks:
        was = worst(f.status for f in before.findings if f.check == check).value
        now_findings = [f for f in after.findings if f.check == check]
        now = worst(f.status for f in now_findings).value
        left = [f.subject for f in now_findings if f.status in (*FIXABLE, Status.ERROR)]
        still = f"  ({', '.join(left)})" if left else ""
        lines.append(f"  {check.ljust(width)}  {was:>5} -> {now}{still}")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str, executable: bool = True) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        if executable:
            os.chmod(path, 0o755)  # noqa: S103 - a script the operator runs
    except OSError as exc:
        raise UsageError(f"{path}: cannot write script ({exc.strerror})") from exc


@dataclass(frozen=True)
class LocalFixRequest:
    """What ``audit local`` was asked to do with the findings."""

    root: str | None = None
    fix_script: str | None = None
    rollback_script: str | None = None
    apply: bool = False
    yes: bool = False


def fix_local(
    host: Host,
    report: Report,
    checks: Sequence[Any],
    policy: Policy,
    request: LocalFixRequest,
    *,
    reopen: Callable[[], Host],
    debug: bool = False,
    execute: Callable[[str], ScriptResult] = run_local_script,
    where: str | None = None,
    remote: bool = False,
) -> tuple[Report, int]:
    """Write and/or apply the fix for one host; return the report to show and an exit code.

    ``execute`` runs the fix script where the host is (this machine's bash by default;
    ``audit host`` passes one that uploads it and runs it with sudo, and ``remote``).

    The exit code is 1 when the fix script failed or was refused, else 0.
    """
    from auditor.runner import audit

    plan = build_fix(host, report, policy)
    fix_text = render_fix_script(plan)
    rollback_text = render_rollback_script(plan)
    rollback_path = request.rollback_script or (
        default_rollback_path(request.fix_script) if request.fix_script else None
    )
    if request.fix_script:
        _write(request.fix_script, fix_text)
    if rollback_path:
        _write(rollback_path, rollback_text)
    where = where or plan.root or "this machine"
    print(plan.summary(), file=sys.stderr)
    if request.fix_script or rollback_path:
        names = " and ".join(p for p in (request.fix_script, rollback_path) if p)
        print(f"wrote {names}", file=sys.stderr)
    if not request.apply:
        print("dry run: nothing changed (run the script, or pass --apply)", file=sys.stderr)
        return report, 0
    if not plan.actions:
        print("nothing to apply", file=sys.stderr)
        return report, 0
    if not request.yes:
        if not sys.stdin.isatty():
            raise UsageError("--apply changes the host: confirm with --yes when not on a terminal")
        answer = input(f"apply {len(plan.actions)} step(s) to {where}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not applied", file=sys.stderr)
            return report, 1

    def reaudit() -> Report:
        with reopen() as fresh:
            return audit(fresh, checks, policy, debug=debug)

    result = apply(plan, report, execute, reaudit)
    sys.stderr.write(result.script.output)
    print(compare(result.before, result.after), end="", file=sys.stderr)
    if result.script.returncode != 0:
        print(f"audit: error: the fix script exited {result.script.returncode}",
              file=sys.stderr)
        return result.after, 1
    kept = f"{plan.root}/var/lib/host-auditor/{plan.fix_id}/rollback.sh"
    if remote:
        # The rollback runs where the fix ran; the fix keeps a copy of it there.
        print(f"undo on {where} with: sudo bash {shlex.quote(kept)}"
              + (f" (the same script as {rollback_path})" if rollback_path else ""),
              file=sys.stderr)
    else:
        print(f"undo with: bash {shlex.quote(rollback_path or kept)}", file=sys.stderr)
    return result.after, 0
