"""``audit probe``: measure what the files only promise, and judge it against physics.

The probes (h2d, d2h, p2p, wakeup, numa) run by :mod:`auditor.probes.run`, here or over
SSH on a host that has the driver; each says on stderr when it starts and how it ended,
and the report is a report like an audit's, in every format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from auditor.cli.options import (
    AcceptNewOpt,
    AuditOptions,
    DebugOpt,
    FailOnOpt,
    FormatOpt,
    IdentityOpt,
    KnownHostsOpt,
    OutputOpt,
    PortOpt,
    SshConfigOpt,
    UserOpt,
    emit,
    handle_errors,
    note,
    ssh_options,
)
from auditor.errors import UsageError

if TYPE_CHECKING:
    from auditor.hosts.base import Host
    from auditor.model import Finding, Report
    from auditor.probes.run import ProbeRequest

ProbeOpt = Annotated[
    str | None,
    typer.Option("--probe", metavar="NAMES",
                 help="Probes to run, comma-separated: h2d, d2h, p2p, wakeup, numa "
                      "(default: all)."),
]
ProbeTimeoutOpt = Annotated[
    float, typer.Option("--probe-timeout", min=1.0, max=3600.0, metavar="SECONDS",
                        help="Deadline of each probe: past it the probe is stopped and "
                             "reported as not finished.")
]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Measure GPUs that are busy (compute processes or utilisation above "
                    "5%) instead of skipping them; the figures then include the contention.")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", metavar="LIST", help="Only these CUDA/HIP device ordinals (0,1,...).")]
WakeupsOpt = Annotated[int, typer.Option(
    "--wakeups", min=10, max=100000, metavar="N",
    help="Timer wake-ups measured per CPU group (200 us apart).")]
WarnBelowOpt = Annotated[float, typer.Option(
    "--warn-below", min=0.0, max=1.0, metavar="SHARE",
    help="A bandwidth below this share of the link's payload limit warns.")]
FailBelowOpt = Annotated[float, typer.Option(
    "--fail-below", min=0.0, max=1.0, metavar="SHARE",
    help="A bandwidth below this share of the link's payload limit fails.")]


ProveOpt = Annotated[bool, typer.Option(
    "--prove", help="With --apply: run the probes before and after the fix, and report both "
                    "figures and their change (a fix that made one worse says so).")]
ProveProbeOpt = Annotated[str | None, typer.Option(
    "--probe", metavar="NAMES", help="The probes --prove runs (default: all; see audit "
                                     "probe).")]


def prove_request(prove: bool, probe: str | None, apply: bool,
                  root: str | None) -> ProbeRequest | None:
    """Return the probes ``--prove`` runs (None without it), or raise a usage error."""
    if not prove:
        if probe is not None:
            raise UsageError("--probe goes with --prove")
        return None
    if not apply:
        raise UsageError("--prove measures before and after a fix: it needs --apply")
    if root is not None:
        raise UsageError("--prove measures a running machine, not a sysroot (--root)")
    return make_request(probe, 60.0, False, None, 3000, 0.80, 0.50)


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """Return the GPU ordinals of ``--gpus`` (none: every GPU), or raise a usage error."""
    if not text:
        return ()
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--gpus {text!r}: a comma-separated list of device ordinals "
                         "(0,1,...)") from None
    if not values or any(v < 0 or v > 1023 for v in values):
        raise UsageError(f"--gpus {text!r}: ordinals from 0 to 1023")
    return values


def make_request(probe: str | None, probe_timeout: float, force: bool, gpus: str | None,
                 wakeups: int, warn_below: float, fail_below: float) -> ProbeRequest:
    """Return the probes the command line asked for, or raise a usage error."""
    from auditor.probes.judge import Thresholds
    from auditor.probes.run import ProbeRequest, parse_probes

    if fail_below > warn_below:
        raise UsageError(f"--fail-below {fail_below:g} is above --warn-below {warn_below:g}")
    return ProbeRequest(probes=parse_probes(probe), timeout=probe_timeout, force=force,
                        gpus=parse_gpus(gpus), wakeups=wakeups,
                        thresholds=Thresholds(warn_below=warn_below, fail_below=fail_below))


def related_findings(host: Host, request: ProbeRequest) -> list[Finding]:
    """Return the ACS and IOMMU findings of ``host`` that a broken p2p path would corroborate
    (none unless p2p runs)."""
    from auditor.policy import load_policy
    from auditor.probes.judge import P2P_CHECKS
    from auditor.registry import load_checks, select
    from auditor.runner import audit

    if "p2p" not in request.probes:
        return []
    every = load_checks()
    checks = select(every, P2P_CHECKS, ())
    if not checks:
        return []
    report = audit(host, checks, load_policy(every, None, None))
    return list(report.findings)


def probe_local(request: ProbeRequest) -> Report:
    """Run the probes on this machine, progress on stderr."""
    from auditor.hosts import LocalHost
    from auditor.probes.run import LocalRunner, run_probes

    def related() -> list[Finding]:
        with LocalHost() as host:
            return related_findings(host, request)

    return run_probes(LocalRunner(), request, target="local", say=note, related=related)


def probe_command(
    target: Annotated[str | None, typer.Argument(
        metavar="[TARGET]", help="local (the default), or [USER@]HOST[:PORT] over SSH.")] = None,
    probe: ProbeOpt = None,
    probe_timeout: ProbeTimeoutOpt = 60.0,
    force: ForceOpt = False,
    gpus: GpusOpt = None,
    wakeups: WakeupsOpt = 3000,
    warn_below: WarnBelowOpt = 0.80,
    fail_below: FailBelowOpt = 0.50,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
    fail_on: FailOnOpt = "fail",
    debug: DebugOpt = False,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
) -> None:
    """Measure host-to-device bandwidth, peer-to-peer paths, CPU wake-up latency and NUMA
    memory bandwidth, judged against their physical limits."""
    options = AuditOptions.of(fmt, output, None, None, fail_on, None, None, debug)
    with handle_errors(debug):
        request = make_request(probe, probe_timeout, force, gpus, wakeups, warn_below,
                               fail_below)
        if target in (None, "local"):
            report = probe_local(request)
        else:
            report = _probe_remote(target, request, ssh_options(
                user, port, identity, False, 30.0, accept_new_host_keys, known_hosts,
                ssh_config))
    raise typer.Exit(emit([report], options))


def _probe_remote(text: str, request: ProbeRequest, reach: object) -> Report:
    from auditor.hosts.ssh import SshHost, SshOptions, parse_target
    from auditor.probes.judge import P2P_CHECKS
    from auditor.probes.run import SshRunner, run_probes
    from auditor.registry import collected_paths, load_checks, select

    assert isinstance(reach, SshOptions)
    target = parse_target(text)
    with SshHost(target, reach) as host:
        host.connect()
        host.stop_clock()  # each probe has its own deadline

        def related() -> list[Finding]:
            # What the ACS/IOMMU checks read, collected on the connection the probes use.
            checks = select(load_checks(), P2P_CHECKS, ())
            host.collect(collected_paths(checks), keep_open=True)
            host.stop_clock()
            return related_findings(host, request)

        return run_probes(SshRunner(host), request, target=host.target, say=note,
                          related=related)
