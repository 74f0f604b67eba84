"""pcie.acs: ACS redirect on the root and switch ports above GPUs and RDMA NICs.

Access Control Services P2P Request Redirect (R), Completion Redirect (C) and Egress
Control (E) make a port send peer requests up to the root complex instead of across to
the peer: GPU pairs on one switch lose half their bandwidth, and NCCL all-reduce can hang
(NVIDIA/nccl#2079: AMD root ports with ``ACSCtl: 0x001d``). ``nvidia-smi topo -p2p`` still
says OK: only config space tells. The ACS extended capability (id 0x000d) is found by
walking the extended capability list from 0x100 (root only: other users read 64 bytes);
its control register is at +6.

An active IOMMU makes the kernel enable SrcValid, ReqRedir, CmpltRedir and UpstreamFwd
on every port at enumeration (drivers/pci/pci.c ``pci_enable_acs``, requested by the
IOMMU drivers' ``pci_request_acs``), then apply ``pci=disable_acs_redir=`` and
``pci=config_acs=``. ``pci_restore_state`` ends with ``pci_enable_acs`` again, so a
``setpci`` fix lasts only until the next config-state restore (port runtime resume,
AER/DPC recovery, reset, hot-plug) while an IOMMU is active; the command line survives.

Only ports above devices that talk peer to peer are judged (gpupath.peers): not GeForce
boards (the driver refuses them P2P), not GPUs whose peer traffic an NVLink or xGMI fabric
carries unless an RDMA NIC pairs with them, not a port with a single peer device below it.
The command line that will cover a port is the next boot's, as every check reads it
(checks/lib/bootloader.py ``next_boot``): a port it covers is *pending a reboot*, and the
fix writes no second ``pci=`` token for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import bootloader, pci, pcicmdline, pciconfig
from auditor.checks.lib.gpupath import (
    CMDLINE,
    NODE_READS,
    PEER_READS,
    VFIO_DRIVERS,
    bridges_above,
    cmdline_tokens,
    kernel_release,
    nvlink_c2c,
    params,
    peers,
    short_list,
)
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import version_tuple

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

IOMMU_CLASS = "/sys/class/iommu"
#: amdgpu's xGMI hive of a GPU: Instinct GPUs in one hive talk over Infinity Fabric links.
XGMI_HIVE = "/sys/bus/pci/devices/*/xgmi_hive_info/xgmi_hive_id"
REGISTER = "ECAP_ACS+06.w"
#: R, C and E cleared, every other bit of ACS Control kept (value:mask for setpci).
CLEAR_VALUE, CLEAR_MASK = "0000", f"{pciconfig.ACS_REDIRECT_BITS:04x}"
_REDIRECT = pciconfig.ACS_REQUEST_REDIRECT | pciconfig.ACS_COMPLETION_REDIRECT
#: 6.11 and 6.12 fail to parse a list of several devices (fixed by "PCI/ACS: Fix
#: 'pci=config_acs=' parameter", which touches both parameters).
_PARSE_BUG = ((6, 11), (6, 13))
_PORT_TYPES_WITH_REDIRECT = frozenset({0x4, 0x6})


class _Cover(NamedTuple):
    """What the command line does to one port's ACS redirect bits."""

    clears: bool
    source: str
    stopped: bool = False


def _cover(tokens: Sequence[str], device: pci.PciDevice, control: int) -> _Cover:
    options = pcicmdline.pci_options(tokens)
    ids = pcicmdline.DeviceIds(device.vendor, device.device)
    ancestors = device.ancestors()
    clears, source, stopped = False, "", False
    redir = pcicmdline.last_option(options, "disable_acs_redir")
    hit, _, stop = pcicmdline.match_list(redir, device.address, ancestors, ids)
    stopped |= stop
    if hit:
        clears, source = True, "pci=disable_acs_redir="
        control &= ~pciconfig.ACS_REDIRECT_BITS
    config = pcicmdline.last_option(options, "config_acs")
    hit, bits, stop = pcicmdline.match_list(config, device.address, ancestors, ids, flags=True)
    stopped |= stop
    if hit:
        after = pcicmdline.config_acs_effect(bits, control)
        clears = not after & pciconfig.ACS_REDIRECT_BITS
        source = "pci=config_acs="
    return _Cover(clears, source, stopped)


class PcieAcs(Check[CheckOptions]):
    """Root and switch ports above GPUs and RDMA NICs must not redirect peer traffic (ACS)."""

    id: ClassVar[str] = "pcie.acs"
    severity: ClassVar[Severity] = Severity.CRITICAL
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *PEER_READS,
        CMDLINE,
        f"{IOMMU_CLASS}/*",
        "/proc/sys/kernel/osrelease",
        XGMI_HIVE,
        *pci.DEVICE_READS,
        *pci.CONFIG_READS,
        *NODE_READS,
        *environment.READS,
        *bootloader.NEXT_BOOT_READS,
    )
    rationale: ClassVar[str] = (
        "ACS P2P Request/Completion Redirect and Egress Control on a root port or switch "
        "downstream port send every peer transfer up to the root complex: GPU pairs on one "
        "switch drop from ~100 to ~50 GB/s, and NCCL all-reduce deadlocks have been traced to "
        "root ports with ReqRedir+ CmpltRedir+. nvidia-smi topo -p2p still reports OK; only "
        "the ports' config space shows it."
    )
    remedy: ClassVar[str] = (
        "Put pci=disable_acs_redir=<port>;<port>... on the kernel command line (one token: only "
        "the last one counts) and reboot, or disable ACS in the BIOS. setpci -s PORT "
        "ECAP_ACS+06.w=0000:002c clears it now, but while an IOMMU is active any config-state "
        "restore (port resume, AER recovery, reset) sets it again. Never on a host that passes "
        "devices to VMs with vfio-pci: its IOMMU groups rely on ACS."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        if env.in_container:
            yield self.skipped("pcie", f"inside a {env.describe()}: config space past 64 bytes "
                               "is out of reach even for root here; audit the host",
                               evidence={"environment": env.describe()})
            return
        if env.vm:
            yield self.skipped("pcie", f"{env.describe()}: ACS on the physical ports is the "
                               "hypervisor host's; a guest's virtual ports do not redirect",
                               evidence={"environment": env.describe()})
            return
        found = peers(host)
        tokens = cmdline_tokens(host)
        lint = list(self._lint(tokens))
        if not found.traffic:
            yield from lint
            yield self.skipped("pcie", f"no peer traffic ({found.describe()})",
                               evidence={"peers": found.describe()})
            return
        if any(nvlink_c2c(host, gpu) for gpu in found.gpus):
            yield from lint
            yield self.skipped(
                "pcie", "Grace superchip: peer traffic uses ATS-translated addresses, and "
                "NVIDIA's platform configuration (pci=config_acs= from rdma_topo) deliberately "
                "keeps some redirect bits on; not judged against the PCIe-only rule")
            return
        # Only the GPUs that can do P2P (not GeForce boards, which the driver refuses it).
        gpus = {d.address for d in found.capable}
        inventory = pci.by_address(host)
        # The fabric gpupath.peers found (the same one iommu.mode and pcie.bar1 go by): an
        # NVSwitch fabric, or every P2P-capable GPU in one xGMI hive.
        fabric = found.fabric
        # The next boot's line, as boot.cmdline reads it: a port its configured pci= covers
        # is pending a reboot, and the fix does not write it again.
        nxt = bootloader.next_boot(host)
        # GPUDirect RDMA needs a GPU the driver gives it (not a GeForce board) and an RDMA NIC.
        gdr = bool(found.capable and found.rdma)
        try:
            iommu = any(not n.startswith(".") for n in host.listdir(IOMMU_CLASS))
        except OSError:
            iommu = False
        vfio = sorted(d.address for d in inventory.values() if d.driver in VFIO_DRIVERS)
        release = version_tuple(kernel_release(host))[:2]
        parse_bug = _PARSE_BUG[0] <= release < _PARSE_BUG[1]
        findings: list[Finding] = []
        needs_root: list[str] = []
        for bridge, targets in bridges_above(found.p2p_devices).items():
            device = inventory.get(bridge)
            config = pci.read_config(host, bridge)
            if device is None or config is None:
                findings.append(self.skipped(bridge, "port: its config space cannot be read"))
                continue
            try:
                acs = pciconfig.decode_acs(config)
                cap = pciconfig.decode_pcie_capability(config)
            except pciconfig.NeedsRoot:
                needs_root.append(bridge)
                continue
            except pciconfig.ConfigSpaceError as exc:
                findings.append(self.skipped(bridge, f"port: {exc}"))
                continue
            below_gpus = [a for a in targets if a in gpus]
            below_nics = [a for a in targets if a not in gpus]
            port = cap.port_type_name if cap is not None else "bridge"
            ev = {"port_type": port, "vendor": f"{device.vendor or 0:#06x}",
                  "device": f"{device.device or 0:#06x}",
                  "gpus_below": short_list(below_gpus), "nics_below": short_list(below_nics),
                  "iommu_active": "yes" if iommu else "no"}
            if vfio:
                ev["vfio_devices"] = short_list(vfio)
            if acs is None:
                findings.append(self.passed(bridge, f"{port} has no ACS capability: it cannot "
                                            "redirect peer traffic", evidence=ev))
                continue
            cover = _cover(tokens, device, acs.control)
            later = _cover(nxt.tokens, device, acs.control) if nxt.known else cover
            pending = later.clears and not cover.clears
            ev.update(acs_offset=f"{acs.offset:#x}", acs_ctl=f"{acs.control:#06x}",
                      acs_cap=f"{acs.capability:#06x}", acs_flags=pciconfig.acs_flags(acs.control),
                      cmdline=cover.source, **nxt.evidence())
            if pending:
                ev["next_boot_cover"] = later.source
            waiting = (f" {later.source} in the next boot's line ({nxt.describe()}) covers "
                       "this port: pending a reboot." if pending else "")
            set_names = pciconfig.acs_set_names(acs.redirect)
            whom = (f"{len(below_gpus)} GPU(s)" if below_gpus else "") + (
                (" and " if below_gpus and below_nics else "")
                + (f"{len(below_nics)} RDMA NIC(s)" if below_nics else ""))
            restore = (" While an IOMMU is active a runtime fix is undone by any config-state "
                       "restore (port resume, AER recovery, reset)." if iommu else "")
            ignored = ""
            if cover.clears and acs.redirect:
                ignored = (f"; {cover.source} names this port but the bits are still set"
                           + (f" (kernel {kernel_release(host)} fails to parse a list of "
                              "several devices)" if parse_bug else ": the string does not "
                              "match it, or the kernel predates the parameter"))
            elif cover.stopped:
                ignored = "; the kernel cannot parse the ACS device list on the command line"
            if acs.redirect and self._alone(bridge, targets, found.p2p_devices, inventory):
                # One peer device below this port and none beside it below the port above:
                # its peer traffic crosses the ports above either way, redirected or not.
                findings.append(self.passed(
                    bridge, f"{port} redirects ({' '.join(set_names) or 'EgressCtrl'}, ACSCtl "
                    f"{acs.control:#06x}) above a single peer device ({targets[0]}) with none "
                    "beside it: its peer traffic crosses the ports above either way",
                    evidence={**ev, "problem": "alone"}))
                continue
            if acs.redirect & _REDIRECT:
                downstream = cap is not None and cap.port_type == 0x6
                if below_gpus and not fabric:
                    status, why = self.failed, "GPU peer traffic goes up to the root complex"
                elif gdr and downstream:
                    status, why = self.failed, ("GPUDirect RDMA between the GPUs and NICs of "
                                                "this switch goes up to the root complex")
                elif below_gpus:
                    status, why = self.warned, (f"the GPUs talk over {fabric}; this matters to "
                                                "GPU-NIC pairs under different root ports")
                else:
                    status, why = self.warned, "GPUDirect RDMA peer reads are redirected"
                findings.append(status(
                    bridge,
                    f"{port} redirects peer traffic ({' '.join(set_names)}, ACSCtl "
                    f"{acs.control:#06x}) above {whom}: {why}{ignored}.{restore}{waiting}",
                    observed=" ".join(set_names), expected="ReqRedir- CmpltRedir- EgressCtrl-",
                    fix=f"setpci -s {bridge} {REGISTER}={CLEAR_VALUE}:{CLEAR_MASK}",
                    evidence={**ev, "problem": "redirect"}))
            elif acs.redirect:
                findings.append(self.warned(
                    bridge,
                    f"{port} has ACS Egress Control on (ACSCtl {acs.control:#06x}) above "
                    f"{whom}: peer traffic may be blocked or sent upstream{ignored}.{restore}"
                    f"{waiting}",
                    observed="EgressCtrl+", expected="EgressCtrl-",
                    fix=f"setpci -s {bridge} {REGISTER}={CLEAR_VALUE}:{CLEAR_MASK}",
                    evidence={**ev, "problem": "redirect"}))
            elif (iommu and acs.capability & _REDIRECT and not cover.clears
                  and cap is not None and cap.port_type in _PORT_TYPES_WITH_REDIRECT):
                findings.append(self.warned(
                    bridge,
                    f"{port} does not redirect now (ACSCtl {acs.control:#06x}) above {whom}, "
                    "but the kernel turned redirect on at boot (an IOMMU is active) and no "
                    "pci=disable_acs_redir= of the running line covers it: it was cleared at "
                    "runtime, and the next config-state restore (port resume, AER recovery, "
                    "reset) sets it again"
                    + (f";{waiting}" if pending else " and so does the next boot"),
                    observed="cleared at runtime", expected="cleared by the command line",
                    evidence={**ev, "problem": "runtime-only"}))
            else:
                kept = pciconfig.acs_set_names(acs.control)
                findings.append(self.passed(
                    bridge,
                    f"{port} does not redirect peer traffic (ACSCtl {acs.control:#06x}"
                    + (f": {' '.join(kept)} only" if kept else "") + ")"
                    + (f"; {cover.source} clears it" if cover.clears else ""),
                    evidence=ev))
        yield from lint
        yield from findings
        if needs_root:
            yield self.skipped("pcie", "needs root: ACS lives in extended config space, which "
                               f"only root can read ({len(needs_root)} port(s) above "
                               f"{found.describe()})",
                               evidence={"ports": short_list(needs_root)})

    @staticmethod
    def _alone(bridge: str, targets: list[str], devices: Sequence[pci.PciDevice],
               inventory: dict[str, pci.PciDevice]) -> bool:
        """Return whether a port has one peer device below it and no sibling peer below the
        port above it (a root port with one device, a switch with one peer)."""
        if len(targets) != 1:
            return False
        port = inventory.get(bridge)
        above = port.ancestors() if port is not None else []
        if not above:
            return True
        return not any(above[0] in d.ancestors() and d.address != targets[0] for d in devices)

    def _lint(self, tokens: Sequence[str]) -> Iterable[Finding]:
        for value in params(tokens, "pcie_acs_override"):
            yield self.warned("cmdline", f"pcie_acs_override={value[:60]} is an out-of-tree "
                              "patch: it changes IOMMU grouping only, never the ports' ACS "
                              "bits, and stock kernels ignore it",
                              evidence={"token": f"pcie_acs_override={value}"[:200],
                                        "problem": "acs-override"})
        options = pcicmdline.pci_options(tokens)
        redirs = list(dict.fromkeys(o for o in options if o.startswith("disable_acs_redir=")))
        if len(redirs) > 1:
            yield self.warned("cmdline", f"{len(redirs)} pci=disable_acs_redir= options: only "
                              "the last one counts, the others do nothing",
                              evidence={"options": " ".join(redirs)[:400],
                                        "problem": "repeated"})

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Clear R, C and E now with setpci, and name the ports in one boot-line token."""
        from auditor.remedy import Advice, Remedy, SetPciBits, evidence
        problems = {evidence(f).get("problem", "") for f in findings}
        ports = [f for f in findings if evidence(f).get("problem") in ("redirect", "runtime-only")
                 and pci.is_pci_address(f.subject)]
        lint: list[Remedy] = []
        if "acs-override" in problems:
            lint.append(Remedy(
                check=self.id, subject="cmdline", title="pcie_acs_override does nothing here",
                advice=(Advice("remove pcie_acs_override= from the boot configuration: stock "
                               "kernels ignore it, and where patched it only regroups the IOMMU"),
                        )))
        if not ports:
            if "repeated" in problems:
                lint.append(Remedy(
                    check=self.id, subject="cmdline",
                    title="one pci=disable_acs_redir= token with every device",
                    boot_params=(self._boot_token(host, []),), reboot=True))
            return lint
        inventory = pci.by_address(host)
        vfio = sorted(d.address for d in inventory.values() if d.driver in VFIO_DRIVERS)
        remedies: list[Remedy] = []
        for finding in ports:
            if evidence(finding).get("problem") != "redirect":
                continue
            if vfio:
                continue
            remedies.append(Remedy(
                check=self.id, subject=finding.subject,
                title=f"clear ACS ReqRedir, CmpltRedir and EgressCtrl on {finding.subject}",
                runtime=(SetPciBits(finding.subject, REGISTER, CLEAR_VALUE, CLEAR_MASK),),
                notes=("while an IOMMU is active this lasts until the port's next config-state "
                       "restore (runtime resume, AER recovery, reset); the boot parameter "
                       "below makes it stay",),
            ))
        uncovered = [f.subject for f in ports if not evidence(f).get("next_boot_cover")]
        covered = [f.subject for f in ports if evidence(f).get("next_boot_cover")]
        if not uncovered:
            release = bootloader.next_boot(host).release or "the configured kernel"
            # Every port is covered by the configured line already: writing it again would
            # duplicate a setting pending a reboot.
            remedies.append(Remedy(
                check=self.id, subject="cmdline",
                title="ACS redirect off at boot: configured, pending a reboot",
                advice=(Advice(f"reboot into {release} to boot with the configured "
                               "pci=disable_acs_redir="),),
                notes=(f"{len(covered)} port(s) are covered by the next boot's line; "
                       "boot.cmdline reports it as pending a reboot",),
                reboot=True))
            return lint + remedies
        token = self._boot_token(host, uncovered)
        notes = [
            "bus numbers can change when cards are added or the firmware changes: audit again "
            "after hardware changes",
            "this removes the IOMMU isolation between the devices below these ports: never on "
            "a host that passes them to VMs with vfio-pci",
        ]
        if vfio:
            notes.insert(0, f"no runtime change: {len(vfio)} device(s) are bound to vfio-pci "
                         f"({short_list(vfio, 4)}), whose IOMMU groups were formed with ACS on")
        remedies.append(Remedy(
            check=self.id, subject="cmdline",
            title="keep ACS redirect off on the ports above the GPUs and RDMA NICs at boot",
            boot_params=(token,),
            notes=tuple(notes),
            reboot=True,
        ))
        return lint + remedies

    def _boot_token(self, host: Host, ports: Sequence[str]) -> str:
        """Return one ``pci=`` token with every pci option kept and the ports merged in.

        The boot edit replaces every ``pci=`` token of the line it edits with this one, so
        it carries the options of the running line and of the configured lines; the
        devices of every ``disable_acs_redir=`` merge into one list, since only the last
        one would count.
        """
        sources = [cmdline_tokens(host), list(bootloader.next_boot(host).tokens)]
        options: list[str] = []
        devices: list[str] = []
        for tokens in sources:
            for option in pcicmdline.pci_options(tokens):
                if option.startswith("disable_acs_redir="):
                    devices += pcicmdline.split_devices(option.partition("=")[2])
                elif option not in options:
                    options.append(option)
        for port in sorted(ports):
            if port not in devices:
                devices.append(port)
        # GRUB's script language splits commands at an unquoted ``;``: escaped there, the
        # kernel still receives ``;`` (www.gnu.org/software/grub/manual, "Shell-like
        # scripting"). systemd-boot and /etc/kernel/cmdline pass the line as written.
        separator = "\\;" if self._edits_grub(host) else ";"
        options.append("disable_acs_redir=" + separator.join(dict.fromkeys(devices)))
        return "pci=" + ",".join(options)

    @staticmethod
    def _edits_grub(host: Host) -> bool:
        """Return whether the boot edit goes to GRUB (where ``;`` separates commands): the
        same choice as :func:`auditor.remediations.boot.boot_remedy`."""
        return bootloader.edits_grub(host)

