"""Commands for pipelines and fleets: snapshot, fingerprint, merge and watch.

Every heavy import (the collector, Jinja, pyudev) happens inside the command that
needs it, so ``audit local`` starts as fast as before.

``audit merge`` exit codes: 2 if any input file could not be read (the rest are
still merged and the report written), else as ``audit local``: 3 if a host in
the results could not be audited, 1 if a finding is at or above ``--fail-on``,
0 otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from auditor.cli.options import (
    EXIT_USAGE,
    AcceptNewOpt,
    AuditOptions,
    CheckOpt,
    DebugOpt,
    FailOnOpt,
    IdentityOpt,
    KnownHostsOpt,
    OutputOpt,
    PolicyOpt,
    PortOpt,
    ProfileOpt,
    RootOpt,
    SkipOpt,
    SshConfigOpt,
    SudoOpt,
    TimeoutOpt,
    UserOpt,
    check_output_path,
    choice,
    exit_code,
    fatal,
    handle_errors,
    infer_format,
    metavar,
    note,
    prepare,
    ssh_options,
    write_output,
    write_output_chunks,
)
from auditor.model import FailOn
from auditor.render import FLEET_FORMATS

if TYPE_CHECKING:
    from auditor.results import Paths

FINGERPRINT_FORMATS = ("text", "json")
#: ``audit merge``'s formats (the fleet report).
MERGE_FORMATS = FLEET_FORMATS
SOURCES = ("auto", "udev", "kernel")


def fingerprint_command(
    target: Annotated[str, typer.Argument(help="local (the default).", metavar="[local]")]
    = "local",
    root: RootOpt = None,
    report_file: Annotated[
        str | None,
        typer.Option("--report", help="Fingerprint a saved JSON report instead of auditing.",
                     metavar="FILE"),
    ] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", metavar=metavar(FINGERPRINT_FORMATS),
        callback=choice("format", FINGERPRINT_FORMATS),
        help="Output format (default: from the --output file's extension, else text).")] = None,
    output: OutputOpt = None,
    check: CheckOpt = None,
    skip: SkipOpt = None,
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Print a short, stable fingerprint of the host's tuned state, for benchmark results."""
    import json

    from auditor.model import fingerprint, fingerprint_inputs

    fmt = infer_format(fmt, output, FINGERPRINT_FORMATS)
    if target != "local":
        fatal(f"unknown target {target!r}: use local, --root PATH or --report FILE", EXIT_USAGE)
    with handle_errors():
        check_output_path(output)
        if report_file is not None:
            from auditor.results import load_results

            loaded = load_results([report_file])
            if loaded.unreadable:
                fatal(loaded.unreadable[0].line().replace("; left out of the merge", ""),
                      EXIT_USAGE)
            if len(loaded.reports) != 1:
                fatal(f"{report_file}: holds {len(loaded.reports)} hosts; give one host's report",
                      EXIT_USAGE)
            report = loaded.reports[0]
        else:
            from auditor.cli.local import open_target
            from auditor.hosts import LocalHost
            from auditor.runner import audit

            checks, loaded_policy = prepare(AuditOptions.of(check=check, skip=skip,
                                                            policy=policy, profile=profile))
            with open_target(root) if root is not None else LocalHost() as host:
                report = audit(host, checks, loaded_policy)
    stamp = fingerprint(report)
    if fmt == "json":
        # What made the statuses beside what they are: the thresholds are not tuning.
        document = {"host": report.host, "fingerprint": stamp,
                    "tool": {"name": "host-auditor", "version": report.version},
                    "policy": dict(report.policy), "inputs": fingerprint_inputs(report)}
        write_output(json.dumps(document, indent=2, ensure_ascii=False) + "\n", output)
    else:
        write_output(stamp + "\n", output)


def _expand(paths: list[str]) -> tuple[Paths, list[str]]:
    """Return the result files the paths name (a directory: its ``*.json`` files), and the
    directories that hold none."""
    from auditor.results import Paths

    files = Paths()
    empty: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                fatal(f"{path}: cannot list the directory ({exc.strerror})", EXIT_USAGE)
            before = len(files)
            for name in names:
                if name.endswith(".json"):
                    files.append(os.path.join(path, name))
            if len(files) == before:
                empty.append(path)
        else:
            files.append(path)
    return files, empty


def merge_command(
    results: Annotated[list[str], typer.Argument(
        help="Per-host JSON reports (audit local --format json), or directories of them.",
        metavar="RESULTS...")],
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", metavar=metavar(MERGE_FORMATS), callback=choice("format", MERGE_FORMATS),
        help="Report format; line: one line per host (default: from the --output file's "
             "extension, else text).")] = None,
    output: OutputOpt = None,
    golden: Annotated[
        str | None,
        typer.Option("--golden", help="Diff every host against this host's results.",
                     metavar="HOST"),
    ] = None,
    fail_on: FailOnOpt = "fail",
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, max=1024, metavar="N",
        help="Processes that read and reduce the files (default: one per CPU).")] = None,
) -> None:
    """Merge per-host JSON results into one fleet report; diff against a golden host."""
    try:
        from auditor.merge import MergeError, merge, text_view
    except ImportError as exc:  # the single-file build carries no compiled code
        if fmt is not None and fmt != "text":
            _merge_in_memory(results, fmt, output, golden, fail_on)
        fatal(f"audit merge needs {exc.name or 'msgspec'}: run it where host-auditor is "
              "installed from its wheel (pip install .)", EXIT_USAGE)
    from auditor.render import render_merged_text

    fmt = infer_format(fmt, output, MERGE_FORMATS)
    with handle_errors():
        check_output_path(output)
    files, empty = _expand(results)
    progress = _progress() if sys.stderr.isatty() and len(files) >= 1000 else None
    try:
        merged = merge(files, fmt, golden=golden, fail_on=FailOn(fail_on), jobs=jobs,
                       progress=progress)
    except MergeError as exc:
        if progress is not None:
            progress(0, 0)
        for bad in exc.unreadable:
            print(f"audit: error: {bad.line()}", file=sys.stderr)
        where = f" ({', '.join(empty)}: no .json files)" if empty and not files else ""
        fatal(f"{exc}{where}", EXIT_USAGE)
    if progress is not None:
        progress(0, 0)
    for bad in merged.unreadable:
        print(f"audit: error: {bad.line()}", file=sys.stderr)
    for line in merged.notes:
        note(f"note: {line}")
    try:
        if fmt == "text":
            write_output(render_merged_text(text_view(merged)), output)
        else:
            write_output_chunks(merged.chunks(), output)
    finally:
        merged.close()
    if merged.unreadable:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(merged.exit_code)


def _merge_in_memory(results: list[str], fmt: str, output: str | None, golden: str | None,
                     fail_on: str) -> None:
    """Merge a few results without msgspec (the single-file build on a node: the engines'
    one-line summary of the node's own report), holding every report in memory."""
    from auditor.fleet import fleet_view
    from auditor.render import render_merge
    from auditor.results import load_results

    files, _ = _expand(results)
    loaded = load_results(files)
    for bad in loaded.unreadable:
        print(f"audit: error: {bad.line()}", file=sys.stderr)
    if not loaded.reports:
        fatal("no readable results to merge", EXIT_USAGE)
    write_output(render_merge(fleet_view(loaded, golden), fmt), output)
    if loaded.unreadable:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(exit_code(loaded.reports, FailOn(fail_on)))


def _progress() -> Callable[[int, int], None]:
    """Return a callback that keeps one progress line on the terminal (stderr)."""
    state = {"shown": -1}

    def show(done: int, total: int) -> None:
        if total == 0:
            if state["shown"] >= 0:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            return
        percent = 100 * done // total
        if percent != state["shown"]:
            state["shown"] = percent
            sys.stderr.write(f"\rmerging: {percent:3d}%")
            sys.stderr.flush()

    return show


def watch_command(
    check: CheckOpt = None,
    skip: SkipOpt = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, metavar="N",
                                 help="Stop after N relevant device events.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.0, help="Stop after S seconds.",
                                   metavar="S")
    ] = None,
    source: Annotated[
        str, typer.Option("--source", metavar=metavar(SOURCES), callback=choice("source", SOURCES),
                          help="udev: events udevd has processed; kernel: the kernel's own; "
                               "auto: udev when udevd answers, else kernel.")
    ] = "auto",
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Re-run the affected checks on PCI and NVIDIA device events; print what changes."""
    from auditor.registry import load_checks, watched
    from auditor.watch import watch

    with handle_errors(debug):
        checks, loaded_policy = prepare(AuditOptions.of(check=check, skip=skip, policy=policy,
                                                        profile=profile, debug=debug))
        chosen = watched(checks)
        if not chosen:
            every = ", ".join(sorted(c.id for c in watched(load_checks())))
            fatal(f"none of the selected checks reacts to device events (watched: {every})",
                  EXIT_USAGE)
        watch(chosen, loaded_policy, count=count, timeout=timeout, source=source, debug=debug)


def snapshot_command(
    target: Annotated[str, typer.Argument(
        help="local, or [USER@]HOST[:PORT] reached over SSH.", metavar="TARGET")],
    output: Annotated[str, typer.Option("--output", "-o", help="Capture file (.tar.gz; - for "
                                        "stdout).", metavar="FILE")],
    check: CheckOpt = None,
    skip: SkipOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    sudo: SudoOpt = False,
    timeout: TimeoutOpt = 10.0,
    accept_new_host_keys: AcceptNewOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    policy: PolicyOpt = None,
) -> None:
    """Capture exactly what the checks read into a sysroot .tar.gz, for audit local --root.

    With --policy, the site's own checks (its local-plugins) are captured for too."""
    from auditor.snapshot import snapshot, write_capture

    with handle_errors():
        check_output_path(output, "capture")
        checks, _ = prepare(AuditOptions.of(check=check, skip=skip, policy=policy))
        reach = None
        if target != "local":
            reach = ssh_options(user, port, identity, sudo, timeout, accept_new_host_keys,
                                known_hosts, ssh_config)
        capture = snapshot(target, checks, reach)
        write_capture(output, capture.data)
    note(capture.summary("stdout" if output == "-" else output))


