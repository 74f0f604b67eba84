"""cpu.governor: the performance governor (and EPP) on every cpufreq policy, now and at boot."""

from __future__ import annotations

import re
from collections.abc import Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from checks.cpu_governor import CPU_DIR, CPUFREQ, policy_path
from remediations.base import (
    Advice,
    Context,
    MakeSymlink,
    Remedy,
    RunCommand,
    SetValue,
    Step,
    WriteFile,
)
from remediations.base import evidence as evidence_of

UNIT_NAME = "host-auditor-cpu-performance.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
WANTS = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
#: Drivers that choose the policy themselves (setpolicy / EPP): the
#: ``cpufreq.default_governor`` parameter does not reach them, a unit does.
SETPOLICY_DRIVERS = ("intel_pstate", "amd-pstate-epp")
#: Daemons known to set governors or EPP behind an operator's back.
REVERTING_DAEMONS = ("tuned", "power-profiles-daemon", "thermald", "auto-cpufreq", "tlp",
                     "cpupower", "ondemand")

READS: tuple[str, ...] = (
    f"{CPUFREQ}/policy*/scaling_governor",
    f"{CPUFREQ}/policy*/energy_performance_preference",
    f"{CPU_DIR}/cpu[0-9]*/cpufreq/scaling_governor",
    f"{CPU_DIR}/cpu[0-9]*/cpufreq/energy_performance_preference",
    "/proc/cpuinfo",
)

#: Policy names as the check reports them: ``policyN``, or ``cpuN`` without policies.
_POLICY = re.compile(r"(?:policy|cpu)[0-9]+")

# systemd expands $VAR in ExecStart: $$ is a literal dollar for the shell.
UNIT_TEXT = f"""\
# Written by host-auditor: the performance governor and EPP on every cpufreq policy.
[Unit]
Description=CPU frequency governor performance (host-auditor)
After=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for f in {CPU_DIR}/cpu[0-9]*/cpufreq/energy_performance_preference; \
do [ -w "$$f" ] && echo performance > "$$f"; done; \
for f in {CPU_DIR}/cpu[0-9]*/cpufreq/scaling_governor; do echo performance > "$$f"; done; true'

[Install]
WantedBy=multi-user.target
"""


_BOOST_FILES = {
    "/sys/devices/system/cpu/cpufreq/boost": "1",
    "/sys/devices/system/cpu/intel_pstate/no_turbo": "0",
}


def _other(host: Host, finding: Finding, ev: dict[str, str]) -> Remedy | None:
    """Return the remedy for a boost, max-frequency cap or daemon finding, or None."""
    if finding.subject == "boost" and ev.get("source") in _BOOST_FILES:
        source = ev["source"]
        return Remedy(
            check="cpu.governor", subject="boost", title="turn boost on",
            runtime=(SetValue(source, _BOOST_FILES[source]),) if host.exists(source) else (),
            notes=("boost can also be off in the firmware setup: check it there too",),
        )
    if finding.subject.startswith("max-freq:"):
        hw_max = ev.get("cpuinfo_max_freq", "")
        if not hw_max.isdigit():
            return None
        steps: list[Step] = []
        for policy in ev.get("policies", "").split():
            path = f"{policy_path(policy)}/scaling_max_freq"
            if _POLICY.fullmatch(policy) and host.exists(path):
                steps.append(SetValue(path, hw_max))
        return Remedy(
            check="cpu.governor", subject=finding.subject,
            title=f"lift the scaling_max_freq cap to {hw_max} kHz", runtime=tuple(steps),
            notes=("whatever set the cap (a daemon, a power profile) sets it again at boot",),
        )
    if "daemon" in ev:
        return Remedy(
            check="cpu.governor", subject=finding.subject,
            title=f"{ev['daemon']} manages the governor",
            advice=(Advice(f"make {ev['daemon']} choose performance, or stop it: "
                           f"{finding.fix}"),),
        )
    return None


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Write performance to each policy's governor (EPP first), and persist it."""
    remedies: list[Remedy] = []
    params: list[str] = []
    need_unit = False
    for finding in findings:
        ev = evidence_of(finding)
        if "governor" not in ev:
            extra = _other(host, finding, ev)
            if extra is not None:
                remedies.append(extra)
            continue
        driver = ev.get("driver", "")
        available = ev.get("available_governors", "").split()
        notes: list[str] = []
        steps: list[Step] = []
        if available and "performance" not in available:
            notes.append(f"driver {driver} offers no performance governor "
                         f"({' '.join(available)}): nothing to set")
        else:
            epp_steps: list[Step] = []
            gov_steps: list[Step] = []
            for policy in ev.get("policies", "").split():
                if not _POLICY.fullmatch(policy):
                    continue
                epp = f"{policy_path(policy)}/energy_performance_preference"
                if ev.get("epp") and host.exists(epp):
                    epp_steps.append(SetValue(epp, "performance"))
                governor = f"{policy_path(policy)}/scaling_governor"
                if host.exists(governor):
                    gov_steps.append(SetValue(governor, "performance"))
            # EPP first: EPP drivers refuse a non-performance EPP under the performance
            # governor, so the rollback (reverse order) restores the governor before EPP.
            steps = epp_steps + gov_steps
            if driver in SETPOLICY_DRIVERS:
                need_unit = True
                if driver == "amd-pstate-epp":
                    params.append("amd_pstate=active")
            else:
                params.append("cpufreq.default_governor=performance")
                if driver == "acpi-cpufreq" and "AuthenticAMD" in (
                    host.read_optional("/proc/cpuinfo") or ""
                ):
                    notes.append("on kernels >= 6.3, amd_pstate=active switches this AMD CPU to "
                                 "the amd-pstate-epp driver; not added here")
        remedies.append(Remedy(
            check="cpu.governor",
            subject=finding.subject,
            title=f"performance governor on CPUs {finding.subject} ({driver})",
            runtime=tuple(steps),
            notes=tuple(notes),
        ))
    if not params and not need_unit:
        return remedies
    running = host.processes()
    daemons = sorted(d for d in REVERTING_DAEMONS if running is not None and d in running)
    warning = ("daemons that set governors can revert this: "
               + ("running now: " + ", ".join(daemons) if daemons else
                  "check " + ", ".join(REVERTING_DAEMONS[:5]) + " and Ubuntu's ondemand.service"))
    persistent: list[Step] = []
    if need_unit:
        persistent += [
            WriteFile(UNIT, UNIT_TEXT),
            MakeSymlink(WANTS, UNIT),
            RunCommand(("systemctl", "daemon-reload"), after=(0,),
                       undo=("systemctl", "daemon-reload"), optional=True),
        ]
    how = [f"{' '.join(dict.fromkeys(params))} on the boot command line"] if params else []
    if need_unit:
        how.append(f"the {UNIT_NAME} unit")
    remedies.append(Remedy(
        check="cpu.governor",
        subject="boot",
        title="keep the performance governor across reboots",
        persistent=tuple(persistent),
        boot_params=tuple(dict.fromkeys(params)),
        notes=(f"persisted by {' and '.join(how)}", warning),
    ))
    return remedies
