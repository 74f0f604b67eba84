"""pcie.mrrs: PCIe Max Read Request Size and link training of GPUs and NICs.

A GPU or NIC fetching host memory by DMA splits every read into requests of at
most MaxReadReq bytes. BIOSes and the kernel often leave it at 512, which caps
host-to-device copy bandwidth (model loading, KV-cache offload, RDMA) well below
what a Gen5 x16 link can carry. The value is read from the PCI Express
capability in each device's config space, found by walking the capability list.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import pci
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.remediations.steps import (
    FixContext,
    Remedy,
    RunCommand,
    SetPciBits,
    WriteFile,
    evidence,
)

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
_FIX_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ID = re.compile(r"0x[0-9a-f]{4}")


class _NotJudged(enum.Enum):
    """Why a GPU or network function yields no finding of its own."""

    NOT_PCIE = "no PCI Express capability"
    NOT_ENDPOINT = "not an endpoint"


_NOT_PCIE, _NOT_ENDPOINT = _NotJudged.NOT_PCIE, _NotJudged.NOT_ENDPOINT


def is_judged_class(class_code: int) -> bool:
    """Return whether a class code is a GPU, accelerator or network controller."""
    return (class_code >> 8) in GPU_CLASSES or (class_code >> 16) == NETWORK_BASE_CLASS


def is_gpu_class(class_code: int) -> bool:
    """Return whether a class code is a GPU or accelerator."""
    return (class_code >> 8) in GPU_CLASSES


@dataclass(frozen=True)
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
    reads: ClassVar[tuple[str, ...]] = (
        "/sys/bus/pci/devices/*",
        "/sys/bus/pci/devices/*/class",
        "/sys/bus/pci/devices/*/config",
        "/sys/bus/pci/devices/*/vendor",
        "/sys/bus/pci/devices/*/device",
        "/sys/bus/pci/devices/*/driver",
        "/sys/bus/pci/devices/*/physfn",
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
        findings: list[Finding] = []
        candidates = not_pcie = not_endpoint = 0
        for address in pci.pci_addresses(host):
            # The sysfs class file first: config space is read only for the devices judged.
            class_code = pci.device_class(host, address)
            if class_code is None or not is_judged_class(class_code):
                continue
            if pci.is_virtual_function(host, address):
                # A VF's MaxReadReq field is reserved: its physical function's value applies.
                continue
            candidates += 1
            config = pci.read_config(host, address)
            judged = self._judge_device(host, address, class_code, config, target)
            if isinstance(judged, list):
                findings.extend(judged)
            elif judged is _NOT_PCIE:
                not_pcie += 1
            else:
                not_endpoint += 1
        if findings:
            yield from findings
            return
        detail = ""
        if candidates:
            detail = (
                f" ({candidates} GPU or network function(s): {not_pcie} without a PCI Express "
                f"capability, {not_endpoint} not endpoints)"
            )
        yield self.skipped("pcie", f"no GPU or network PCIe endpoints{detail}")

    def _judge_device(
        self, host: Host, address: str, class_code: int, config: bytes | None, target: int
    ) -> list[Finding] | _NotJudged:
        ids = pci.device_ids(host, address, config)
        vendor = pci.vendor_name(ids[0] if ids else None)
        kind = "GPU" if is_gpu_class(class_code) else "network controller"
        what = f"{vendor} {kind}"
        driver = pci.driver_name(host, address)
        evidence = {"class": f"{class_code:#08x}", "driver": driver}
        if ids:
            evidence["vendor"] = f"{ids[0]:#06x}"
            evidence["device"] = f"{ids[1]:#06x}"
        if config is None:
            return [self.skipped(address, f"{what}: its config space cannot be read",
                                 evidence=evidence)]
        try:
            cap = pci.decode_pcie_capability(config)
        except pci.NeedsRoot:
            why = host.privilege_note or f"config space readable only to {len(config)} bytes"
            return [self.skipped(
                address, f"{what}: the PCI Express capability was not read (needs root: {why})",
                evidence=evidence,
            )]
        except pci.ConfigSpaceError as exc:
            return [self.skipped(address, f"{what}: {exc}", evidence=evidence)]
        if cap is None:
            return _NOT_PCIE
        if not cap.is_endpoint:
            # Bridges, root ports and switch ports forward requests; their MaxReadReq is unused.
            return _NOT_ENDPOINT
        speed, max_speed = pci.link_speed_name(cap.link_speed), pci.link_speed_name(
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
        return [verdict, *self._judge_link(address, what, class_code, cap, link, evidence)]

    def _judge_link(
        self, address: str, what: str, class_code: int, cap: pci.PcieCapability, link: str,
        evidence: dict[str, str],
    ) -> Iterator[Finding]:
        # A downtrained link is a warning, not a failure: software cannot fix it (it wants a
        # reseat, a riser or a BIOS bifurcation change), and fix scripts act on failures.
        problems: list[str] = []
        if cap.link_width and cap.max_link_width and cap.link_width < cap.max_link_width:
            problems.append(f"trained to x{cap.link_width} of x{cap.max_link_width} lanes")
        # GPUs drop their link speed when idle; a NIC's link runs at the speed it trained to.
        if (
            not is_gpu_class(class_code)
            and cap.link_speed
            and cap.max_link_speed
            and cap.link_speed < cap.max_link_speed
        ):
            problems.append(
                f"running at {pci.link_speed_name(cap.link_speed)} of "
                f"{pci.link_speed_name(cap.max_link_speed)}"
            )
        if problems:
            yield self.warned(
                address,
                f"{what}: PCIe link {' and '.join(problems)}; {link}",
                observed=f"{pci.link_speed_name(cap.link_speed)} x{cap.link_width}",
                expected=f"{pci.link_speed_name(cap.max_link_speed)} x{cap.max_link_width}",
                evidence={**evidence, "problem": "link"}, aspect="link",
            )

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Set MaxReadReq on each device found short, and add a udev rule that keeps it."""
        target = self.options.min_read_request_bytes
        value, mask = mrrs_setpci_value(target).split(":")
        remedies: list[Remedy] = []
        rules: list[str] = []
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
    value = (host.read_optional(f"{pci.PCI_DEVICES}/{address}/{name}") or "").lower()
    return value if _ID.fullmatch(value) else ""
