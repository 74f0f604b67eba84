"""pcie.mrrs: PCIe Max Read Request Size and link training of GPUs and NICs.

A GPU or NIC fetching host memory by DMA splits every read into requests of at
most MaxReadReq bytes. BIOSes and the kernel often leave it at 512, which caps
host-to-device copy bandwidth (model loading, KV-cache offload, RDMA) well below
what a Gen5 x16 link can carry. The value is read from the PCI Express
capability in each device's config space, found by walking the capability list.

Only functions whose MaxReadReq governs real traffic are judged: not the devices a
hypervisor emulates for a guest (virtio and other QEMU/VMware devices, whose Device
Control is faked), not SR-IOV virtual functions (their MaxReadReq field is reserved; a
guest sees no ``physfn`` link, so they are told by their device ids), and not a Grace
superchip's GPU, whose host traffic runs over NVLink-C2C. The path from each judged
device up to its root port is walked too: a switch uplink that trained below what both
its ends support caps every device below it, although their own links read x16.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor import environment
from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import pci, pciconfig
from auditor.checks.lib.gpupath import NODE_READS, nvlink_c2c
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

#: Base class / sub-class pairs (the upper 16 bits of the class code) judged as GPUs:
#: VGA (0x0300), 3D controller (0x0302, data-centre NVIDIA parts), other display
#: controller (0x0380, AMD Instinct MI200) and processing accelerator (0x1200,
#: AMD Instinct MI300, Habana Gaudi).
GPU_CLASSES = frozenset({0x0300, 0x0302, 0x0380, 0x1200})
#: Base class of network controllers: Ethernet 0x0200, InfiniBand 0x0207, ...
NETWORK_BASE_CLASS = 0x02
#: MaxReadReq encodings 110b and 111b are reserved by the PCIe spec.
_MAX_MRRS_CODE = 5
#: Device Control is CAP_EXP+08; MaxReadReq is bits 14:12. The fix's mask leaves
#: MaxPayload (bits 7:5) and every other bit as the device has them.
REGISTER = "CAP_EXP+08.w"
UDEV_RULE = "/etc/udev/rules.d/99-host-auditor-pcie-mrrs.rules"
_FIX_ADDRESS = lazy_re(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ID = lazy_re(r"0x[0-9a-f]{4}")
#: Vendors whose functions in a guest are the hypervisor's inventions: Red Hat/QEMU virtio
#: and bridges (0x1af4, 0x1b36), QEMU's VGA (0x1234), VMware (0x15ad), VirtualBox
#: (0x80ee), Hyper-V (0x1414).
EMULATED_VENDORS = frozenset({0x1AF4, 0x1B36, 0x1234, 0x15AD, 0x80EE, 0x1414})
#: QEMU gives the devices it emulates (an e1000e, a Bochs display) this subsystem id
#: (PCI_SUBVENDOR_ID_REDHAT_QUMRANET, PCI_SUBDEVICE_ID_QEMU); passed-through devices keep
#: their own.
QEMU_SUBSYSTEM = (0x1AF4, 0x1100)
#: SR-IOV virtual function device ids (pci.ids "Virtual Function" entries of the NICs seen
#: on GPU servers): what a guest sees of a VF, which has no physfn link there.
VF_DEVICE_IDS = frozenset({
    (0x15B3, 0x1004), (0x15B3, 0x1012), (0x15B3, 0x1014), (0x15B3, 0x1016),
    (0x15B3, 0x1018), (0x15B3, 0x101A), (0x15B3, 0x101C), (0x15B3, 0x101E),
    (0x8086, 0x10ED), (0x8086, 0x1515), (0x8086, 0x1565), (0x8086, 0x154C),
    (0x8086, 0x1571), (0x8086, 0x1889), (0x8086, 0x37CD), (0x8086, 0x0DD5),
    (0x14E4, 0x1606), (0x14E4, 0x1609), (0x14E4, 0x16DC), (0x14E4, 0x1807),
    (0x1077, 0x8090), (0x19A2, 0x0728),
})
#: Drivers that bind only virtual functions.
VF_DRIVERS = frozenset({"iavf", "i40evf", "ixgbevf", "igbvf", "ice_vf", "bnxt_en_vf"})
#: Port types whose Link Status describes the link above them (switch upstream ports,
#: PCIe-to-PCI bridges): the links of a path that are not a device's own.
_UPLINK_PORT_TYPES = frozenset({0x5, 0x7})


class _NotJudged(enum.Enum):
    """Why a GPU or network function yields no finding of its own."""

    NOT_PCIE = "no PCI Express capability"
    NOT_ENDPOINT = "not an endpoint"
    EMULATED = "emulated by the hypervisor"
    GUEST_VF = "an SR-IOV virtual function"
    NOT_DATA_PATH = "not a data-path NIC (onboard, Wi-Fi or management)"


_NOT_PCIE, _NOT_ENDPOINT = _NotJudged.NOT_PCIE, _NotJudged.NOT_ENDPOINT


def is_judged_class(class_code: int) -> bool:
    """Return whether a class code is a GPU, accelerator or network controller."""
    return (class_code >> 8) in GPU_CLASSES or (class_code >> 16) == NETWORK_BASE_CLASS


def is_gpu_class(class_code: int) -> bool:
    """Return whether a class code is a GPU or accelerator."""
    return (class_code >> 8) in GPU_CLASSES


class MrrsOptions(CheckOptions):
    """Options of ``pcie.mrrs``."""

    min_read_request_bytes: int = option(
        4096, choices=tuple(128 << n for n in range(_MAX_MRRS_CODE + 1)),
        help="the least MaxReadReq (bytes) a GPU or NIC endpoint may run with")


def mrrs_setpci_value(size: int) -> str:
    """Return the Device Control value:mask that sets MaxReadReq to ``size`` bytes."""
    return f"{(size.bit_length() - 8) << 12:04x}:7000"


class PcieMrrs(Check[MrrsOptions]):
    """GPUs and NICs need a 4096-byte PCIe MaxReadReq and a link trained to full width."""

    id: ClassVar[str] = "pcie.mrrs"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        "/sys/bus/pci/devices/*",
        "/sys/bus/pci/devices/*/class",
        "/sys/bus/pci/devices/*/config",
        "/sys/bus/pci/devices/*/vendor",
        "/sys/bus/pci/devices/*/device",
        "/sys/bus/pci/devices/*/driver",
        "/sys/bus/pci/devices/*/physfn",
        *pci.NET_SPEED_READS,
        "/sys/bus/pci/devices/*/subsystem_vendor",
        "/sys/bus/pci/devices/*/subsystem_device",
        *pci.DEVICE_READS,
        *NODE_READS,
        *environment.READS,
    )
    rationale: ClassVar[str] = (
        "Every DMA read a GPU or NIC issues to host memory is split into requests of at most "
        "MaxReadReq bytes. At 512 bytes a Gen5 x16 GPU spends a large share of the link on "
        "request and completion headers and round trips, so model loading, KV-cache offload "
        "and GPUDirect RDMA run well below the link's bandwidth. A link that trained to fewer "
        "lanes than the device supports (a bad riser, a dirty slot, a bifurcation setting) "
        "halves or quarters it outright."
    )
    remedy: ClassVar[str] = (
        "Set MaxReadReq in the device's PCI Express Device Control register: "
        "setpci -s BDF CAP_EXP+08.w=5000:7000 (4096 bytes). It does not survive a reboot or a "
        "device reset: persist it with a udev rule or a systemd unit that runs setpci, or set "
        "it in the BIOS. A link below its maximum width needs hardware attention (reseat, "
        "riser, slot bifurcation), not software."
    )
    options_type: ClassVar[type[CheckOptions]] = MrrsOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        target = self.options.min_read_request_bytes
        env = environment.environment(host)
        inventory = pci.by_address(host)
        findings: list[Finding] = []
        counts: dict[_NotJudged, int] = dict.fromkeys(_NotJudged, 0)
        candidates = 0
        ports: dict[str, pciconfig.PcieCapability | None] = {}
        for address in pci.pci_addresses(host):
            # The inventory's sysfs class and ids first (read once for every check); where
            # sysfs has none, the config header's. Config space is read only for the
            # devices judged.
            device = inventory.get(address)
            known = device.class_code if device is not None else None
            class_code = known if known is not None else pci.device_class(host, address)
            if class_code is None or not is_judged_class(class_code):
                continue
            if device is None or device.virtual_function:
                # A VF's MaxReadReq field is reserved: its physical function's value applies.
                continue
            if device.vendor is None or device.device is None:
                ids = pci.device_ids(host, address)
                device = device._replace(vendor=ids[0] if ids else None,
                                         device=ids[1] if ids else None)
            device = device._replace(class_code=class_code)
            if not (device.is_gpu or device.is_network):
                continue  # a BMC's or an emulated display: not a GPU
            candidates += 1
            if env.vm and self._emulated(host, device):
                counts[_NotJudged.EMULATED] += 1
                continue
            if not device.is_gpu and not pci.is_data_path_nic(host, device):
                # An onboard 1/2.5 GbE port, Wi-Fi or a management port carries no GPU
                # traffic: only data-path NICs (RDMA-capable, or 25 Gb/s and up) are judged.
                counts[_NotJudged.NOT_DATA_PATH] += 1
                continue
            if env.vm and ((device.vendor or 0, device.device or 0) in VF_DEVICE_IDS
                           or device.driver in VF_DRIVERS):
                counts[_NotJudged.GUEST_VF] += 1
                continue
            if nvlink_c2c(host, device):
                findings.append(self.skipped(
                    address, f"{pci.vendor_name(device.vendor)} GPU of a Grace superchip: its "
                    "host traffic runs over NVLink-C2C, not this PCIe link",
                    evidence={"class": f"{class_code:#08x}", "driver": device.driver}))
                continue
            config = pci.read_config(host, address)
            judged = self._judge_device(host, device, config, target, env)
            if isinstance(judged, list):
                findings.extend(judged)
                if judged and judged[0].status is not Status.SKIP and not env.vm:
                    findings.extend(self._judge_path(host, device, judged[0], ports))
            else:
                counts[judged] += 1
        if findings:
            yield from findings
            return
        detail = ""
        if candidates:
            parts = [f"{counts[_NOT_PCIE]} without a PCI Express capability",
                     f"{counts[_NOT_ENDPOINT]} not endpoints"]
            parts += [f"{n} {kind.value}" for kind, n in counts.items()
                      if n and kind in (_NotJudged.EMULATED, _NotJudged.GUEST_VF,
                                        _NotJudged.NOT_DATA_PATH)]
            detail = f" ({candidates} GPU or network function(s): {', '.join(parts)})"
        yield self.skipped("pcie", f"no GPU or data-path NIC PCIe endpoints{detail}")

    @staticmethod
    def _emulated(host: Host, device: pci.PciDevice) -> bool:
        """Return whether a guest's function is one the hypervisor emulates."""
        if device.vendor in EMULATED_VENDORS:
            return True
        base = pci.device_path(device.address)
        subsystem = (pci.read_hex(host, f"{base}/subsystem_vendor"),
                     pci.read_hex(host, f"{base}/subsystem_device"))
        return subsystem == QEMU_SUBSYSTEM

    @staticmethod
    def _port(host: Host, address: str, ports: dict[str, pciconfig.PcieCapability | None]
              ) -> pciconfig.PcieCapability | None:
        """Return a port's decoded PCI Express capability, read once per audit."""
        if address not in ports:
            config = pci.read_config(host, address)
            try:
                ports[address] = pciconfig.decode_pcie_capability(config) if config else None
            except pciconfig.ConfigSpaceError:
                ports[address] = None
        return ports[address]

    def _judge_path(self, host: Host, device: pci.PciDevice, own: Finding,
                    ports: dict[str, pciconfig.PcieCapability | None]) -> Iterator[Finding]:
        """Warn on the device for each uplink above it that trained below what it supports.

        A link's capability is the lesser of its two ends' Link Capabilities: a Gen4 switch
        below a Gen5 root port is not degraded at 16GT/s, an x8 uplink of x16 ports is.
        """
        chain = device.ancestors()
        what = own.message.partition(":")[0]
        for index, child in enumerate(chain[:-1]):
            parent = chain[index + 1]
            lower, upper = self._port(host, child, ports), self._port(host, parent, ports)
            if lower is None or upper is None or lower.port_type not in _UPLINK_PORT_TYPES:
                continue
            width = min(lower.max_link_width, upper.max_link_width)
            speed = min(lower.max_link_speed, upper.max_link_speed)
            problems = []
            if lower.link_width and width and lower.link_width < width:
                problems.append(f"x{lower.link_width} of x{width}")
            if lower.link_speed and speed and lower.link_speed < speed:
                problems.append(f"{pciconfig.link_speed_name(lower.link_speed)} of "
                                f"{pciconfig.link_speed_name(speed)}")
            if not problems:
                continue
            now = f"{pciconfig.link_speed_name(lower.link_speed)} x{lower.link_width}"
            best = f"{pciconfig.link_speed_name(speed)} x{width}"
            yield self.warned(
                device.address,
                f"{what}: the uplink of {lower.port_type_name} {child} to {parent} trained to "
                f"{' and '.join(problems)} ({now}, both ends support {best}): it caps the "
                "bandwidth of every device below it, this one included",
                observed=now, expected=best,
                evidence={**dict(own.evidence), "problem": "path", "bridge": child,
                          "bridge_parent": parent, "bridge_link": now, "bridge_link_max": best})

    def _judge_device(
        self, host: Host, device: pci.PciDevice, config: bytes | None, target: int,
        env: environment.Environment,
    ) -> list[Finding] | _NotJudged:
        address, class_code = device.address, device.class_code or 0
        vendor = pci.vendor_name(device.vendor)
        kind = "GPU" if is_gpu_class(class_code) else "network controller"
        what = f"{vendor} {kind}"
        evidence = {"class": f"{class_code:#08x}", "driver": device.driver}
        if device.vendor is not None and device.device is not None:
            evidence["vendor"] = f"{device.vendor:#06x}"
            evidence["device"] = f"{device.device:#06x}"
        if config is None:
            return [self.skipped(address, f"{what}: its config space cannot be read",
                                 evidence=evidence)]
        try:
            cap = pciconfig.decode_pcie_capability(config)
        except pciconfig.NeedsRoot:
            if env.in_container:
                # Root in a container lacks CAP_SYS_ADMIN in the initial user namespace,
                # which the kernel asks before returning more than 64 bytes.
                return [self.skipped(
                    address,
                    f"{what}: config space readable only to {len(config)} bytes inside a "
                    f"{env.describe()}, where even root cannot read further; audit the host",
                    evidence={**evidence, "environment": env.describe()},
                )]
            why = host.privilege_note or f"config space readable only to {len(config)} bytes"
            return [self.skipped(
                address, f"{what}: the PCI Express capability was not read (needs root: {why})",
                evidence=evidence,
            )]
        except pciconfig.ConfigSpaceError as exc:
            return [self.skipped(address, f"{what}: {exc}", evidence=evidence)]
        if cap is None:
            return _NOT_PCIE
        if not cap.is_endpoint:
            # Bridges, root ports and switch ports forward requests; their MaxReadReq is unused.
            return _NOT_ENDPOINT
        speed, max_speed = pciconfig.link_speed_name(cap.link_speed), pciconfig.link_speed_name(
            cap.max_link_speed
        )
        evidence.update(
            mrrs=str(cap.mrrs),
            mps=str(cap.mps),
            mps_supported=str(cap.mps_supported),
            cap_offset=f"{cap.offset:#x}",
            port_type=cap.port_type_name,
            link_speed=speed,
            link_width=str(cap.link_width),
            max_link_speed=max_speed,
            max_link_width=str(cap.max_link_width),
            target=str(target),
        )
        link = f"link {speed} x{cap.link_width} (max {max_speed} x{cap.max_link_width})"
        # Bare byte counts, as the README's JSON contract shows them.
        observed, expected = str(cap.mrrs), str(target)
        if cap.mrrs_code > _MAX_MRRS_CODE or cap.mrrs < target:
            reserved = " (a reserved encoding)" if cap.mrrs_code > _MAX_MRRS_CODE else ""
            verdict = self.failed(
                address,
                f"{what}: MaxReadReq is {cap.mrrs} bytes{reserved}, below {target}; "
                f"MaxPayload {cap.mps}; {link}",
                observed=observed, expected=expected,
                fix=f"setpci -s {address} CAP_EXP+08.w={mrrs_setpci_value(target)}",
                evidence={**evidence, "problem": "mrrs"},
            )
        else:
            note = ""
            if cap.link_speed < cap.max_link_speed and is_gpu_class(class_code):
                note = "; the link runs below its top speed, as an idle GPU's does"
            verdict = self.passed(
                address,
                f"{what}: MaxReadReq {cap.mrrs} bytes, MaxPayload {cap.mps}; {link}{note}",
                observed=observed, expected=expected, evidence=evidence,
            )
        upstream = None if env.vm else self._upstream(host, device)
        return [verdict, *self._judge_link(address, what, class_code, cap, link, evidence,
                                           upstream)]

    @staticmethod
    def _upstream(host: Host, device: pci.PciDevice) -> pciconfig.PcieCapability | None:
        """Return the PCI Express capability of the port above the device, if readable."""
        above = device.ancestors()
        if not above:
            return None
        config = pci.read_config(host, above[0])
        try:
            return pciconfig.decode_pcie_capability(config) if config else None
        except pciconfig.ConfigSpaceError:
            return None

    def _judge_link(
        self, address: str, what: str, class_code: int, cap: pciconfig.PcieCapability, link: str,
        evidence: dict[str, str], upstream: pciconfig.PcieCapability | None = None,
    ) -> Iterator[Finding]:
        # A downtrained link is a warning, not a failure: software cannot fix it (it wants a
        # reseat, a riser or a BIOS bifurcation change), and fix scripts act on failures.
        # A link is judged against the link: the lesser of both ends' Link Capabilities (a
        # x16 GPU in a bifurcated x8/x8 slot under a x8 root port trains to all it can).
        width, speed = cap.max_link_width, cap.max_link_speed
        capped = ""
        if upstream is not None:
            if upstream.max_link_width and width and upstream.max_link_width < width:
                width = upstream.max_link_width
                capped = f"; the port above supports x{width}"
            if upstream.max_link_speed and speed and upstream.max_link_speed < speed:
                speed = upstream.max_link_speed
                capped += f"; the port above supports {pciconfig.link_speed_name(speed)}"
        problems: list[str] = []
        if cap.link_width and width and cap.link_width < width:
            problems.append(f"trained to x{cap.link_width} of x{width} lanes")
        # GPUs drop their link speed when idle; a NIC's link runs at the speed it trained to.
        if (
            not is_gpu_class(class_code)
            and cap.link_speed
            and speed
            and cap.link_speed < speed
        ):
            problems.append(
                f"running at {pciconfig.link_speed_name(cap.link_speed)} of "
                f"{pciconfig.link_speed_name(speed)}"
            )
        if problems:
            yield self.warned(
                address,
                f"{what}: PCIe link {' and '.join(problems)}; {link}{capped}",
                observed=f"{pciconfig.link_speed_name(cap.link_speed)} x{cap.link_width}",
                expected=f"{pciconfig.link_speed_name(speed)} x{width}",
                evidence={**evidence, "problem": "link"}, aspect="link",
            )

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Set MaxReadReq on each device found short, and add a udev rule that keeps it."""
        from auditor.remedy import Advice, Remedy, RunCommand, SetPciBits, WriteFile, evidence
        target = self.options.min_read_request_bytes
        value, mask = mrrs_setpci_value(target).split(":")
        remedies: list[Remedy] = []
        rules: list[str] = []
        slow = sorted({(f.subject, evidence(f).get("bridge", "")) for f in findings
                       if evidence(f).get("problem") in ("link", "path")})
        if slow:
            links = ", ".join(f"{bridge} (above {subject})" if bridge else subject
                              for subject, bridge in slow[:8])
            remedies.append(Remedy(
                check=self.id, subject="links", title="links trained below their capability",
                advice=(Advice(f"reseat or replace the riser, retimer or cable of {links}; check "
                               "the slot's bifurcation and link speed settings in the BIOS; no "
                               "software setting retrains a link to more lanes"),)))
        # udev runs RUN+= programs by absolute path: pciutils puts setpci in /usr/bin on
        # Debian-like systems and in /usr/sbin on RHEL-like ones.
        ids = {context.os_release.get("ID", ""), *context.os_release.get("ID_LIKE", "").split()}
        setpci = "/usr/sbin/setpci" if ids & {"rhel", "centos", "rocky", "almalinux", "ol"} else (
            "/usr/bin/setpci")
        for finding in findings:
            address = finding.subject.lower()
            ev = evidence(finding)
            # A downtrained link (problem "link") is a warning no software setting fixes.
            if not _FIX_ADDRESS.fullmatch(address) or ev.get("problem", "mrrs") != "mrrs":
                continue
            match = ['ACTION=="add"', 'SUBSYSTEM=="pci"', f'KERNEL=="{address}"']
            vendor, device = ev.get("vendor", "").lower(), ev.get("device", "").lower()
            if not (_ID.fullmatch(vendor) and _ID.fullmatch(device)):
                vendor, device = _sysfs_id(host, address, "vendor"), _sysfs_id(host, address,
                                                                               "device")
            if vendor and device:
                match += [f'ATTR{{vendor}}=="{vendor}"', f'ATTR{{device}}=="{device}"']
            rules.append(", ".join(match)
                         + f', RUN+="{setpci} -s $kernel {REGISTER}={value}:{mask}"')
            remedies.append(Remedy(
                check=self.id,
                subject=address,
                title=f"MaxReadReq {target} on {address}",
                runtime=(SetPciBits(address, REGISTER, value, mask),),
            ))
        if rules:
            content = (f"# Written by host-auditor: PCIe MaxReadReq {target} (MaxPayload "
                       "untouched).\n" + "\n".join(rules) + "\n")
            remedies.append(Remedy(
                check=self.id,
                subject="udev",
                title=f"keep MaxReadReq {target} when the devices are added at boot",
                persistent=(
                    WriteFile(UDEV_RULE, content),
                    RunCommand(("udevadm", "control", "--reload-rules"), after=(0,),
                               undo=("udevadm", "control", "--reload-rules"), optional=True),
                ),
            ))
        return remedies


def _sysfs_id(host: Host, address: str, name: str) -> str:
    value = (pci.read_file(host, f"{pci.PCI_DEVICES}/{address}/{name}") or "").strip().lower()
    return value if _ID.fullmatch(value) else ""
