"""Judge what the probe program measured: findings, like any check's.

The program (:mod:`auditor.shipped.probe_agent`) only measures; what follows turns its answer
into findings of ``probe.h2d``, ``probe.d2h``, ``probe.p2p``, ``probe.wakeup`` and
``probe.numa``, so a probe's verdict travels through every format (JSON, Prometheus,
line, NFD, HTML) as a check's does. Every figure a verdict rests on is kept in the
finding's evidence under ``measured.<name>``: Prometheus exports those as gauges, and
``--prove`` compares them before and after a fix.

Everything in the answer came from the host: numbers are read with bounds, text is cut
short, and a field that is missing or of the wrong type makes the probe an error, never
a pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.model import Finding, Severity, Status
from auditor.probes.limits import FAIL_BELOW, WARN_BELOW, Link, expected_link, verdict

#: The probes ``audit probe`` knows, in the order they run.
PROBES = ("h2d", "d2h", "p2p", "wakeup", "numa")
#: A GPU this much below the best of its model on the host warns (a slot, a riser, a
#: switch uplink shared with another GPU).
PEER_SHORTFALL = 0.10
#: Checks whose findings a broken peer-to-peer path corroborates.
P2P_CHECKS = ("pcie.acs", "iommu.mode")
MEASURED = "measured."


@dataclass(frozen=True)
class Thresholds:
    """Where a measured share of the physical limit warns and fails."""

    warn_below: float = WARN_BELOW
    fail_below: float = FAIL_BELOW
    #: Wake-up p99 (us) that passes at least; the deepest enabled C-state's exit latency
    #: times 1.5 raises it (a host configured for deep states is judged by what it chose).
    wakeup_pass_us: float = 25.0
    wakeup_fail_us: float = 100.0


def check_id(probe: str) -> str:
    return f"probe.{probe}"


def _text(value: Any, limit: int = 200) -> str:
    return " ".join(str(value).split())[:limit] if value is not None else ""


def _map(value: Any) -> Mapping[str, Any]:
    """Return ``value`` where it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any, low: float = 0.0, high: float = 1e9) -> float | None:
    """Return a finite number within [low, high] from the answer, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        return None
    return number


def _measured(**values: float | None) -> tuple[tuple[str, str], ...]:
    return tuple((MEASURED + name, f"{value:.10g}") for name, value in values.items()
                 if value is not None)


def _finding(probe: str, status: Status, subject: str, message: str, *, observed: str = "",
             expected: str = "", evidence: Iterable[tuple[str, str]] = (), aspect: str = "",
             severity: Severity = Severity.MEDIUM) -> Finding:
    return Finding(check=check_id(probe), status=status, severity=severity, subject=subject,
                   message=message, observed=observed, expected=expected,
                   evidence=tuple(evidence), aspect=aspect)


def not_run(probe: str, answer: Mapping[str, Any], subject: str = "host") -> Finding:
    """Return the finding of a probe that did not measure: skipped, timed out or failed."""
    status_text = answer.get("status")
    reason = _text(answer.get("reason"), 400) or "no reason given"
    if status_text == "skip":
        return _finding(probe, Status.SKIP, subject, f"skipped: {reason}",
                        severity=Severity.INFO)
    if status_text == "timeout":
        return _finding(probe, Status.ERROR, subject, f"the probe did not finish: {reason}")
    return _finding(probe, Status.ERROR, subject, f"the probe failed: {reason}")


# -- h2d / d2h --------------------------------------------------------------------------


def _links(link_info: Mapping[str, Any]) -> tuple[Link | None, Link | None, Link | None]:
    """Return the GPU's maximum link, the port's above it, and the link now: from sysfs,
    else from NVML (a container or sandbox may show no PCI sysfs; NVML's maximum is
    already the lower of the GPU's and its slot's)."""
    gpu_max = Link.parse(link_info.get("max_speed"), link_info.get("max_width"))
    port_max = Link.parse(link_info.get("port_max_speed"), link_info.get("port_max_width"))
    current = Link.parse(link_info.get("current_speed"), link_info.get("current_width"))
    nvml = _map(link_info.get("nvml"))
    if gpu_max is None and nvml:
        gpu_max = Link.of_generation(nvml.get("max_gen"), nvml.get("max_width"))
    if current is None and nvml:
        current = Link.of_generation(nvml.get("current_gen"), nvml.get("current_width"))
    return gpu_max, port_max, current


def _link_during(during_info: Mapping[str, Any]) -> Link | None:
    during = Link.parse(during_info.get("speed"), during_info.get("width"))
    if during is None:
        nvml = _map(during_info.get("nvml"))
        during = Link.of_generation(nvml.get("current_gen"), nvml.get("current_width"))
    return during


def judge_copy(data: Mapping[str, Any], directions: Sequence[str],
               thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """Judge pinned copies per GPU and direction against the link's payload limit."""
    findings: list[Finding] = []
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return [_finding(d, Status.ERROR, "host", "the probe answered without GPUs")
                for d in directions]
    best: dict[tuple[str, str], float] = {}
    measured: list[tuple[str, str, str, float]] = []
    for item in gpus[:64]:
        if not isinstance(item, Mapping):
            continue
        gpu = _map(item.get("gpu"))
        bdf = _text(gpu.get("bdf"), 32) or "gpu"
        name = _text(gpu.get("name"), 80)
        link_info = _map(item.get("link"))
        for direction in directions:
            if item.get("refused"):
                findings.append(_finding(
                    direction, Status.SKIP, bdf,
                    f"skipped: the GPU is busy ({_text(item['refused'])}); --force measures "
                    "it anyway, under contention", severity=Severity.INFO))
                continue
            if item.get("error"):
                findings.append(_finding(direction, Status.ERROR, bdf,
                                         f"the probe failed: {_text(item['error'], 300)}"))
                continue
            result = item.get(direction)
            gbps = _number(result.get("gbps"), 0.0, 10000.0) if isinstance(
                result, Mapping) else None
            if gbps is None or not isinstance(result, Mapping):
                findings.append(_finding(direction, Status.ERROR, bdf,
                                         "the probe answered without a figure"))
                continue
            findings.append(_judge_direction(direction, bdf, name, gbps, result, link_info,
                                             item, thresholds))
            measured.append((direction, bdf, name, gbps))
            key = (direction, name)
            best[key] = max(best.get(key, 0.0), gbps)
    return _peer_rule(findings, measured, best)


def _judge_direction(direction: str, bdf: str, name: str, gbps: float,
                     result: Mapping[str, Any], link_info: Mapping[str, Any],
                     item: Mapping[str, Any], thresholds: Thresholds) -> Finding:
    gpu_max, port_max, idle = _links(link_info)
    during_info = _map(result.get("link_during"))
    during = _link_during(during_info)
    limit_link = expected_link(gpu_max, port_max)
    notes: list[str] = []
    if (limit_link is not None and gpu_max is not None and limit_link != gpu_max
            and gbps > limit_link.payload_gbps * 1.02):
        # Faster than the port above can carry: that port is not the physical link (a
        # virtual bridge of a VM advertises what it likes).
        notes.append(f"the port above advertises {limit_link.label}, less than was "
                     "measured: judged against the GPU's own maximum")
        limit_link = gpu_max
    direction_name = "host-to-device" if direction == "h2d" else "device-to-host"
    evidence: list[tuple[str, str]] = [("gpu", name), ("direction", direction_name)]
    if during is not None:
        evidence.append(("link_during", f"{during.label} ({during.spelled})"))
    if idle is not None:
        evidence.append(("link_idle", f"{idle.label} ({idle.spelled})"))
    if gpu_max is not None:
        evidence.append(("link_max", gpu_max.label))
    if port_max is not None:
        evidence.append(("port", _text(link_info.get("port"), 32)))
        evidence.append(("port_max", port_max.label))
    size = _number(result.get("bytes"), 1, 1 << 40)
    copies = _number(result.get("copies"), 1, 1e6)
    if size is not None and copies is not None:
        evidence.append(("method", f"{copies:.0f} pinned copies of {size / (1 << 20):g} MiB, "
                                   "median of 3"))
    used = _number(item.get("gpu_mem_used_bytes"), 0, 1 << 50)
    left = _number(item.get("gpu_mem_left_bytes"), 0, 1 << 50)
    observed = f"{gbps:.1f} GB/s"
    if limit_link is None:
        return _finding(
            direction, Status.SKIP, bdf,
            f"{direction_name} {gbps:.1f} GB/s measured; not judged: sysfs gives no maximum "
            "link speed and width for the GPU", observed=observed,
            evidence=evidence + list(_measured(gbps=gbps, gpu_mem_used_bytes=used,
                                               gpu_mem_left_bytes=left)),
            severity=Severity.INFO)
    limit = limit_link.payload_gbps
    fraction = gbps / limit
    status = verdict(fraction, thresholds.warn_below, thresholds.fail_below)
    evidence += [("limit", f"{limit_link.label} payload {limit:.1f} GB/s "
                           f"({limit_link.encoding})")]
    evidence += list(_measured(gbps=gbps, limit_gbps=limit, fraction=fraction,
                               gpu_mem_used_bytes=used, gpu_mem_left_bytes=left))
    message = (f"{direction_name} {gbps:.1f} GB/s, {fraction:.0%} of the {limit_link.label} "
               f"payload limit ({limit:.1f} GB/s)")
    if during is not None:
        message += f"; link during the copy {during.label}"
        if during < limit_link and status is not Status.PASS:
            message += f" (trained below {limit_link.label} under load)"
    if status is Status.FAIL:
        message += "; a link at half width, a generation down, or staged copies measure so"
    message += "".join(f"; {note}" for note in notes)
    expected = (f">= {thresholds.warn_below * limit:.1f} GB/s "
                f"({thresholds.warn_below:.0%} of {limit:.1f})")
    return _finding(direction, status, bdf, message, observed=f"{observed} ({fraction:.0%})",
                    expected=expected, evidence=evidence, severity=Severity.HIGH)


def _peer_rule(findings: list[Finding], measured: list[tuple[str, str, str, float]],
               best: Mapping[tuple[str, str], float]) -> list[Finding]:
    """Warn for a GPU well below the best GPU of its model on the host (same direction)."""
    by_key = {(f.check, f.subject): index for index, f in enumerate(findings)}
    for direction, bdf, name, gbps in measured:
        top = best[(direction, name)]
        if top <= 0 or gbps >= top * (1 - PEER_SHORTFALL):
            continue
        index = by_key[(check_id(direction), bdf)]
        finding = findings[index]
        if finding.status in (Status.PASS, Status.WARN, Status.SKIP):
            status = Status.WARN if finding.status is Status.PASS else finding.status
            findings[index] = Finding(
                **{**finding.__dict__, "status": status,
                   "message": finding.message + f"; {1 - gbps / top:.0%} below the best "
                                                f"{name} of this host ({top:.1f} GB/s)"})
    return findings


# -- p2p --------------------------------------------------------------------------------


def judge_p2p(data: Mapping[str, Any], related: Sequence[Finding] = (),
              thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """Judge each ordered GPU pair: the broken-path signature fails and names the ACS/IOMMU
    findings it corroborates."""
    pairs = data.get("pairs")
    if not isinstance(pairs, list) or not pairs:
        return [_finding("p2p", Status.ERROR, "host", "the probe answered without GPU pairs")]
    links = _map(data.get("links"))
    suspects = [f for f in related if f.check in P2P_CHECKS and f.status in (
        Status.WARN, Status.FAIL)]
    findings: list[Finding] = []
    for pair in pairs[:64]:
        if not isinstance(pair, Mapping):
            continue
        src, dst = _text(pair.get("src"), 32), _text(pair.get("dst"), 32)
        subject = f"{src}->{dst}"
        off = _map(pair.get("off"))
        on = _map(pair.get("on"))
        off_gbps = _number(off.get("gbps"), 0, 1e5)
        on_gbps = _number(on.get("gbps"), 0, 1e5)
        on_latency = _number(on.get("latency_us"), 0, 1e7)
        off_latency = _number(off.get("latency_us"), 0, 1e7)
        evidence = list(_measured(on_gbps=on_gbps, off_gbps=off_gbps,
                                  on_latency_us=on_latency, off_latency_us=off_latency))
        if not pair.get("can_access"):
            findings.append(_finding(
                "p2p", Status.WARN, subject,
                "the driver says these GPUs cannot reach each other directly "
                "(cuDeviceCanAccessPeer = 0); copies go through host memory"
                + (f" at {off_gbps:.1f} GB/s" if off_gbps is not None else ""),
                evidence=evidence, severity=Severity.MEDIUM))
            continue
        if on_gbps is None or off_gbps is None:
            findings.append(_finding("p2p", Status.ERROR, subject,
                                     "the probe answered without both figures"))
            continue
        limits = [_pcie_limit(links.get(bdf)) for bdf in (src, dst)]
        known = [limit for limit in limits if limit is not None]
        limit = min(known) if known else None
        problems: list[tuple[Status, str]] = []
        if on_gbps < off_gbps:
            problems.append((Status.FAIL, f"peer access on is slower ({on_gbps:.1f} GB/s) than "
                                          f"off ({off_gbps:.1f} GB/s): the path is redirected "
                                          "through the root complex"))
        if on_latency is not None and on_latency > 10:
            problems.append((Status.FAIL, f"a 16-byte copy takes {on_latency:.1f} us with peer "
                                          "access on (direct paths take under 5 us): staged "
                                          "or redirected"))
        elif on_latency is not None and on_latency > 5:
            problems.append((Status.WARN, f"a 16-byte copy takes {on_latency:.1f} us with peer "
                                          "access on"))
        if limit is not None and on_gbps <= limit * 1.02:
            # Faster than PCIe: NVLink or xGMI, judged by nothing here.
            fraction = on_gbps / limit
            status = verdict(fraction, thresholds.warn_below, thresholds.fail_below)
            evidence += list(_measured(limit_gbps=limit, fraction=fraction))
            if status is not Status.PASS:
                problems.append((status, f"{fraction:.0%} of the PCIe payload limit "
                                         f"({limit:.1f} GB/s)"))
        observed = (f"on {on_gbps:.1f} GB/s" + (f", {on_latency:.2f} us" if on_latency
                                                is not None else "")
                    + f"; off {off_gbps:.1f} GB/s")
        if not problems:
            findings.append(_finding("p2p", Status.PASS, subject,
                                     f"peer-to-peer {observed}", observed=observed,
                                     evidence=evidence))
            continue
        status = max((s for s, _ in problems), key=lambda s: s.order)
        message = "; ".join(text for _, text in problems)
        if status is Status.FAIL:
            named = _corroborated(suspects, (src, dst))
            message += ("; corroborates " + ", ".join(named) if named else
                        "; look at the ACS and IOMMU settings of the ports between them "
                        f"(audit local --check {' --check '.join(P2P_CHECKS)})")
        findings.append(_finding("p2p", status, subject, message, observed=observed,
                                 expected="peer access on faster than off, latency < 5 us",
                                 evidence=evidence, severity=Severity.HIGH))
    return findings


def _pcie_limit(info: Any) -> float | None:
    if not isinstance(info, Mapping):
        return None
    gpu_max, port_max, _ = _links(info)
    link = expected_link(gpu_max, port_max)
    return link.payload_gbps if link is not None else None


def _corroborated(suspects: Sequence[Finding], devices: Sequence[str]) -> list[str]:
    """Return the ACS/IOMMU findings a broken path between ``devices`` corroborates: those
    about the devices or their ports, else (no subject matches) every one of them."""
    close = [f for f in suspects if any(f.subject.startswith(d[:7]) for d in devices)]
    chosen = close or list(suspects)
    return [f"{f.check} {f.status.value} on {f.label}" for f in chosen[:6]]


# -- wakeup -----------------------------------------------------------------------------


def judge_wakeup(data: Mapping[str, Any], thresholds: Thresholds = Thresholds()) -> list[
        Finding]:
    """Judge timer wake-up overshoot p99 per CPU group; a VM guest's is reported only."""
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups:
        return [_finding("wakeup", Status.ERROR, "host", "the probe measured no CPU")]
    guest = data.get("hypervisor") is True
    findings: list[Finding] = []
    for group in groups[:1024]:
        if not isinstance(group, Mapping):
            continue
        node = _number(group.get("node"), 0, 1 << 16)
        cpu = _number(group.get("cpu"), 0, 1 << 17)
        as_is = _map(group.get("as_is"))
        p50 = _number(as_is.get("p50_us"), -1e6, 1e9)
        p99 = _number(as_is.get("p99_us"), -1e6, 1e9)
        worst = _number(as_is.get("max_us"), -1e6, 1e9)
        subject = f"node{node:.0f} cpu{cpu:.0f}" if node is not None and cpu is not None \
            else "cpu"
        if p50 is None or p99 is None:
            findings.append(_finding("wakeup", Status.ERROR, subject,
                                     "the probe answered without percentiles"))
            continue
        cstate = _map(group.get("cstate"))
        exit_us = _number(cstate.get("latency_us"), 0, 1e7)
        pass_us = max(thresholds.wakeup_pass_us, 1.5 * exit_us if exit_us else 0.0)
        qos = _map(group.get("qos"))
        qos_p99 = _number(qos.get("p99_us"), -1e6, 1e9)
        evidence = [("policy", _text(group.get("policy"), 16)),
                    ("cpuidle_driver", _text(data.get("cpuidle_driver"), 32))]
        if cstate:
            evidence.append(("deepest_cstate", f"{_text(cstate.get('state'), 32)} "
                                               f"({exit_us or 0:g} us exit)"))
        if qos.get("skipped"):
            evidence.append(("pm_qos", _text(qos.get("skipped"))))
        evidence += list(_measured(p50_us=p50, p99_us=p99, max_us=worst, qos_p99_us=qos_p99))
        observed = f"p50 {p50:.1f} us, p99 {p99:.1f} us" + (
            f", max {worst:.0f} us" if worst is not None else "")
        message = f"timer wake-up overshoot {observed}"
        if qos_p99 is not None:
            message += f"; with /dev/cpu_dma_latency held at 0: p99 {qos_p99:.1f} us"
        if data.get("timer_slack_1ns") is not True:
            message += " (timer slack could not be lowered: about 50 us of it is slack)"
        if guest:
            findings.append(_finding(
                "wakeup", Status.PASS, subject,
                message + "; not judged: a VM guest, whose idle states the hypervisor owns",
                observed=observed, evidence=evidence, severity=Severity.INFO))
            continue
        if p99 > thresholds.wakeup_fail_us:
            status = Status.FAIL
        elif p99 > pass_us:
            status = Status.WARN
        else:
            status = Status.PASS
        if status is not Status.PASS:
            message += "; deep C-states or a slow governor cost this on every wake (cpu.cstates, " \
                       "cpu.governor)"
        findings.append(_finding("wakeup", status, subject, message, observed=observed,
                                 expected=f"p99 <= {pass_us:.0f} us", evidence=evidence,
                                 severity=Severity.MEDIUM))
    return findings


# -- numa -------------------------------------------------------------------------------


def judge_numa(data: Mapping[str, Any]) -> list[Finding]:
    """Report local and remote memory bandwidth per GPU node; warn where remote is faster
    (the node sysfs gives the GPU is then not where it sits)."""
    results = data.get("results")
    if not isinstance(results, list) or not results:
        return [_finding("numa", Status.ERROR, "host", "the probe measured no node")]
    findings: list[Finding] = []
    for item in results[:64]:
        if not isinstance(item, Mapping):
            continue
        node = _number(item.get("node"), 0, 1 << 16)
        remote = _number(item.get("remote_node"), 0, 1 << 16)
        local_gbps = _number(item.get("local_gbps"), 0, 1e5)
        remote_gbps = _number(item.get("remote_gbps"), 0, 1e5)
        subject = f"node{node:.0f}" if node is not None else "node"
        if local_gbps is None or remote_gbps is None or remote is None or local_gbps <= 0:
            findings.append(_finding("numa", Status.ERROR, subject,
                                     "the probe answered without both figures"))
            continue
        ratio = remote_gbps / local_gbps
        gpus = _list(item.get("gpus"))
        evidence = [("gpus", ", ".join(_text(g, 32) for g in gpus[:16]))]
        evidence += list(_measured(local_gbps=local_gbps, remote_gbps=remote_gbps,
                                   remote_ratio=ratio))
        observed = (f"local {local_gbps:.1f} GB/s, node{remote:.0f} {remote_gbps:.1f} GB/s "
                    f"({ratio:.0%})")
        if ratio > 1.05:
            findings.append(_finding(
                "numa", Status.WARN, subject,
                f"memory of node{remote:.0f} is faster from these CPUs than their own "
                f"({observed}): the node the kernel gives the GPUs is not where they sit",
                observed=observed, expected="local faster than remote", evidence=evidence))
        else:
            findings.append(_finding("numa", Status.PASS, subject,
                                     f"one thread's copy bandwidth {observed}",
                                     observed=observed, evidence=evidence,
                                     severity=Severity.INFO))
    return findings


def measurements(finding: Finding) -> dict[str, float]:
    """Return the figures a finding rests on (its ``measured.*`` evidence)."""
    values: dict[str, float] = {}
    for key, value in finding.evidence:
        if key.startswith(MEASURED):
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                values[key[len(MEASURED):]] = number
    return values
