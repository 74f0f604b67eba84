"""kernel.version: the distribution's kernel upgrade, written commented out (opt-in)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from auditor.parsing import version_tuple
from remediations.base import Advice, Context, Remedy, evidence, safe_word

READS: tuple[str, ...] = ("/etc/os-release", "/proc/sys/kernel/osrelease", "/proc/cpuinfo")

RHEL_LIKE = {"rhel", "centos", "rocky", "almalinux", "fedora", "ol"}


def _codename(os_release: Mapping[str, str]) -> str:
    """Return the codename a release names in parentheses (``12 (bookworm)``), or ""."""
    for key in ("VERSION", "PRETTY_NAME"):
        match = re.search(r"\(([a-z]+)\)", os_release.get(key, ""))
        if match:
            return match.group(1)
    return ""


def upgrade_command(
    running: str, minimum: str, os_release: Mapping[str, str], arch: str = "amd64"
) -> tuple[str, ...]:
    """Return the command that installs a newer kernel on this distribution, or ()."""
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    wanted = version_tuple(minimum)
    if running.endswith("-pve") or "pve" in os_release.get("NAME", "").lower():
        series = ".".join(str(n) for n in (wanted[:2] if len(wanted) >= 2 else (6, 14)))
        return ("apt", "install", f"proxmox-kernel-{series}")
    if os_release.get("ID") == "ubuntu" or "ubuntu" in ids:
        version = os_release.get("VERSION_ID", "")
        if safe_word(version):
            return ("apt", "install", "--install-recommends", f"linux-generic-hwe-{version}")
        return ()
    if "debian" in ids:
        codename = os_release.get("VERSION_CODENAME", "") or _codename(os_release)
        if safe_word(codename):
            return ("apt", "install", "-t", f"{codename}-backports", f"linux-image-{arch}")
        return ()
    if ids & RHEL_LIKE:
        return ("dnf", "install", "kernel")
    return ()


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Advise the kernel (or NVIDIA driver) upgrade; nothing runs unless uncommented."""
    remedies: list[Remedy] = []
    cpuinfo = host.read_optional("/proc/cpuinfo") or ""
    arch = "arm64" if "CPU implementer" in cpuinfo and "vendor_id" not in cpuinfo else "amd64"
    for finding in findings:
        ev = evidence(finding)
        minimum = ev.get("minimum", finding.expected)
        if finding.subject == "kernel":
            running = ev.get("running", finding.observed)
            advice: list[Advice] = []
            newer = ev.get("installed_newer", "")
            if newer:
                advice.append(Advice(f"kernel {newer} is installed already: reboot into it"))
            enough = bool(newer) and version_tuple(newer) >= version_tuple(minimum)
            command = upgrade_command(running, minimum, context.os_release, arch)
            if enough:
                pass
            elif command:
                advice.append(Advice(f"install a kernel >= {minimum}, then reboot", command))
            else:
                advice.append(Advice(f"install a kernel >= {minimum} with this distribution's "
                                     "tools, then reboot"))
            remedies.append(Remedy(
                check="kernel.version", subject="kernel",
                title=f"kernel {running} is older than {minimum}",
                advice=tuple(advice), reboot=True,
            ))
        elif finding.subject == "nvidia-driver":
            flavour = ev.get("flavour", "")
            remedies.append(Remedy(
                check="kernel.version", subject="nvidia-driver",
                title=f"NVIDIA driver {ev.get('version', finding.observed)} is older than "
                      f"{minimum}",
                advice=(Advice(f"install the NVIDIA {flavour} driver >= {minimum} from the "
                               "same source as the current one, then reboot"),),
                reboot=True,
            ))
    return remedies
