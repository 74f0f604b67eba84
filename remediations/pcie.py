"""pcie.mrrs: raise PCIe Max_Read_Request_Size to 4096 bytes, now and at every device add."""

from __future__ import annotations

import re
from collections.abc import Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from remediations.base import Context, Remedy, RunCommand, SetPciBits, WriteFile, evidence

#: Device Control is CAP_EXP+08; MaxReadReq is bits 14:12 and 5 encodes 4096 bytes.
#: The mask leaves MaxPayload (bits 7:5) and every other bit as the device has them.
REGISTER = "CAP_EXP+08.w"
VALUE = "5000"
MASK = "7000"
UDEV_RULE = "/etc/udev/rules.d/99-host-auditor-pcie-mrrs.rules"

READS: tuple[str, ...] = ("/sys/bus/pci/devices/*/vendor", "/sys/bus/pci/devices/*/device",
                          "/etc/os-release")

_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ID = re.compile(r"0x[0-9a-f]{4}")


def _id(host: Host, address: str, name: str) -> str:
    value = (host.read_optional(f"/sys/bus/pci/devices/{address}/{name}") or "").lower()
    return value if _ID.fullmatch(value) else ""


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Set MaxReadReq to 4096 on each device found short, and add a udev rule that keeps it."""
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
        if not _ADDRESS.fullmatch(address) or ev.get("problem", "mrrs") != "mrrs":
            continue
        match = ['ACTION=="add"', 'SUBSYSTEM=="pci"', f'KERNEL=="{address}"']
        vendor, device = ev.get("vendor", "").lower(), ev.get("device", "").lower()
        if not (_ID.fullmatch(vendor) and _ID.fullmatch(device)):
            vendor, device = _id(host, address, "vendor"), _id(host, address, "device")
        if vendor and device:
            match += [f'ATTR{{vendor}}=="{vendor}"', f'ATTR{{device}}=="{device}"']
        rules.append(", ".join(match) + f', RUN+="{setpci} -s $kernel {REGISTER}={VALUE}:{MASK}"')
        remedies.append(Remedy(
            check="pcie.mrrs",
            subject=address,
            title=f"MaxReadReq 4096 on {address}",
            runtime=(SetPciBits(address, REGISTER, VALUE, MASK),),
        ))
    if rules:
        content = ("# Written by host-auditor: PCIe MaxReadReq 4096 (MaxPayload untouched).\n"
                   + "\n".join(rules) + "\n")
        remedies.append(Remedy(
            check="pcie.mrrs",
            subject="udev",
            title="keep MaxReadReq 4096 when the devices are added at boot",
            persistent=(
                WriteFile(UDEV_RULE, content),
                RunCommand(("udevadm", "control", "--reload-rules"), after=(0,),
                           undo=("udevadm", "control", "--reload-rules"), optional=True),
            ),
        ))
    return remedies
