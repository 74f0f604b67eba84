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
    ColorOpt,
    DebugOpt,
    FailOnOpt,
    FixScriptOpt,
    FormatOpt,
    OutputOpt,
    PolicyOpt,
    ProfileOpt,
    QuietOpt,
    RollbackScriptOpt,
    RootOpt,
    SkipOpt,
    VerboseOpt,
    YesOpt,
    choice,
    emit,
    fatal,
    handle_errors,
    note,
    prepare,
    set_verbosity,
    verbose,
)
from auditor.cli.probe import ProveOpt, ProveProbeOpt, prove_request
from auditor.errors import UsageError
from auditor.model import Report

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from auditor.check import CheckClass
    from auditor.hosts.base import Host
    from auditor.policy import Policy


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
    color: ColorOpt = "auto",
    quiet_: QuietOpt = False,
    verbose_: VerboseOpt = False,
    retry_for: Annotated[float | None, typer.Option(
        "--retry-for", metavar="DURATION", parser=lambda text: parse_duration(text),
        help="Audit again until nothing trips --fail-on or DURATION (60s, 2m, 90) has "
             "passed: a pre-flight right after boot, while services settle.")] = None,
) -> None:
    """Audit this machine, or a captured sysroot with --root."""
    from auditor.cli.fix import FixRequest, fix
    from auditor.hosts import LocalHost
    from auditor.runner import audit

    options = AuditOptions.of(fmt, output, check, skip, fail_on, policy, profile, debug, color)
    request = FixRequest(fix_script, rollback_script, apply, yes)
    fix_code = EXIT_OK
    with handle_errors(debug):
        set_verbosity(quiet_, verbose_)
        request.check_paths()
        probes = prove_request(prove, probe, apply, root)
        checks, loaded = prepare(options)

        def open_host() -> Host:
            return open_target(root) if root is not None else LocalHost()

        if retry_for is not None and request.wanted:
            raise UsageError("--retry-for waits for a clean audit; it does not fix: drop "
                             "--fix-script/--apply")
        with open_host() as host:
            report = audit(host, checks, loaded, debug=debug)
            if retry_for is not None:
                report = _retry(report, retry_for, options, lambda: _audit_again(
                    open_host, checks, loaded, debug))
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


#: Seconds between two audits of ``--retry-for`` (goss's ``--sleep`` is 1 s; an audit of the
#: live machine takes a fraction of a second, and a settling service a few).
RETRY_SLEEP_S = 2.0
_DURATION = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Parse ``60s``, ``2m``, ``1h`` or plain seconds; a bad value is a usage error."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in ("s", "m", "h") else ""
    number = value[: len(value) - len(unit)]
    try:
        seconds = float(number) * _DURATION[unit]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a duration (60s, 2m, 1h or seconds)") from None
    if not 0 < seconds <= 86400:
        raise typer.BadParameter(f"{text!r}: give a duration from 1 s to 24 h")
    return seconds


def _audit_again(open_host: Callable[[], Host], checks: Sequence[CheckClass],
                 policy: Policy, debug: bool) -> Report:
    from auditor.runner import audit

    with open_host() as fresh:
        return audit(fresh, checks, policy, debug=debug)


def _retry(report: Report, seconds: float, options: AuditOptions,
           again: Callable[[], Report]) -> Report:
    """Audit again, every :data:`RETRY_SLEEP_S`, until the exit code is 0 or ``seconds``
    have passed since the first audit; return the last report (as goss's ``--retry-timeout``)."""
    import time

    deadline = time.monotonic() + seconds
    tries = 1
    while report.exit_code(options.fail_on) != EXIT_OK:
        left = deadline - time.monotonic()
        if left <= 0:
            note(f"--retry-for: still not clean after {tries} audits ({seconds:g} s)")
            break
        verbose(f"--retry-for: audit {tries} not clean; again in {min(RETRY_SLEEP_S, left):g} s")
        time.sleep(min(RETRY_SLEEP_S, left))
        report = again()
        tries += 1
    else:
        if tries > 1:
            note(f"--retry-for: clean at audit {tries}")
    return report


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


#: What each built-in profile is for (its thresholds are the checks' own ``profiles``).
PROFILE_PURPOSE = {
    "gpu-inference": "the default: tuned for GPU inference serving",
    "latency": "as gpu-inference, held tighter where latency is at stake",
    "throughput": "as gpu-inference, looser where only throughput counts",
}


def profiles_command(
    fmt: Annotated[str, typer.Option(
        "--format", "-f", metavar="[text|json]", callback=choice("format", ("text", "json")),
        help="text: each profile and the options it sets; json: the same as data.")] = "text",
) -> None:
    """List the built-in profiles and, per check, the options each one sets."""
    from auditor.registry import DEFAULT_PROFILE, PROFILES, load_checks

    with handle_errors():
        classes = load_checks()
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name in PROFILES:
        table[name] = {}
        for cls in classes:
            specs = cls.options_type.specs()
            values = {key: spec.default for key, spec in specs.items()}
            if name != DEFAULT_PROFILE:
                values.update(cls.profiles.get(name, {}))
            changed = {k: v for k, v in values.items()
                       if name == DEFAULT_PROFILE or v != specs[k].default}
            if changed:
                table[name][cls.id] = changed
    if fmt == "json":
        print(json.dumps({name: {"default": name == DEFAULT_PROFILE,
                                 "purpose": PROFILE_PURPOSE.get(name, ""), "checks": checks}
                          for name, checks in table.items()}, indent=2, ensure_ascii=False))
        return
    lines: list[str] = []
    for name, checks in table.items():
        lines.append(f"{name}{' (default)' if name == DEFAULT_PROFILE else ''}: "
                     f"{PROFILE_PURPOSE.get(name, '')}")
        if name != DEFAULT_PROFILE and not checks:
            lines.append("  (the defaults)")
        for check_id, values in checks.items():
            shown = ", ".join(f"{k} = {v!r}" for k, v in values.items())
            lines.append(f"  {check_id}: {shown}")
        lines.append("")
    lines.append("Choose one with --profile NAME or profile = \"NAME\" in the policy file; "
                 "audit explain ID says what each option means.")
    print("\n".join(lines))


#: The variable click's shell completion reads (``_<PROG>_COMPLETE``).
COMPLETE_ENV = "_AUDIT_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def completion_command(
    shell: Annotated[str, typer.Argument(metavar="[bash|zsh|fish]",
                                         help="The shell to complete audit in.")],
) -> None:
    """Print the shell completion script: eval "$(audit completion bash)" in ~/.bashrc, or
    save it as /etc/bash_completion.d/audit."""
    if shell not in SHELLS:
        fatal(f"unknown shell {shell!r} (choose from {', '.join(SHELLS)})", EXIT_USAGE)
    from typer._click.shell_completion import get_completion_class
    from typer._completion_classes import completion_init
    from typer.main import get_command

    from auditor.cli import app

    completion_init()
    completer = get_completion_class(shell)
    assert completer is not None
    print(completer(get_command(app), {}, "audit", COMPLETE_ENV).source())


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
