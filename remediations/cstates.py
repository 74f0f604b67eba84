"""cpu.cstates: disable idle states deeper than the exit-latency limit, now and at boot."""

from __future__ import annotations

import re
from collections.abc import Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from auditor.parsing import parse_cpulist
from remediations.base import Context, Remedy, SetValue, Step, evidence

READS: tuple[str, ...] = ("/sys/devices/system/cpu/cpu*/cpuidle/state*/disable",)

_STATE = re.compile(r"state[0-9]+")
#: Boot parameters that cap the idle driver at C1, by cpuidle driver.
BOOT_PARAMS = {
    "intel_idle": ("intel_idle.max_cstate=1", "processor.max_cstate=1"),
    "acpi_idle": ("processor.max_cstate=1",),
}


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Write 1 to each too-deep state's ``disable`` file and cap the idle driver at boot."""
    remedies: list[Remedy] = []
    for finding in findings:
        ev = evidence(finding)
        state = ev.get("state", "")
        if not _STATE.fullmatch(state):
            continue
        try:
            cpus = parse_cpulist(ev.get("cpus", ""))
        except ValueError:
            continue
        steps: list[Step] = []
        for cpu in cpus:
            path = f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}/disable"
            if host.exists(path):
                steps.append(SetValue(path, "1"))
        driver = ev.get("driver", "")
        params = BOOT_PARAMS.get(driver, ())
        notes: tuple[str, ...] = ()
        if not params:
            notes = (f"cpuidle driver {driver or 'unknown'!s} has no boot parameter that caps "
                     "C-states: the runtime change lasts until the next boot",)
        else:
            notes = ("max_cstate=1 keeps only C1 at boot, which may be stricter than the "
                     f"{ev.get('limit_us', '?')} us limit",)
        remedies.append(Remedy(
            check="cpu.cstates",
            subject=finding.subject,
            title=f"disable {finding.subject} ({state}) on CPUs {ev.get('cpus', '')}",
            runtime=tuple(steps),
            boot_params=params,
            notes=notes,
        ))
    return remedies
