"""Installed kernels: their line, the one the next boot picks, and the GPU modules each carries.

Shared by ``kernel.version`` (a kernel judged by its line; the next boot must find the GPU
driver's module) and ``nvidia.driver`` (the module on disk against the loaded one).

A kernel's *line* is who maintains it and how it is versioned: Ubuntu's flavours
(``6.8.0-45-generic``, ``6.8.0-1017-nvidia``, ``-nvidia-64k``, ``-aws``...), RHEL and its
rebuilds (``5.14.0-570.23.1.el9_6.x86_64``, heavily backported: the upstream number says
little), Debian (``6.1.0-28-amd64``), Proxmox (``6.14.8-2-pve``), and vanilla builds.

Which kernel boots next: GRUB's ``10_linux`` lists ``/boot/vmlinuz-*`` newest first
(``version_sort -r``), so ``GRUB_DEFAULT=0`` picks the newest; ``saved`` picks what grubenv's
``saved_entry`` names; BLS/grubby keeps ``saved_entry=<machine-id>-<release>``;
proxmox-boot-tool boots the newest unless ``/etc/kernel/proxmox-boot-pin`` (or the one-shot
``/etc/kernel/next-boot-pin``) names one.

Which modules a kernel carries: its ``modules.dep``, which ``depmod`` writes and ``modprobe``
reads (a module missing there does not load, whatever file lies on disk), and DKMS's
``/var/lib/dkms/<module>/<version>/<release>`` trees and ``kernel-<release>-<arch>`` links
(what DKMS built and installed, and which version).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host
from auditor.parsing import lazy_re, version_tuple

OSRELEASE = "/proc/sys/kernel/osrelease"
PROC_VERSION = "/proc/version"
KERNEL_IMAGES = "/boot/vmlinuz-*"
MODULE_ROOTS = ("/lib/modules", "/usr/lib/modules")
MODULE_DIRS = tuple(f"{root}/*" for root in MODULE_ROOTS)
MODULES_DEP = tuple(f"{root}/*/modules.dep" for root in MODULE_ROOTS)
DKMS = "/var/lib/dkms"
GRUB_DEFAULT_FILE = "/etc/default/grub"
GRUBENV = ("/boot/grub/grubenv", "/boot/grub2/grubenv")
PVE_PIN = "/etc/kernel/proxmox-boot-pin"
PVE_NEXT_PIN = "/etc/kernel/next-boot-pin"
#: The GPU drivers whose modules a boot needs, by driver name.
GPU_DRIVERS = ("nvidia", "amdgpu")

#: What :func:`installed_kernels` and :func:`running_kernel` read.
RELEASE_READS: tuple[str, ...] = (OSRELEASE, PROC_VERSION, KERNEL_IMAGES, *MODULE_DIRS)
#: What :func:`next_boot` reads beyond those.
NEXT_BOOT_READS: tuple[str, ...] = (GRUB_DEFAULT_FILE, *GRUBENV, PVE_PIN, PVE_NEXT_PIN)
#: What :func:`gpu_modules` reads.
MODULE_READS: tuple[str, ...] = (
    *MODULES_DEP,
    *(f"{DKMS}/{driver}/*" for driver in GPU_DRIVERS),
    *(f"{DKMS}/{driver}/*/*" for driver in GPU_DRIVERS),
)

_PROC_VERSION = lazy_re(r"Linux version (\S{1,200})")
_RELEASE = lazy_re(r"[0-9][A-Za-z0-9._+~-]{0,127}", re.ASCII)
#: modules.dep can be large on distribution kernels (~0.5 MiB); read at most this much.
_DEP_LIMIT = 8 << 20


def is_release(text: str) -> bool:
    """Return whether ``text`` looks like a kernel release (safe for messages and commands)."""
    return _RELEASE.fullmatch(text) is not None and bool(version_tuple(text))


def running_kernel(host: Host) -> str | None:
    """Return the running kernel release, from osrelease or else /proc/version."""
    release = files.read_optional(host, OSRELEASE)
    if release:
        release = release.split()[0] if release.split() else ""
    else:
        match = _PROC_VERSION.search((files.read_optional(host, PROC_VERSION) or "")[:512])
        release = match.group(1) if match else ""
    return release if _RELEASE.fullmatch(release) else None


def installed_kernels(host: Host) -> list[str]:
    """Return the kernel releases installed in /boot and the module directories."""
    releases: set[str] = set()
    for path in host.glob(KERNEL_IMAGES)[:256]:
        releases.add(path.rsplit("/", 1)[1].removeprefix("vmlinuz-"))
    for pattern in MODULE_DIRS:
        releases.update(path.rsplit("/", 1)[1] for path in host.glob(pattern)[:256]
                        if host.is_dir(path))
    # A name must look like a release to count: it ends up in messages and fix lines, so a
    # hostile one ("6.99$(reboot)", a newline) is dropped; vmlinuz-0-rescue-<id> starts
    # with "0" and never compares newer.
    return sorted(r for r in releases if is_release(r))


def booted_images(host: Host) -> list[str]:
    """Return the releases that have a kernel image in /boot (what a boot loader can boot)."""
    return sorted(r for r in (p.rsplit("/", 1)[1].removeprefix("vmlinuz-")
                              for p in host.glob(KERNEL_IMAGES)[:256]) if is_release(r))


def sort_key(release: str) -> tuple[tuple[int, ...], str]:
    """Return the key that orders releases as GRUB's version sort does, closely enough."""
    return version_tuple(release), release


def newest_installed(running: str, installed: Iterable[str]) -> str | None:
    """Return the newest installed release newer than the running one, or None."""
    current = version_tuple(running)
    newer = [r for r in installed if version_tuple(r) > current]
    return max(newer, key=sort_key) if newer else None


# -- lines ------------------------------------------------------------------------------

#: Ubuntu kernel flavours (the part after the ABI number), longest first.
UBUNTU_FLAVOURS = (
    "nvidia-lowlatency-64k", "nvidia-lowlatency", "nvidia-64k", "nvidia-tegra-igx",
    "nvidia-tegra", "nvidia", "generic-64k", "generic-lpae", "generic", "lowlatency-64k",
    "lowlatency", "realtime", "aws-64k", "aws-fips", "aws", "azure-fips", "azure-cvm",
    "azure", "gcp-fips", "gcp", "gke", "gkeop", "oracle-64k", "oracle", "ibm", "kvm",
    "oem", "raspi", "intel-iotg", "intel", "fips", "xilinx-zynqmp",
)
#: Cloud flavours: kernels a cloud image ships, maintained per cloud.
CLOUD_FLAVOURS = frozenset({"aws", "aws-64k", "aws-fips", "azure", "azure-fips", "azure-cvm",
                            "gcp", "gcp-fips", "gke", "gkeop", "oracle", "oracle-64k", "ibm",
                            "kvm"})
_UBUNTU = lazy_re(r"([0-9]{1,3})\.([0-9]{1,3})\.[0-9]{1,3}-([0-9]{1,6})-([a-z0-9-]{2,32})")
_DEBIAN = lazy_re(r"([0-9]{1,3})\.([0-9]{1,3})\.[0-9]{1,3}(?:\+bpo)?-(?:[0-9]{1,4}-)?"
                  r"((?:cloud-|rt-)?(?:amd64|arm64|686-pae|686))")
_EL = lazy_re(r"\.el([0-9]{1,2})(?:_([0-9]{1,2}))?(uek)?(?:\.|$)")
_FEDORA = lazy_re(r"\.fc([0-9]{1,3})(?:\.|$)")
_AMZN = lazy_re(r"\.amzn([0-9]{1,4})(?:\.|$)")
_PVE = lazy_re(r"([0-9]{1,3})\.([0-9]{1,3})\.[0-9]{1,3}-[0-9]{1,4}-pve")

#: Ubuntu LTS releases: the GA kernel series and the HWE series in the order they came.
#: The last HWE series is the one the ``linux-generic-hwe-<release>`` metapackage follows;
#: an earlier interim one is no longer maintained once the next one ships.
UBUNTU_SERIES: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "18.04": ("4.15", ("5.4",)),
    "20.04": ("5.4", ("5.15",)),
    "22.04": ("5.15", ("5.17", "5.19", "6.2", "6.5", "6.8")),
    "24.04": ("6.8", ("6.11", "6.14", "6.17")),
    "26.04": ("7.0", ()),
}
#: Debian releases and their kernel series.
DEBIAN_SERIES: Mapping[str, str] = {"bullseye": "5.10", "bookworm": "6.1", "trixie": "6.12"}


class KernelLine(NamedTuple):
    """The line a kernel release belongs to."""

    #: ``ubuntu-generic``, ``ubuntu-nvidia``, ``ubuntu-nvidia-64k``, ``ubuntu-aws``, ``el9``,
    #: ``el9-uek``, ``debian``, ``pve``, ``fedora``, ``amzn``, ``vanilla``.
    name: str
    #: The upstream series (``6.8``).
    series: str
    #: The distribution's minor stream where it has one (``el9_6`` -> ``6``).
    stream: str = ""
    flavour: str = ""

    @property
    def vendor(self) -> bool:
        """Return whether a vendor maintains the line (judged by its release, not the number)."""
        return self.name not in ("vanilla", "pve", "fedora")

    def describe(self) -> str:
        """Return the line in a few words."""
        words = {
            "pve": "Proxmox VE kernel", "vanilla": "upstream (vanilla) kernel",
            "debian": "Debian kernel", "fedora": "Fedora kernel", "amzn": "Amazon Linux kernel",
        }
        if self.name in words:
            return f"{words[self.name]} {self.series}"
        if self.name.startswith("ubuntu-"):
            return f"Ubuntu -{self.flavour} kernel {self.series}"
        if self.name.startswith("el"):
            minor = f"_{self.stream}" if self.stream else ""
            name = self.name.replace("-uek", " UEK")
            return f"{name} kernel {self.series} ({self.name[:4]}{minor})"
        return f"{self.name} kernel {self.series}"


def classify(release: str, os_release: Mapping[str, str]) -> KernelLine:
    """Return the line of a kernel release (the distribution's os-release helps tell apart)."""
    numbers = version_tuple(release)
    series = ".".join(str(n) for n in numbers[:2])
    if _PVE.fullmatch(release):
        return KernelLine("pve", series)
    el = _EL.search(release)
    if el:
        name = f"el{el.group(1)}" + ("-uek" if el.group(3) else "")
        return KernelLine(name, series, el.group(2) or "")
    if _FEDORA.search(release):
        return KernelLine("fedora", series)
    if _AMZN.search(release):
        return KernelLine("amzn", series)
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    ubuntu = _UBUNTU.fullmatch(release)
    if ubuntu and (ubuntu.group(4) in UBUNTU_FLAVOURS or "ubuntu" in ids):
        flavour = ubuntu.group(4)
        return KernelLine(f"ubuntu-{flavour}", series, flavour=flavour)
    debian = _DEBIAN.fullmatch(release)
    if debian:
        return KernelLine("debian", series, "bpo" if "+bpo" in release else "",
                          flavour=debian.group(3))
    return KernelLine("vanilla", series)


class Currency(NamedTuple):
    """Whether a vendor line's kernel is current for the distribution release it runs on."""

    current: bool
    why: str


def currency(line: KernelLine, os_release: Mapping[str, str]) -> Currency:
    """Judge a vendor kernel by its release: a series the release still ships, its stream."""
    version_id = os_release.get("VERSION_ID", "")
    if line.name == "ubuntu-generic" or line.name == "ubuntu-generic-64k":
        known = UBUNTU_SERIES.get(version_id)
        if known is None:
            return Currency(True, f"Ubuntu {version_id or '?'}: its kernel series are not "
                            "tabled here, judged current")
        ga, hwe = known
        if line.series == ga:
            return Currency(True, f"the GA kernel series of Ubuntu {version_id}")
        if hwe and line.series == hwe[-1]:
            return Currency(True, f"the current HWE kernel series of Ubuntu {version_id}")
        if line.series in hwe:
            return Currency(False, f"{line.series} is a superseded HWE series of Ubuntu "
                            f"{version_id} (the HWE kernel is {hwe[-1]} now)")
        if version_tuple(line.series) > version_tuple(hwe[-1] if hwe else ga):
            return Currency(True, f"newer than the series tabled for Ubuntu {version_id}")
        return Currency(False, f"{line.series} is not a kernel series of Ubuntu {version_id} "
                        f"(GA {ga}, HWE {', '.join(hwe) or 'none'})")
    if line.name.startswith("ubuntu-"):
        return Currency(True, f"a kernel line Canonical maintains ({line.flavour}), judged by "
                        "its line rather than its upstream number")
    if line.name.startswith("el") and not line.name.endswith("-uek"):
        major, _, minor = version_id.partition(".")
        if major and line.name[2:] != major:
            return Currency(False, f"an {line.name} kernel on a release {version_id} system")
        if line.stream and minor.isdigit() and int(line.stream) < int(minor):
            return Currency(False, f"a {line.name}_{line.stream} kernel on a {version_id} "
                            "system: the kernel stream is older than the release")
        return Currency(True, f"the {line.name} kernel stream of release {version_id or '?'}")
    if line.name == "debian":
        if line.stream == "bpo":
            return Currency(True, "a Debian backports kernel")
        codename = os_release.get("VERSION_CODENAME", "")
        expected = DEBIAN_SERIES.get(codename)
        if expected is None or line.series == expected:
            return Currency(True, f"the kernel series of Debian {codename or version_id or '?'}")
        if version_tuple(line.series) > version_tuple(expected):
            return Currency(True, f"newer than Debian {codename}'s {expected}")
        return Currency(False, f"{line.series} is older than Debian {codename}'s {expected}")
    return Currency(True, f"a {line.describe()}, maintained by its vendor")


# -- the next boot ------------------------------------------------------------------------


class NextBoot(NamedTuple):
    """The kernel the next boot will start, and how that was found."""

    release: str
    how: str


def _grub_default(host: Host) -> str:
    value = ""
    for line in (files.read_optional(host, GRUB_DEFAULT_FILE) or "").split("\n")[:512]:
        key, sep, rest = line.strip().partition("=")
        if sep and key == "GRUB_DEFAULT":
            value = rest.strip().strip("\"'")[:256]
    return value


def _saved_entry(host: Host) -> str:
    for path in GRUBENV:
        for line in (files.read_optional(host, path) or "").split("\n")[:64]:
            key, sep, value = line.partition("=")
            if sep and key == "saved_entry":
                return value[:512]
    return ""


def next_boot(host: Host, running: str, installed: Iterable[str]) -> NextBoot | None:
    """Return the kernel the next boot picks, or None when no kernel is installed."""
    images = booted_images(host) or sorted(installed)
    if not images:
        return None
    for pin, how in ((PVE_NEXT_PIN, "pinned for the next boot"),
                     (PVE_PIN, "pinned with proxmox-boot-tool")):
        pinned = (files.read_optional(host, pin) or "").strip()
        if pinned in images:
            return NextBoot(pinned, f"{how} ({pin})")
    newest = max(images, key=sort_key)
    default = _grub_default(host)
    if default == "saved" or not default:
        saved = _saved_entry(host)
        # grubenv names an entry: BLS "<machine-id>-<release>", GRUB ids holding the release.
        named = [r for r in images if saved.endswith(r) or f"-{r}-" in saved]
        if named:
            return NextBoot(max(named, key=len), "saved_entry in grubenv")
    return NextBoot(newest, "the newest installed kernel (boot loaders default to it)")


# -- GPU modules ----------------------------------------------------------------------------

_DKMS_VERSION = lazy_re(r"[0-9][A-Za-z0-9.+~-]{0,63}")
_BRANCH_DIR = lazy_re(r"nvidia-([0-9]{3,4})(?:[-a-z]{0,24})")


class GpuModule(NamedTuple):
    """A GPU driver's module as one kernel's modules.dep lists it."""

    driver: str
    release: str
    #: The path in modules.dep, relative to /lib/modules/<release>.
    path: str
    #: ``dkms``, ``precompiled`` (Ubuntu's linux-modules-nvidia-*), ``in-tree`` or ``vendor``.
    origin: str
    #: The driver version (from DKMS) or branch (from a precompiled tree), or "".
    version: str = ""


class ModuleSearch(NamedTuple):
    """What one kernel carries of a GPU driver."""

    release: str
    #: modules.dep was read (False: depmod never ran, or the tree is missing).
    indexed: bool
    modules: tuple[GpuModule, ...] = ()
    #: DKMS versions built for this kernel (whether installed or not).
    dkms_built: tuple[str, ...] = ()
    #: The DKMS version installed into this kernel (``kernel-<release>-<arch>`` link).
    dkms_installed: str = ""


def _modules_dep(host: Host, release: str) -> str | None:
    for root in MODULE_ROOTS:
        text = files.read_text(host, f"{root}/{release}/modules.dep", _DEP_LIMIT)
        if text is not None:
            return text
    return None


def _origin(path: str, driver: str) -> tuple[str, str]:
    if path.startswith("updates/dkms/"):
        return "dkms", ""
    match = _BRANCH_DIR.search(path)
    if driver == "nvidia" and path.startswith("kernel/nvidia-") and match:
        return "precompiled", match.group(1)
    if driver == "amdgpu" and path.startswith("kernel/drivers/gpu/"):
        return "in-tree", ""
    return "vendor", ""


def dkms_versions(host: Host, driver: str) -> list[str]:
    """Return the DKMS source versions of a driver (``/var/lib/dkms/nvidia/<version>``)."""
    found: list[str] = []
    for path in host.glob(f"{DKMS}/{driver}/*")[:64]:
        name = path.rsplit("/", 1)[1]
        if _DKMS_VERSION.fullmatch(name) and host.readlink(path) is None and host.is_dir(path):
            found.append(name)
    return sorted(found, key=version_tuple)


def gpu_modules(host: Host, release: str, driver: str) -> ModuleSearch:
    """Return what kernel ``release`` carries of GPU driver ``driver`` (``nvidia``, ``amdgpu``)."""
    text = _modules_dep(host, release)
    built = tuple(v for v in dkms_versions(host, driver)
                  if host.is_dir(f"{DKMS}/{driver}/{v}/{release}"))
    installed = ""
    for path in host.glob(f"{DKMS}/{driver}/kernel-{release}-*")[:8]:
        target = host.readlink(path) or ""
        version = target.strip("/").split("/", 1)[0]
        if _DKMS_VERSION.fullmatch(version):
            installed = version
    if text is None:
        return ModuleSearch(release, False, (), built, installed)
    modules: list[GpuModule] = []
    names = (f"/{driver}.ko", f"/{driver}.ko.xz", f"/{driver}.ko.zst", f"/{driver}.ko.gz")
    start = 0
    # Only lines naming the module are looked at: find() walks the text once per hit.
    while len(modules) < 16:
        at = text.find(f"{driver}.ko", start)
        if at < 0:
            break
        line_start = text.rfind("\n", 0, at) + 1
        line_end = text.find("\n", at)
        line = text[line_start: line_end if line_end >= 0 else len(text)]
        start = line_end + 1 if line_end >= 0 else len(text)
        path = line.split(":", 1)[0].strip()[:512]
        if not path.endswith(names) and "/" + path not in names:
            continue
        origin, version = _origin(path, driver)
        if origin == "dkms":
            version = installed or (built[-1] if built else "")
        modules.append(GpuModule(driver, release, path, origin, version))
    return ModuleSearch(release, True, tuple(modules), built, installed)


# -- the machine and the kernel's build configuration -----------------------------------

CPUINFO = "/proc/cpuinfo"
KERNEL_CONFIGS = "/boot/config-*"
_CONFIG_LINE = lazy_re(r"(CONFIG_[A-Z0-9_]{1,80})=(.{0,256})")
_NOT_SET = lazy_re(r"# (CONFIG_[A-Z0-9_]{1,80}) is not set")


def machine(host: Host) -> str:
    """Return ``x86_64``, ``aarch64`` or "" from /proc/cpuinfo."""
    text = (files.read_optional(host, CPUINFO) or "")[:65536]
    if "vendor_id" in text:
        return "x86_64"
    if "CPU implementer" in text:
        return "aarch64"
    return ""


def kernel_config(host: Host, release: str) -> dict[str, str] | None:
    """Return the build options of kernel ``release`` (``y``, ``m``, ``n`` for "not set").

    None when ``/boot/config-<release>`` is missing (NixOS, custom builds).
    """
    if not is_release(release):
        return None
    text = files.read_text(host, f"/boot/config-{release}", 4 << 20)
    if text is None:
        return None
    found: dict[str, str] = {}
    for line in text.split("\n")[:50000]:
        match = _CONFIG_LINE.fullmatch(line)
        if match:
            found[match.group(1)] = match.group(2).strip('"')
            continue
        unset = _NOT_SET.fullmatch(line)
        if unset:
            found[unset.group(1)] = "n"
    return found
