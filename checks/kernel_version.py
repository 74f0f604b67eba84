"""kernel.version: the running kernel against a minimum, a pending reboot, the NVIDIA driver.

Two subjects: ``kernel`` (the running release against the policy minimum, and a
newer installed kernel that waits for a reboot) and ``nvidia-driver`` (Blackwell
GPUs need NVIDIA's open kernel module, R570 or newer).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import pci
from auditor.errors import PolicyError
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import version_tuple
from auditor.remediations.steps import Advice, FixContext, Remedy, evidence, safe_word

OSRELEASE = "/proc/sys/kernel/osrelease"
PROC_VERSION = "/proc/version"
OS_RELEASE = "/etc/os-release"
#: Where installed kernels leave their names: images in /boot, module trees in
#: /lib/modules (/usr/lib/modules on merged-/usr and on distributions that keep
#: the image there too).
KERNEL_IMAGES = "/boot/vmlinuz-*"
MODULE_DIRS = ("/lib/modules/*", "/usr/lib/modules/*")
NVIDIA_PROC_VERSION = "/proc/driver/nvidia/version"
NVIDIA_MODULE_VERSION = "/sys/module/nvidia/version"
NVIDIA_MODULE_TAINT = "/sys/module/nvidia/taint"

NVIDIA_VENDOR = 0x10DE
#: Device-id ranges of NVIDIA's Blackwell GPUs, by chip, from the PCI ID database
#: (pci-ids.ucw.cz) and the supported-GPU list of NVIDIA's open kernel modules:
#:   0x2900-0x29ff  GB100 / GB102: B200 (0x2901), GB200 (0x2941), B100 (0x29bc)
#:   0x2b00-0x2bff  GB202: RTX 5090 (0x2b85), RTX PRO 6000 Blackwell (0x2bb1...);
#:                  also GB10B Jetson Thor (0x2b00)
#:   0x2c00-0x2cff  GB203: RTX 5080 (0x2c02), RTX 5070 Ti (0x2c05), laptop parts
#:   0x2d00-0x2dff  GB206 / GB207: RTX 5060 Ti (0x2d04), RTX 5060 (0x2d05), RTX 5050
#:   0x2e00-0x2eff  GB10: DGX Spark / GB10 Grace Blackwell (0x2e12)
#:   0x2f00-0x2fff  GB205: RTX 5070 (0x2f04), laptop parts
#:   0x3100-0x31ff  GB110 (Blackwell Ultra): B300 (0x3182), GB300 (0x31c2, 0x31c3)
BLACKWELL_DEVICE_RANGES = (
    (0x2900, 0x29FF),
    (0x2B00, 0x2BFF),
    (0x2C00, 0x2CFF),
    (0x2D00, 0x2DFF),
    (0x2E00, 0x2EFF),
    (0x2F00, 0x2FFF),
    (0x3100, 0x31FF),
)

#: "NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." (open) and
#: "NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ..." (proprietary).
_NVRM_VERSION = re.compile(r"\s(\d+\.\d+(?:\.\d+)?)\b")
#: Lines of /proc/driver/nvidia/version looked at (the driver's line is the first).
_NVRM_LINES = 16
_DRIVER_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
_PROC_VERSION = re.compile(r"Linux version (\S+)")
_RELEASE = re.compile(r"[0-9][A-Za-z0-9._+~-]*", re.ASCII)
#: Drivers that hold a GPU for a virtual machine: no host driver is expected then.
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})


def _nvrm(text: str) -> tuple[str, str] | None:
    """Return (version, "open" or "proprietary") from the NVRM line, in linear time.

    The line reads "NVIDIA UNIX [Open ]... Kernel Module ... <version> ..."; a version is
    the first blank-led ``N.N[.N]`` after the first whole-word "Kernel Module" (only the
    first occurrence of each needs a look: a later one sees less of the line).
    """
    lines = text.split("\n", _NVRM_LINES)[:_NVRM_LINES]
    for number, line in enumerate(lines):
        at = line.find("NVIDIA UNIX ")
        if at < 0:
            continue
        rest = line[at + len("NVIDIA UNIX "):]
        module = rest.find("Kernel Module")
        while module >= 0:
            after = module + len("Kernel Module")
            if after >= len(rest) or not (rest[after].isalnum() or rest[after] == "_"):
                break
            module = rest.find("Kernel Module", after)
        if module < 0:
            continue
        # The blank before the version may be the line's newline (the version then starts
        # the next line), never anything further on.
        tail = rest[module + len("Kernel Module"):]
        following = lines[number + 1] if number + 1 < len(lines) else None
        found = _NVRM_VERSION.search(tail if following is None else f"{tail}\n{following}")
        if found is not None and found.start() <= len(tail):
            return found.group(1), "open" if rest.startswith("Open ") else "proprietary"
    return None




def is_blackwell(device_id: int) -> bool:
    """Return whether an NVIDIA device id is a Blackwell GPU."""
    return any(low <= device_id <= high for low, high in BLACKWELL_DEVICE_RANGES)


def running_kernel(host: Host) -> str | None:
    """Return the running kernel release, from osrelease or else /proc/version."""
    release = host.read_optional(OSRELEASE)
    if release:
        release = release.split()[0]
    else:
        match = _PROC_VERSION.search(host.read_optional(PROC_VERSION) or "")
        release = match.group(1) if match else ""
    return release if _RELEASE.fullmatch(release) else None


def installed_kernels(host: Host) -> list[str]:
    """Return the kernel releases installed in /boot and the module directories."""
    releases: set[str] = set()
    for path in host.glob(KERNEL_IMAGES):
        releases.add(path.rsplit("/", 1)[1].removeprefix("vmlinuz-"))
    for pattern in MODULE_DIRS:
        releases.update(path.rsplit("/", 1)[1] for path in host.glob(pattern) if host.is_dir(path))
    # A name must look like a release to count: it ends up in messages and fix lines, so a
    # hostile one ("6.99$(reboot)", a newline) is dropped; vmlinuz-0-rescue-<id> starts
    # with "0" and never compares newer.
    return sorted(r for r in releases if _RELEASE.fullmatch(r) and version_tuple(r))


def newest_installed(running: str, installed: Iterable[str]) -> str | None:
    """Return the newest installed release newer than the running one, or None."""
    current = version_tuple(running)
    newer = [r for r in installed if version_tuple(r) > current]
    return max(newer, key=lambda r: (version_tuple(r), r)) if newer else None


def os_release_id(host: Host) -> str:
    """Return the ID from /etc/os-release (``debian``, ``ubuntu``), or an empty string."""
    for line in (host.read_optional(OS_RELEASE) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ID":
            value = value.strip().strip("\"'")
            return value if re.fullmatch(r"[a-z0-9._-]+", value) else ""
    return ""


def nvidia_driver(host: Host) -> tuple[str, str] | None:
    """Return the loaded NVIDIA driver as (version, flavour), or None if none is loaded.

    The flavour is ``open``, ``proprietary`` or ``unknown``.
    """
    text = host.read_optional(NVIDIA_PROC_VERSION)
    if text:
        parsed = _nvrm(text)
        if parsed is not None:
            return parsed
    module_version = host.read_optional(NVIDIA_MODULE_VERSION)
    if not module_version:
        return None
    match = _DRIVER_VERSION.match(module_version)
    if match is None:
        return None
    # The proprietary module is not GPL-compatible and taints the kernel with P; the open
    # one (Dual MIT/GPL) leaves only O and E.
    taint = host.read_optional(NVIDIA_MODULE_TAINT)
    if taint is None:
        flavour = "unknown"
    else:
        flavour = "proprietary" if "P" in taint else "open"
    return match.group(0), flavour


def nvidia_gpus(host: Host) -> list[tuple[str, int, str]]:
    """Return the NVIDIA display-class devices as (address, device id, driver)."""
    found: list[tuple[str, int, str]] = []
    for address in pci.pci_addresses(host):
        class_code = pci.device_class(host, address)
        if class_code is None or class_code >> 16 != 0x03:
            continue
        ids = pci.device_ids(host, address)
        if ids is None or ids[0] != NVIDIA_VENDOR:
            continue
        found.append((address, ids[1], pci.driver_name(host, address)))
    return found


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


@dataclass(frozen=True)
class KernelOptions(CheckOptions):
    """Options of ``kernel.version``."""

    minimum: str = option("6.14", help="the oldest kernel release that passes (e.g. 6.14)")
    blackwell_min_driver: str = option(
        "570", help="the oldest NVIDIA driver branch that supports Blackwell GPUs")

    def validate(self, where: str) -> None:
        """Both values must read as versions."""
        for name in ("minimum", "blackwell_min_driver"):
            value = getattr(self, name)
            if not version_tuple(value):
                raise PolicyError(f"{where}.{name} must be a version such as 6.14, got "
                                  f"{value!r}")


class KernelVersion(Check[KernelOptions]):
    """The running kernel must be recent enough, and Blackwell GPUs need the open R570+ driver."""

    id: ClassVar[str] = "kernel.version"
    severity: ClassVar[Severity] = Severity.MEDIUM
    reads: ClassVar[tuple[str, ...]] = (
        OSRELEASE,
        PROC_VERSION,
        OS_RELEASE,
        KERNEL_IMAGES,
        *MODULE_DIRS,
        NVIDIA_PROC_VERSION,
        NVIDIA_MODULE_VERSION,
        NVIDIA_MODULE_TAINT,
        "/sys/bus/pci/devices/*",
        "/sys/bus/pci/devices/*/class",
        "/sys/bus/pci/devices/*/vendor",
        "/sys/bus/pci/devices/*/device",
        "/sys/bus/pci/devices/*/driver",
    )
    rationale: ClassVar[str] = (
        "Recent kernels carry the fixes and features inference hosts lean on (HMM and "
        "device-memory migration, io_uring, NUMA and scheduler fixes, support for the newest "
        "CPUs, NICs and GPUs). A newer kernel that is installed but not booted is a fix that "
        "has not landed. NVIDIA Blackwell GPUs are supported only by the open kernel modules, "
        "from driver branch R570 on."
    )
    remedy: ClassVar[str] = (
        "Install the distribution's newer kernel series (HWE on Ubuntu, backports on Debian, "
        "proxmox-kernel-6.14 or newer on Proxmox) and reboot into it. For Blackwell, install "
        "the open flavour of a R570 or newer NVIDIA driver (nvidia-driver-5xx-open, or "
        "NVIDIA's installer with -m=kernel-open)."
    )
    options_type: ClassVar[type[CheckOptions]] = KernelOptions
    fix_reads: ClassVar[tuple[str, ...]] = ("/proc/cpuinfo",)
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        distro = os_release_id(host)
        running = running_kernel(host)
        yield self._judge_kernel(host, running, distro)
        yield self._judge_driver(host, running or "", distro)

    def _judge_kernel(self, host: Host, running: str | None, distro: str) -> Finding:
        minimum = self.options.minimum
        wanted = version_tuple(minimum)
        evidence = {"running": running or "", "minimum": minimum, "distro": distro}
        if not running or not version_tuple(running):
            return self.skipped(
                "kernel",
                f"the running kernel release cannot be read from {OSRELEASE} or {PROC_VERSION}",
                evidence=evidence,
            )
        pending = newest_installed(running, installed_kernels(host))
        if pending:
            evidence["installed_newer"] = pending
        if version_tuple(running) < wanted:
            then, fix = "", f"install a kernel >= {minimum} and reboot"
            if pending and version_tuple(pending) >= wanted:
                then, fix = f"; {pending} is installed: reboot into it", f"reboot into {pending}"
            elif pending:
                then = f"; the newest installed, {pending}, is below {minimum} too"
            return self.failed(
                "kernel",
                f"running kernel {running} is older than {minimum}{then}",
                observed=running, expected=f">= {minimum}", fix=fix, evidence=evidence,
            )
        if pending:
            return self.warned(
                "kernel",
                f"reboot pending: kernel {pending} is installed but {running} is running",
                observed=running, expected=pending, fix=f"reboot into {pending}",
                evidence=evidence,
            )
        return self.passed(
            "kernel", f"running kernel {running} is at or above {minimum}",
            observed=running, expected=f">= {minimum}", evidence=evidence,
        )

    def _judge_driver(self, host: Host, running: str, distro: str) -> Finding:
        branch = self.options.blackwell_min_driver
        gpus = nvidia_gpus(host)
        blackwell = [(a, d) for a, d, _ in gpus if is_blackwell(d)]
        driver = nvidia_driver(host)
        evidence = {
            "running": running,
            "distro": distro,
            "gpus": str(len(gpus)),
            "blackwell": " ".join(f"{a}={d:#06x}" for a, d in blackwell),
        }
        if driver is None:
            if not gpus:
                return self.skipped(
                    "nvidia-driver", "no NVIDIA driver loaded and no NVIDIA GPU", evidence=evidence
                )
            held = [a for a, _, drv in gpus if drv in PASSTHROUGH_DRIVERS]
            if len(held) == len(gpus):
                return self.skipped(
                    "nvidia-driver",
                    f"{len(gpus)} NVIDIA GPU(s) bound to a passthrough driver "
                    f"({', '.join(sorted({drv for _, _, drv in gpus}))}): no host driver expected",
                    evidence=evidence,
                )
            return self.warned(
                "nvidia-driver",
                f"{len(gpus)} NVIDIA GPU(s) but no NVIDIA driver is loaded",
                observed="no driver", expected="nvidia driver loaded", evidence=evidence,
            )
        version, flavour = driver
        evidence.update(version=version, flavour=flavour)
        described = f"NVIDIA driver {version} ({flavour} kernel module)"
        if not blackwell:
            return self.passed(
                "nvidia-driver",
                f"{described}; no Blackwell GPU among {len(gpus)} NVIDIA GPU(s)",
                observed=f"{version} {flavour}", evidence=evidence,
            )
        expected = f"open kernel module, >= {branch}"
        problems: list[str] = []
        if flavour == "proprietary":
            problems.append("Blackwell GPUs are supported only by the open kernel module")
        if version_tuple(version) < version_tuple(branch):
            problems.append(f"Blackwell needs driver branch R{branch} or newer")
        if problems:
            return self.failed(
                "nvidia-driver",
                f"{described} with {len(blackwell)} Blackwell GPU(s): {'; '.join(problems)}",
                observed=f"{version} {flavour}", expected=expected,
                fix=f"install the open NVIDIA kernel module, driver {branch} or newer",
                evidence=evidence,
            )
        if flavour == "unknown":
            return self.skipped(
                "nvidia-driver",
                f"{described} with {len(blackwell)} Blackwell GPU(s): cannot tell whether the "
                "open or the proprietary module is loaded",
                evidence=evidence,
            )
        return self.passed(
            "nvidia-driver",
            f"{described} supports its {len(blackwell)} Blackwell GPU(s)",
            observed=f"{version} {flavour}", expected=expected, evidence=evidence,
        )

    # -- the fix (advice only: a kernel is the operator's choice) ------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
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
                    advice.append(Advice(f"install a kernel >= {minimum} with this "
                                         "distribution's tools, then reboot"))
                remedies.append(Remedy(
                    check=self.id, subject="kernel",
                    title=f"kernel {running} is older than {minimum}",
                    advice=tuple(advice), reboot=True,
                ))
            elif finding.subject == "nvidia-driver":
                flavour = ev.get("flavour", "")
                remedies.append(Remedy(
                    check=self.id, subject="nvidia-driver",
                    title=f"NVIDIA driver {ev.get('version', finding.observed)} is older than "
                          f"{minimum}",
                    advice=(Advice(f"install the NVIDIA {flavour} driver >= {minimum} from "
                                   "the same source as the current one, then reboot"),),
                    reboot=True,
                ))
        return remedies
