"""``audit local``, ``audit checks`` and ``audit explain``."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Annotated, Any

import typer

from auditor.cli.options import (
    EXIT_OK,
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
    RootOpt,
    SkipOpt,
    YesOpt,
    choice,
    emit,
    fatal,
    handle_errors,
    prepare,
)
from auditor.cli.probe import ProveOpt, ProveProbeOpt, prove_request
from auditor.errors import UsageError
from auditor.model import Report

if TYPE_CHECKING:
    from auditor.check import CheckClass
    from auditor.hosts.base import Host


def local_command(
    root: RootOpt = None,
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
    apply: Annotated[bool, typer.Option("--apply", help="Run the fix, then audit again and "
                                        "show before and after.")] = False,
    yes: YesOpt = False,
    prove: ProveOpt = False,
    probe: ProveProbeOpt = None,
) -> None:
    """Audit this machine, or a captured sysroot with --root."""
    from auditor.cli.fix import FixRequest, fix
    from auditor.hosts import LocalHost
    from auditor.runner import audit

    options = AuditOptions.of(fmt, output, check, skip, fail_on, policy, profile, debug)
    request = FixRequest(fix_script, rollback_script, apply, yes)
    fix_code = EXIT_OK
    with handle_errors(debug):
        request.check_paths()
        probes = prove_request(prove, probe, apply, root)
        checks, loaded = prepare(options)

        def open_host() -> Host:
            return open_target(root) if root is not None else LocalHost()

        with open_host() as host:
            report = audit(host, checks, loaded, debug=debug)
            if request.wanted:
                def reaudit() -> Report:
                    with open_host() as fresh:
                        return audit(fresh, checks, loaded, debug=debug)

                def run_probes() -> Report:
                    from auditor.cli.probe import probe_local

                    assert probes is not None
                    return probe_local(probes)

                report, fix_code = fix(host, report, checks, loaded, request, reaudit=reaudit,
                                       where=host.root or "this machine",
                                       prove=run_probes if probes is not None else None)
    raise typer.Exit(max(emit([report], options), fix_code))


#: What a sysroot holds at least one of; a directory with none of them is not one.
SYSROOT_DIRS = ("/proc", "/sys", "/etc")


def open_target(root: str) -> Host:
    """Open a sysroot (directory or capture); one that holds no proc, sys or etc is a usage
    error, not an audit of nothing."""
    from auditor.hosts import open_sysroot

    host = open_sysroot(root)
    if not any(host.is_dir(path) for path in SYSROOT_DIRS):
        host.close()
        raise UsageError(f"{root}: does not look like a sysroot (no proc, sys or etc in it)")
    return host


def with_local_plugins(policy: str | None) -> list[CheckClass]:
    """Return every registered check, and the site's own from ``policy``'s local-plugins."""
    from auditor.policy import local_plugins, read_policy
    from auditor.registry import load_checks, validate

    every = load_checks()
    local = local_plugins(read_policy(policy)) if policy is not None else []
    return validate([*every, *local]) if local else every


def checks_command(
    fmt: Annotated[str, typer.Option(
        "--format", "-f", metavar="[text|json]", callback=choice("format", ("text", "json")),
        help="text: a line per check; json: everything about each check.")] = "text",
    policy: PolicyOpt = None,
) -> None:
    """List the checks with id, severity and one line each."""
    with handle_errors():
        classes = with_local_plugins(policy)
    if fmt == "json":
        print(json.dumps([describe_check(c) for c in classes], indent=2, ensure_ascii=False))
        return
    width = max(len(c.id) for c in classes)
    for cls in classes:
        print(f"{cls.id.ljust(width)}  {cls.severity.value:<8}  {cls.summary()}")


def describe_check(cls: CheckClass) -> dict[str, Any]:
    """Return everything a check declares, as ``audit checks --format json`` lists it."""
    options = {
        spec.name: {
            "default": spec.default,
            "allowed": spec.allowed(),
            **({"choices": list(spec.choices)} if spec.choices is not None else {}),
            "profiles": {name: values[spec.name] for name, values in cls.profiles.items()
                         if spec.name in values},
            "help": spec.help,
        }
        for spec in cls.options_type.specs().values()
    }
    return {
        "id": cls.id,
        "severity": cls.severity.value,
        "version_added": cls.version_added,
        "summary": cls.summary(),
        "rationale": " ".join(cls.rationale.split()),
        "remedy": " ".join(cls.remedy.split()),
        "reads": list(cls.reads),
        "fixable": cls.fixable(),
        "fix_reads": list(cls.fix_reads),
        "events": sorted(e.value for e in cls.events),
        "options": options,
    }


def explain_command(check_id: Annotated[str, typer.Argument(metavar="ID")],
                    policy: PolicyOpt = None) -> None:
    """Explain what a check looks at, why it matters for inference, and how it is fixed."""
    with handle_errors():
        classes = {c.id: c for c in with_local_plugins(policy)}
    if check_id not in classes:
        fatal(f"unknown check id {check_id!r} (known: {', '.join(sorted(classes))})", EXIT_USAGE)
    cls = classes[check_id]

    def para(text: str) -> str:
        return textwrap.fill(" ".join(text.split()), width=88, initial_indent="  ",
                             subsequent_indent="  ")

    lines = [f"{cls.id}  ({cls.severity.value})", "", para(cls.summary()), "", "Looks at:"]
    lines += [f"  {pattern}" for pattern in cls.reads]
    lines += ["", "Why it matters for inference:", para(cls.rationale), "", "How it is fixed:",
              para(cls.remedy)]
    specs = cls.options_type.specs()
    if specs:
        lines += ["", "Policy options (defaults):"]
        for spec in specs.values():
            per_profile = "".join(f"; {name}: {values[spec.name]!r}"
                                  for name, values in cls.profiles.items()
                                  if spec.name in values)
            lines.append(f"  {spec.name} = {spec.default!r}  ({spec.allowed()}{per_profile})")
            if spec.help:
                lines.append(f"      {spec.help}")
    if cls.fixable():
        lines += ["", "Fixable: --fix-script writes its fix."]
    if cls.events:
        lines += ["", "Re-run by audit watch on: "
                  + ", ".join(sorted(e.value for e in cls.events))]
    if cls.version_added:
        lines += ["", f"Added in version {cls.version_added}."]
    print("\n".join(lines))
