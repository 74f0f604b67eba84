"""pcie.aspm: link power management on the path of GPUs and NICs.

ASPM L0s and L1 put an idle link to sleep; waking it costs microseconds on the first DMA
after every idle gap between decode steps, and on RTX PRO 6000 rigs L1 and port runtime
suspend lead to "Surprise Link Down" and lockups. A root or switch port that runtime-
suspends above a GPU is a risk twice over: the link drops, and on resume the kernel
restores the port's config state and turns ACS redirect back on (``pcie.acs``).

Read from sysfs, no root needed: the ASPM policy (``/sys/module/pcie_aspm/parameters/
policy``), each link's ``link/*_aspm`` attributes (drivers/pci/pcie/aspm.c: on the device
at the lower end of a link, present only for states the link supports) and each port's
runtime PM (``power/control``, ``runtime_suspended_time``). With ``pcie_aspm=off`` the
kernel leaves firmware's setting alone and shows no link attributes: then the ASPM
Control bits of Link Control are read from config space (root).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor import environment
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import pci, pciconfig
from auditor.checks.lib.gpupath import CMDLINE, cmdline_tokens, params, short_list
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import parse_selector

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

POLICY = "/sys/module/pcie_aspm/parameters/policy"
UDEV_RULE = "/etc/udev/rules.d/99-host-auditor-pcie-port-pm.rules"
POLICY_PARAM = "pcie_aspm.policy=performance"
#: Disabled in this order (substates before L1) so that the rollback, which restores in
#: reverse, turns L1 on before its substates.
ASPM_STATES = ("l1_2_aspm", "l1_1_aspm", "l1_aspm", "l0s_aspm")
LINK_CONTROL = "CAP_EXP+10.w"
_STATE_NAMES = {"l0s_aspm": "L0s", "l1_aspm": "L1", "l1_1_aspm": "L1.1", "l1_2_aspm": "L1.2"}
_POWERSAVING = ("powersave", "powersupersave")


def read_policy(host: Host) -> str:
    """Return the active ASPM policy (the selected word of the selector file), or ""."""
    selector = parse_selector(pci.read_file(host, POLICY, 256) or "")
    return selector[1] if selector is not None and selector[1].isalpha() else ""


def _links(device: pci.PciDevice) -> list[tuple[str, str]]:
    """Return the links on a device's path as (lower end, upper end), from the device up.

    A PCIe path alternates: the device, the port above it, that switch's upstream port,
    the port above that, up to a root port; each link is a (lower, upper) pair of it.
    """
    chain = [device.address, *device.ancestors()]
    return [(chain[i], chain[i + 1]) for i in range(0, len(chain) - 1, 2)]


class PcieAspm(Check[CheckOptions]):
    """Links and ports above GPUs and NICs should not sleep: ASPM off, ports not suspending."""

    id: ClassVar[str] = "pcie.aspm"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        CMDLINE,
        POLICY,
        *pci.DEVICE_READS,
        *pci.NET_SPEED_READS,
        *pci.LINK_PM_READS,
        *pci.RUNTIME_PM_READS,
        *pci.CONFIG_READS,
        *environment.READS,
    )
    rationale: ClassVar[str] = (
        "ASPM L0s/L1 put idle links to sleep: the first DMA after each idle gap between decode "
        "steps waits for the link to wake, and L1 plus ports that runtime-suspend have caused "
        "Surprise Link Down errors and lockups on multi-GPU PCIe rigs. A port that suspends "
        "also has its ACS redirect bits set again on resume."
    )
    remedy: ClassVar[str] = (
        "Now: echo 0 > /sys/bus/pci/devices/DEV/link/l1_aspm (and l0s_aspm, the L1 substates) "
        "for each link, echo on > .../power/control for each port above a GPU. At boot: "
        "pcie_aspm.policy=performance on the command line, and a udev rule that sets the "
        "ports' power/control to on (or pcie_aspm=off pcie_port_pm=off, with ASPM disabled "
        "in the BIOS)."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        if env.in_container or env.vm:
            where = f"inside a {env.describe()}" if env.in_container else env.describe()
            yield self.skipped("pcie", f"{where}: link power management of the physical links "
                               "is the host's; audit the host",
                               evidence={"environment": env.describe()})
            return
        targets = [d for d in pci.devices(host) if not d.virtual_function
                   and (d.is_gpu or pci.is_data_path_nic(host, d))]
        if not targets:
            yield self.skipped("pcie", "no GPU or data-path NIC (RDMA-capable, or "
                               "25 Gb/s and faster)")
            return
        tokens = cmdline_tokens(host)
        aspm_off = "off" in params(tokens, "pcie_aspm")
        port_pm_off = "off" in params(tokens, "pcie_port_pm")
        policy = read_policy(host)
        base = {"policy": policy or "unknown",
                "cmdline": " ".join(t for t in tokens if t.startswith("pcie_"))[:200]}
        gpus = {d.address for d in targets if d.is_gpu}
        findings: list[Finding] = []
        if policy in _POWERSAVING and not aspm_off:
            findings.append(self.warned(
                "pcie_aspm",
                f"ASPM policy is {policy}: the kernel enables L1 (and its substates) on every "
                "link that supports it, GPU and NIC links included",
                observed=policy, expected="performance or default with ASPM off",
                fix=POLICY_PARAM, evidence={**base, "problem": "policy"}))
        else:
            findings.append(self.passed("pcie_aspm", f"ASPM policy {policy or 'unknown'}"
                                        + ("; pcie_aspm=off: firmware's setting stays"
                                           if aspm_off else ""), observed=policy,
                                        evidence=base))
        seen: set[str] = set()
        for device in targets:
            for lower, upper in _links(device):
                if lower in seen:
                    continue
                seen.add(lower)
                below = [d.address for d in targets
                         if d.address == lower or lower in d.ancestors()]
                findings.extend(self._judge_link(host, lower, upper, below, gpus, aspm_off, base))
        findings.extend(self._judge_ports(host, targets, gpus, port_pm_off, base))
        yield from findings

    def _judge_link(self, host: Host, lower: str, upper: str, below: list[str],
                    gpus: set[str], aspm_off: bool, base: dict[str, str]) -> Iterable[Finding]:
        what = "link" if lower in below and len(below) == 1 else "uplink"
        ev = {**base, "link": f"{lower} - {upper}", "devices_below": short_list(below),
              "gpus_below": str(sum(1 for a in below if a in gpus))}
        if aspm_off:
            yield from self._firmware_aspm(host, lower, upper, ev, what)
            return
        states = pci.link_pm(host, lower)
        ev.update({f"link_{k}": v for k, v in states.items()})
        enabled = [s for s in ASPM_STATES if states.get(s) == "1"]
        if enabled:
            names = " ".join(_STATE_NAMES[s] for s in reversed(enabled))
            yield self.warned(
                lower,
                f"ASPM {names} enabled on the {what} {lower} - {upper} "
                f"({len(below)} GPU/NIC function(s) below: {short_list(below, 4)})",
                observed=names, expected="ASPM off",
                fix=f"echo 0 > /sys/bus/pci/devices/{lower}/link/l1_aspm",
                evidence={**ev, "problem": "link", "enabled": " ".join(enabled)})
        elif states:
            yield self.passed(lower, f"ASPM off on the {what} {lower} - {upper}", evidence=ev)
        else:
            yield self.passed(lower, f"the {what} {lower} - {upper} supports no ASPM state the "
                              "kernel controls", evidence=ev)

    def _firmware_aspm(self, host: Host, lower: str, upper: str, ev: dict[str, str],
                       what: str) -> Iterable[Finding]:
        """With pcie_aspm=off, read ASPM Control from Link Control at both ends (root)."""
        enabled: list[str] = []
        for end in (lower, upper):
            config = pci.read_config(host, end)
            try:
                cap = pciconfig.decode_pcie_capability(config) if config else None
            except pciconfig.NeedsRoot:
                yield self.skipped(lower, f"pcie_aspm=off: the kernel leaves firmware's ASPM "
                                   f"setting on the {what} {lower} - {upper}; reading it from "
                                   "Link Control needs root", evidence=ev)
                return
            except pciconfig.ConfigSpaceError as exc:
                yield self.skipped(lower, f"{end}: {exc}", evidence=ev)
                return
            if cap is not None and cap.link_control & 0x3:
                bits = cap.link_control & 0x3
                enabled.append(f"{end}:{'L0s' if bits & 1 else ''}{' ' if bits == 3 else ''}"
                               f"{'L1' if bits & 2 else ''}")
        if enabled:
            yield self.warned(
                lower,
                f"pcie_aspm=off is on the command line, so the kernel leaves firmware's ASPM "
                f"setting alone, and firmware enabled ASPM on the {what} {lower} - {upper} "
                f"({', '.join(enabled)})",
                observed=", ".join(enabled), expected="ASPM off",
                fix=f"setpci -s {lower} {LINK_CONTROL}=0000:0003",
                evidence={**ev, "problem": "firmware-aspm", "ends": ", ".join(enabled)})
        else:
            yield self.passed(lower, f"ASPM off on the {what} {lower} - {upper} (Link Control)",
                              evidence=ev)

    def _judge_ports(self, host: Host, targets: Sequence[pci.PciDevice], gpus: set[str],
                     port_pm_off: bool, base: dict[str, str]) -> Iterable[Finding]:
        ports: dict[str, list[str]] = {}
        for device in targets:
            for bridge in device.ancestors():
                ports.setdefault(bridge, []).append(device.address)
        steady = 0
        for port, below in ports.items():
            pm = pci.runtime_pm(host, port)
            if pm is None:
                continue
            ev = {**base, "control": pm.control, "runtime_status": pm.status,
                  "runtime_suspended_ms": str(pm.suspended_ms if pm.suspended_ms is not None
                                              else ""),
                  "devices_below": short_list(below),
                  "gpus_below": str(sum(1 for a in below if a in gpus))}
            slept = pm.status == "suspended" or (pm.suspended_ms or 0) > 0
            if pm.control == "auto" and slept and not port_pm_off:
                yield self.warned(
                    port,
                    f"port {port} above {short_list(below, 4)} runtime-suspends (power/control "
                    f"auto, suspended {pm.suspended_ms or 0} ms since boot, now {pm.status}): "
                    "the link goes down under the GPU and ACS is set again on resume",
                    observed=f"auto, {pm.status}", expected="on",
                    fix=f"echo on > /sys/bus/pci/devices/{port}/power/control",
                    evidence={**ev, "problem": "port-pm"})
            else:
                steady += 1
        yield self.passed("ports", f"{steady} port(s) above GPUs and NICs stay powered"
                          + (" (pcie_port_pm=off)" if port_pm_off else ""),
                          evidence={**base, "ports": str(len(ports))})

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Turn ASPM off on each link and keep each port powered, now and at boot."""
        from auditor.remedy import Remedy, RunCommand, SetPciBits, SetValue, WriteFile, evidence
        remedies: list[Remedy] = []
        boot: list[str] = []
        rules: list[str] = []
        for finding in findings:
            ev = evidence(finding)
            problem, subject = ev.get("problem", ""), finding.subject
            if problem == "policy":
                boot.append(POLICY_PARAM)
            elif problem == "link" and pci.is_pci_address(subject):
                steps: list[Step] = []
                enabled = ev.get("enabled", "").split()
                for state in ASPM_STATES:
                    if state in enabled:
                        steps.append(SetValue(f"{pci.PCI_DEVICES}/{subject}/link/{state}", "0"))
                remedies.append(Remedy(
                    check=self.id, subject=subject, title=f"ASPM off on the link of {subject}",
                    runtime=tuple(steps)))
                boot.append(POLICY_PARAM)
            elif problem == "firmware-aspm" and pci.is_pci_address(subject):
                upper = ev.get("link", "").rpartition(" - ")[2]
                ends = [subject] + ([upper] if pci.is_pci_address(upper) else [])
                remedies.append(Remedy(
                    check=self.id, subject=subject,
                    title=f"clear ASPM Control in Link Control of {' and '.join(ends)}",
                    runtime=tuple(SetPciBits(end, LINK_CONTROL, "0000", "0003")
                                  for end in reversed(ends)),
                    notes=("pcie_aspm=off makes the kernel keep firmware's ASPM setting, so this "
                           "lasts until the next boot: disable ASPM in the BIOS, or replace "
                           "pcie_aspm=off by pcie_aspm.policy=performance",)))
            elif problem == "port-pm" and pci.is_pci_address(subject):
                remedies.append(Remedy(
                    check=self.id, subject=subject, title=f"keep port {subject} powered",
                    runtime=(SetValue(f"{pci.PCI_DEVICES}/{subject}/power/control", "on"),)))
                rules.append(f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{subject}", '
                             'ATTR{power/control}="on"')
        if rules:
            content = ("# Written by host-auditor: keep the PCIe ports above the GPUs and NICs "
                       "out of runtime suspend.\n" + "\n".join(rules) + "\n")
            remedies.append(Remedy(
                check=self.id, subject="udev",
                title="keep the ports above the GPUs powered when they are added at boot",
                persistent=(WriteFile(UDEV_RULE, content),
                            RunCommand(("udevadm", "control", "--reload-rules"), after=(0,),
                                       undo=("udevadm", "control", "--reload-rules"),
                                       optional=True)),
                notes=("pcie_port_pm=off on the command line does the same for every port",)))
        if boot:
            remedies.append(Remedy(
                check=self.id, subject="pcie_aspm",
                title="ASPM policy performance at boot",
                boot_params=(POLICY_PARAM,),
                notes=("with firmware in control of ASPM (no OS control granted) the policy "
                       "cannot change links: disable ASPM in the BIOS then",
                       "TLP, power-profiles-daemon or tuned can set the policy back at runtime"),
                reboot=True))
        return remedies
