"""The tuner's plan: findings -> remedies -> one plan of steps, as values.

:func:`build_fix` asks each fixable check (``Check.remediate``) for remedies,
reading more of the host through the Host seam where it needs to, merges the
boot command line edits into one, and returns a :class:`FixPlan`. Nothing here
prints, prompts or runs anything: :mod:`auditor.render` turns a plan into the
fix and rollback scripts, and a host that can run them does (``Host.run_script``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from auditor.check import CheckClass
from auditor.errors import UsageError
from auditor.hosts.base import Host
from auditor.model import FIXABLE, Finding, Report
from auditor.parsing import parse_os_release
from auditor.policy import Policy
from auditor.remediations.boot import boot_remedy
from auditor.remedy import FixContext, MakeSymlink, Remedy, RunCommand, SetPciBits, Step
from auditor.shipped.sysroot_fix import PLAN_FORMAT, machine_id_digest


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
    #: Salts the machine-id's hash: the scripts carry the hash, never the machine-id.
    salt: str = ""

    @property
    def sysroot(self) -> bool:
        return bool(self.root)

    @property
    def machine_id_salt(self) -> str:
        return self.salt or self.fix_id

    @property
    def machine_id_sha256(self) -> str:
        """Return the salted hash the scripts' guard compares ("" when there is no id)."""
        if not self.machine_id:
            return ""
        return machine_id_digest(self.machine_id_salt, self.machine_id)

    def document(self) -> dict[str, Any]:
        """Return the plan as the sysroot fix program reads it (JSON, steps as values)."""
        actions: list[dict[str, Any]] = []
        for action in self.actions:
            step = action.step
            if isinstance(step, RunCommand):
                continue  # never run on a sysroot
            item: dict[str, Any] = {"id": action.id, "kind": step.kind,
                                    "fix": step.verbs.fix, "undo": step.verbs.undo,
                                    **dataclasses.asdict(step)}
            if isinstance(step, SetPciBits) and step.field is not None:
                item["field"] = list(step.field)
            actions.append(item)
        return {
            "format": PLAN_FORMAT,
            "fix_id": self.fix_id,
            "host": self.host,
            "hostname": self.hostname,
            "machine_id_salt": self.machine_id_salt,
            "machine_id_sha256": self.machine_id_sha256,
            "actions": actions,
        }

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


def _clean_remedy(remedy: Remedy, host: Host | None = None) -> Remedy:
    def usable(step: Step) -> bool:
        path = getattr(step, "path", None)
        # A name that is not UTF-8 on the host reached the plan escaped: no file has it.
        return _clean(step) and not (isinstance(path, str) and host is not None
                                     and host.names.escaped(path))

    runtime = tuple(s for s in remedy.runtime if usable(s))
    persistent = tuple(s for s in remedy.persistent if usable(s))
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
    path = getattr(step, "path", None)
    if not isinstance(path, str):
        return step
    try:
        if isinstance(step, MakeSymlink):
            # The link itself is made, not followed: resolve the directory it goes in.
            parent, _, name = path.rpartition("/")
            return dataclasses.replace(step, path=host.resolve(parent or "/").rstrip("/")
                                       + "/" + name)
        return dataclasses.replace(step, path=host.resolve(path))  # type: ignore[arg-type]
    except OSError:
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
    if host.root is None:
        raise UsageError(
            f"{host.target}: a fix script needs a sysroot directory; unpack the capture "
            "(tar -xzf) and pass the directory to --root"
        )
    return host.root


def build_fix(
    host: Host,
    report: Report,
    checks: Sequence[CheckClass],
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
    fixable = {c.id: c for c in checks if c.fixable()}
    problems: dict[str, list[Finding]] = {}
    unhandled: list[tuple[Finding, str]] = []
    for finding in report.findings:
        if finding.counted not in FIXABLE:  # a waived finding is accepted: no fix
            continue
        if finding.check in fixable:
            problems.setdefault(finding.check, []).append(finding)
        else:
            unhandled.append((finding, "no remediation for this check"))
    remedies: list[Remedy] = []
    context = FixContext(sysroot=bool(root), os_release=os_release)
    for check_id, findings in problems.items():
        check = fixable[check_id]
        remedies.extend(check(policy.options_for(check)).remediate(host, findings, context))
    params = [p for r in remedies for p in r.boot_params]
    if params:
        remedies.append(boot_remedy(host, params, os_release))
    remedies = [_clean_remedy(r, host) for r in remedies]
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
    return FixPlan(
        host=report.host,
        target=report.target,
        hostname=hostname,
        machine_id=machine_id,
        root=root,
        # Unpredictable: nobody can prepare a place for a fix's state before it runs.
        fix_id=fix_id or f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(6)}",
        created=now.isoformat(timespec="seconds"),
        sections=tuple(sections),
        unhandled=tuple(unhandled),
        salt=secrets.token_hex(8),
    )
