"""Commands for pipelines and fleets: snapshot, fingerprint, merge and watch.

Registered on :data:`auditor.cli.app` by :func:`register`. Every heavy import
(the collector, Jinja, pyudev) happens inside the command that needs it, so
``audit local`` starts as fast as before.

``audit merge`` exit codes: 2 if any input file could not be read (the rest are
still merged and the report written), else as ``audit local``: 3 if a host in
the results could not be audited, 1 if a finding is at or above ``--fail-on``,
0 otherwise.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

# auditor.cli imports this module at its end, once what is taken from it is defined.
from auditor.cli import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    AuditOptions,
    CheckOpt,
    DebugOpt,
    FailOnOpt,
    OutputOpt,
    PolicyOpt,
    ProfileOpt,
    SkipOpt,
    fatal,
    prepare,
    write_output,
)
from auditor.errors import AuditorError
from auditor.model import FailOn

RootOpt = Annotated[
    str | None,
    typer.Option("--root", help="Read a sysroot: a directory or a .tar.gz capture.",
                 metavar="PATH"),
]


def note(message: str) -> None:
    """Print one line of information to stderr."""
    print(f"audit: {message}", file=sys.stderr)


def fingerprint_command(
    target: Annotated[str, typer.Argument(help="local (the default).", metavar="[local]")]
    = "local",
    root: RootOpt = None,
    report_file: Annotated[
        str | None,
        typer.Option("--report", help="Fingerprint a saved JSON report instead of auditing.",
                     metavar="FILE"),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.",
                                     metavar="FORMAT")] = "text",
    output: OutputOpt = None,
    check: CheckOpt = None,
    skip: SkipOpt = None,
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Print a short, stable fingerprint of the host's tuned state, for benchmark results."""
    import json

    from auditor.fleet import fingerprint, fingerprint_inputs

    if fmt not in ("text", "json"):
        fatal(f"unknown format {fmt!r} (formats: text, json)", EXIT_USAGE)
    if target != "local":
        fatal(f"unknown target {target!r}: use local, --root PATH or --report FILE", EXIT_USAGE)
    try:
        if report_file is not None:
            from auditor.fleet import load_results

            loaded = load_results([report_file])
            if loaded.unreadable:
                fatal(loaded.unreadable[0].line().replace("; left out of the merge", ""),
                      EXIT_USAGE)
            if len(loaded.reports) != 1:
                fatal(f"{report_file}: holds {len(loaded.reports)} hosts; give one host's report",
                      EXIT_USAGE)
            report = loaded.reports[0]
        else:
            from auditor.hosts import LocalHost, open_sysroot
            from auditor.runner import audit

            options = AuditOptions("text", None, tuple(check or ()), tuple(skip or ()),
                                   FailOn.FAIL, policy, profile)
            checks, loaded_policy = prepare(options)
            host = open_sysroot(root) if root is not None else LocalHost()
            with host:
                report = audit(host, checks, loaded_policy)
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)
    stamp = fingerprint(report)
    if fmt == "json":
        document = {"host": report.host, "fingerprint": stamp, "inputs": fingerprint_inputs(report)}
        write_output(json.dumps(document, indent=2, ensure_ascii=False) + "\n", output)
    else:
        write_output(stamp + "\n", output)


def _expand(paths: list[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files.extend(
                os.path.join(path, name) for name in sorted(os.listdir(path))
                if name.endswith(".json")
            )
        else:
            files.append(path)
    return files


def merge_command(
    results: Annotated[list[str], typer.Argument(
        help="Per-host JSON reports (audit local --format json), or directories of them.",
        metavar="RESULTS...")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="text, json, html or prometheus.",
                                     metavar="FORMAT")] = "text",
    output: OutputOpt = None,
    golden: Annotated[
        str | None,
        typer.Option("--golden", help="Diff every host against this host's results.",
                     metavar="HOST"),
    ] = None,
    fail_on: FailOnOpt = FailOn.FAIL,
) -> None:
    """Merge per-host JSON results into one fleet report; diff against a golden host."""
    from auditor.fleet import FLEET_FORMATS, fleet_view, load_results, render_fleet

    if fmt not in FLEET_FORMATS:
        fatal(f"unknown format {fmt!r} (formats: {', '.join(FLEET_FORMATS)})", EXIT_USAGE)
    loaded = load_results(_expand(results))
    for bad in loaded.unreadable:
        print(f"audit: error: {bad.line()}", file=sys.stderr)
    for line in loaded.notes:
        note(f"note: {line}")
    if not loaded.reports:
        fatal("no readable results to merge", EXIT_USAGE)
    hosts = {r.host for r in loaded.reports}
    if golden is not None and golden not in hosts:
        fatal(f"golden host {golden!r} is not among the merged results", EXIT_USAGE)
    if golden is not None and any(r.error for r in loaded.reports if r.host == golden):
        fatal(f"golden host {golden!r} could not be audited: pick another", EXIT_USAGE)
    view = fleet_view(loaded, golden)
    write_output(render_fleet(view, fmt), output)
    if loaded.unreadable:
        raise typer.Exit(EXIT_USAGE)
    codes = [r.exit_code(fail_on) for r in loaded.reports]
    code = EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else max(codes, default=EXIT_OK)
    raise typer.Exit(code)


def watch_command(
    check: CheckOpt = None,
    skip: SkipOpt = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after N relevant device events.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.0, help="Stop after S seconds.",
                                   metavar="S")
    ] = None,
    source: Annotated[
        str, typer.Option("--source", help="auto, udev (events udevd has processed) or kernel.")
    ] = "auto",
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Re-run the affected checks on PCI and NVIDIA device events; print what changes."""
    from auditor.watch import WATCHED, watch

    if source not in ("auto", "udev", "kernel"):
        fatal(f"unknown event source {source!r} (auto, udev, kernel)", EXIT_USAGE)
    options = AuditOptions("text", None, tuple(check or ()), tuple(skip or ()), FailOn.FAIL,
                           policy, profile, debug)
    try:
        checks, loaded_policy = prepare(options)
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)
    watched = [c for c in checks if c.id in WATCHED]
    if not watched:
        fatal("none of the selected checks reacts to device events "
              f"(watched: {', '.join(sorted(WATCHED))})", EXIT_USAGE)
    try:
        watch(watched, loaded_policy, count=count, timeout=timeout, source=source, debug=debug)
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)


def snapshot_command(
    target: Annotated[str, typer.Argument(
        help="local, or [USER@]HOST[:PORT] reached over SSH.", metavar="TARGET")],
    output: Annotated[str, typer.Option("--output", "-o", help="Capture file (.tar.gz; - for "
                                        "stdout).", metavar="FILE")],
    check: CheckOpt = None,
    skip: SkipOpt = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="SSH: log in as USER.")] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535,
                                             help="SSH port.")] = None,
    identity: Annotated[str | None, typer.Option("--identity", metavar="KEYFILE",
                                                 help="SSH: private key to offer.")] = None,
    sudo: Annotated[bool, typer.Option("--sudo", help="SSH: collect under 'sudo -n'.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1,
                                           help="SSH: seconds to connect and collect.")] = 10.0,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="SSH: trust an unknown host key on first use.")] = False,
    known_hosts: Annotated[str | None, typer.Option(
        "--known-hosts", metavar="FILE", help="SSH: also trust the keys in FILE.")] = None,
    ssh_config: Annotated[str | None, typer.Option(
        "--ssh-config", metavar="FILE", help="SSH: read this ssh config.")] = None,
) -> None:
    """Capture exactly what the checks read into a sysroot .tar.gz, for audit local --root."""
    from auditor.snapshot import snapshot

    options = AuditOptions("text", None, tuple(check or ()), tuple(skip or ()))
    try:
        checks, _ = prepare(options)
        ssh_options = None
        if target != "local":
            from auditor.hosts.ssh import SshOptions

            ssh_options = SshOptions(
                user=user, port=port, identity=identity, sudo=sudo, timeout=timeout,
                accept_new_host_keys=accept_new_host_keys,
                known_hosts=(known_hosts,) if known_hosts else (), ssh_config=ssh_config,
            )
        summary = snapshot(target, checks, output, ssh_options)
    except AuditorError as exc:
        fatal(str(exc), exc.exit_code)
    note(summary)


def register(app: typer.Typer) -> None:
    """Add the pipeline and fleet commands to the ``audit`` application."""
    app.command("snapshot")(snapshot_command)
    app.command("fingerprint")(fingerprint_command)
    app.command("merge")(merge_command)
    app.command("watch")(watch_command)
