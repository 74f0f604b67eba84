"""``--fix-script``, ``--rollback-script`` and ``--apply``: the one fix path of ``audit local``
and ``audit host``.

The plan is built by :func:`auditor.fix.build_fix`, rendered by
:func:`auditor.render.render_fix`, and run by the host itself
(``Host.run_script``: this machine's bash for ``audit local``, ``sudo -n bash -s``
over the open connection for ``audit host``). This module does the talking: what
the plan does, the question before applying, before and after.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.check import CheckClass
from auditor.errors import UsageError
from auditor.hosts.base import Host
from auditor.model import Report
from auditor.policy import Policy

if TYPE_CHECKING:
    from auditor.fix import FixPlan


@dataclass(frozen=True)
class FixRequest:
    """What the command line asked to do with the findings."""

    fix_script: str | None = None
    rollback_script: str | None = None
    apply: bool = False
    yes: bool = False

    @property
    def wanted(self) -> bool:
        """Return whether any fix was asked for."""
        return bool(self.fix_script or self.rollback_script or self.apply)

    @property
    def rollback_path(self) -> str | None:
        """Return where the rollback is written: as asked, or beside the fix script."""
        if self.rollback_script:
            return self.rollback_script
        return default_rollback_path(self.fix_script) if self.fix_script else None

    def check_paths(self) -> None:
        """Raise a usage error now, before any audit, for a script that could not be written
        or an ``--apply`` that could not be confirmed."""
        from auditor.cli.options import check_output_path

        check_output_path(self.fix_script, "fix script")
        check_output_path(self.rollback_path, "rollback script")
        if self.apply and not self.yes and not sys.stdin.isatty():
            raise UsageError("--apply changes the host: confirm with --yes when not on a terminal")


def default_rollback_path(fix_script: str) -> str:
    """Return where the rollback goes beside a fix script: ``fix.sh`` -> ``fix.rollback.sh``."""
    base, ext = os.path.splitext(fix_script)
    return f"{base}.rollback{ext or '.sh'}"


def _write(path: str, text: str) -> None:
    """Write a script whole, never through another user's symlink or onto a device."""
    from auditor.outfile import write_text

    try:
        write_text(path, text, 0o755)  # a script the operator runs
    except OSError as exc:
        raise UsageError(f"{path}: cannot write script ({exc.strerror})") from exc


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def fix(
    host: Host,
    report: Report,
    checks: Sequence[CheckClass],
    policy: Policy,
    request: FixRequest,
    *,
    reaudit: Callable[[], Report],
    where: str,
    remote: bool = False,
    sudo: bool = False,
    prove: Callable[[], Report] | None = None,
) -> tuple[Report, int]:
    """Write and/or apply the fix for one host; return the report to show and an exit code.

    With ``prove`` (``--prove``: it runs the probes), the probes run before the fix and
    after it, and the report holds both figures and their change.
    The exit code is 1 when the fix script failed or was refused, else 0.
    """
    from auditor.fix import build_fix
    from auditor.render import printable_lines, render_comparison, render_fix

    plan = build_fix(host, report, checks, policy)
    scripts = render_fix(plan)
    if request.fix_script:
        _write(request.fix_script, scripts.script)
    rollback_path = request.rollback_path
    if rollback_path:
        _write(rollback_path, scripts.rollback)
    _say(printable_lines(plan.summary()).rstrip("\n"))
    if request.fix_script or rollback_path:
        _say(f"wrote {' and '.join(p for p in (request.fix_script, rollback_path) if p)}")
    if not request.apply:
        _say("dry run: nothing changed (run the script, or pass --apply)")
        return report, 0
    if not plan.actions:
        _say("nothing to apply")
        return report, 0
    if not request.yes:
        if not sys.stdin.isatty():
            raise UsageError("--apply changes the host: confirm with --yes when not on a terminal")
        answer = input(f"apply {len(plan.actions)} step(s) to {where}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            _say("not applied")
            return report, 1
    probes_before = prove() if prove is not None else None
    result = host.run_script(scripts.script, sudo=sudo)
    after = reaudit()
    # What the script printed came from the host: each line made printable.
    sys.stderr.write(printable_lines(result.output))
    print(render_comparison(report, after), end="", file=sys.stderr)
    worse = 0
    if prove is not None and probes_before is not None:
        from auditor.probes.prove import change_findings, proven, summary_lines

        probes_after = prove()
        changes = change_findings(probes_before, probes_after)
        for line in summary_lines(changes):
            _say(printable_lines(line).rstrip("\n"))
        worse = sum(1 for f in changes if f.status.rank)
        after = proven(after, probes_before, probes_after)
    if result.returncode != 0:
        _say(f"audit: error: the fix script exited {result.returncode}")
        return after, 1
    kept = kept_rollback(plan, local=not remote)
    if worse:
        _say(f"audit: warning: the fix made {worse} measured figure(s) worse: roll it back "
             "with the command below")
    if remote:
        # The rollback runs where the fix ran; the fix keeps a copy of it there.
        _say(f"undo on {where} with: sudo bash {shlex.quote(kept)}"
             + (f" (the same script as {rollback_path})" if rollback_path else ""))
    else:
        _say(f"undo with: bash {shlex.quote(rollback_path or kept)}")
    return after, 0


def kept_rollback(plan: FixPlan, *, local: bool) -> str:
    """Return where the fix keeps its copy of the rollback once it changed something.

    A booted machine's fix keeps it in ``/var/lib/host-auditor/FIX-ID/``. A sysroot's keeps
    it on the side of whoever ran the fix, never in the sysroot (see
    :mod:`auditor.shipped.sysroot_fix`); on a remote host, as root (the fix ran under sudo).
    """
    from auditor.shipped import sysroot_fix

    if not plan.sysroot:
        return f"/var/lib/host-auditor/{plan.fix_id}/rollback.sh"
    if local:
        return os.path.join(sysroot_fix.state_dir(os.path.realpath(plan.root), plan.fix_id),
                            "rollback.sh")
    return (f"/var/lib/host-auditor/sysroots/{sysroot_fix.state_key(plan.root)}/"
            f"{plan.fix_id}/rollback.sh")
