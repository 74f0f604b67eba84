"""Installed kernels: their line, the one the next boot picks, and the GPU modules each carries.

Shared by ``kernel.version`` (a kernel judged by its line; the next boot must find the GPU
driver's module) and ``nvidia.driver`` (the module on disk against the loaded one).

A kernel's *line* is who maintains it and how it is versioned: Ubuntu's flavours
(``6.8.0-45-generic``, ``6.8.0-1017-nvidia``, ``-nvidia-64k``, ``-aws``...), RHEL and its
rebuilds (``5.14.0-570.23.1.el9_6.x86_64``, heavily backported: the upstream number says
little), SUSE (``6.4.0-150600.23.25-default``: ``150600`` is SLE 15 SP6; Tumbleweed's
``6.12.8-1-default``), Debian (``6.1.0-28-amd64``), Fedora (``.fc41``), Arch
(``6.12.8-arch1-1``, ``-lts``, ``-zen``, ``-hardened``), Amazon Linux, Azure Linux
(``.cm2``, ``.azl3``), Oracle UEK, Proxmox (``6.14.8-2-pve``), upstream builds (a bare
``6.14.2``, ``-rc3``, a ``+`` for a modified tree) and, for any other name, *unknown*: a
name this module cannot place is never taken for an upstream build.

A line's currency comes from dated tables (:data:`UBUNTU_RELEASES`, :data:`EL_MINORS`,
:data:`SLE_SERVICE_PACKS`...), judged on a date: the audit's, or the capture's when a
snapshot is replayed. Ubuntu rolls its generic, cloud and -nvidia kernels on an LTS release
with each HWE point release; the GA series stays maintained for the release's life, and an
earlier rolling step is superseded once the next one ships (Ubuntu's kernel lifecycle,
https://ubuntu.com/kernel/lifecycle). A RHEL minor stream stops getting fixes when the next
minor ships (Red Hat's EUS keeps even minors for 24 months, by subscription), an SLE service
pack when its general support ends, six months after the next one.

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

import datetime as dt
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
_UBUNTU_STEMS = frozenset(f.split("-")[0] for f in UBUNTU_FLAVOURS)
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

def _d(text: str) -> dt.date:
    return dt.date.fromisoformat(text)


class Step(NamedTuple):
    """A kernel series a rolling line moved to, and when."""

    series: str
    since: dt.date


class UbuntuRelease(NamedTuple):
    """An Ubuntu release: its GA kernel series, its rolling (HWE) steps, its standard support."""

    ga: str
    released: dt.date
    #: The end of standard support (after it, fixes come only with Ubuntu Pro's ESM).
    support_end: dt.date
    #: The HWE series in the order they came, with the point release that brought each.
    hwe: tuple[Step, ...] = ()


#: Ubuntu releases (https://ubuntu.com/about/release-cycle, the point releases' notes).
#: The generic kernel, the cloud kernels and -nvidia roll to the same HWE series on an LTS.
UBUNTU_RELEASES: Mapping[str, UbuntuRelease] = {
    "18.04": UbuntuRelease("4.15", _d("2018-04-26"), _d("2023-05-31"), (
        Step("4.18", _d("2018-08-02")), Step("5.0", _d("2019-02-14")),
        Step("5.3", _d("2019-08-08")), Step("5.4", _d("2020-08-13")))),
    "20.04": UbuntuRelease("5.4", _d("2020-04-23"), _d("2025-05-31"), (
        Step("5.8", _d("2021-02-04")), Step("5.11", _d("2021-08-26")),
        Step("5.13", _d("2022-02-24")), Step("5.15", _d("2022-09-01")))),
    "22.04": UbuntuRelease("5.15", _d("2022-04-21"), _d("2027-04-30"), (
        Step("5.17", _d("2022-04-21")), Step("5.19", _d("2023-02-23")),
        Step("6.2", _d("2023-08-10")), Step("6.5", _d("2024-02-22")),
        Step("6.8", _d("2024-09-12")))),
    "24.04": UbuntuRelease("6.8", _d("2024-04-25"), _d("2029-04-30"), (
        Step("6.11", _d("2025-02-20")), Step("6.14", _d("2025-08-07")),
        Step("6.17", _d("2026-02-12")))),
    "24.10": UbuntuRelease("6.11", _d("2024-10-10"), _d("2025-07-10")),
    "25.04": UbuntuRelease("6.14", _d("2025-04-17"), _d("2026-01-15")),
    "25.10": UbuntuRelease("6.17", _d("2025-10-09"), _d("2026-07-09")),
    "26.04": UbuntuRelease("7.0", _d("2026-04-23"), _d("2031-04-30")),
}
#: Kept for callers of the earlier table: (GA series, HWE series in order).
UBUNTU_SERIES: Mapping[str, tuple[str, tuple[str, ...]]] = {
    version: (release.ga, tuple(step.series for step in release.hwe))
    for version, release in UBUNTU_RELEASES.items()}
#: Ubuntu flavours that roll with the HWE series on an LTS (a superseded step is behind);
#: the others (fips, realtime, raspi, tegra, gke...) keep one series and are judged by line.
ROLLING_FLAVOURS = frozenset({
    "generic", "generic-64k", "lowlatency", "lowlatency-64k", "aws", "aws-64k", "azure",
    "gcp", "oracle", "oracle-64k", "nvidia", "nvidia-64k", "nvidia-lowlatency",
    "nvidia-lowlatency-64k", "oem"})
#: Debian releases: kernel series, release date and end of (LTS) support.
DEBIAN_RELEASES: Mapping[str, tuple[str, dt.date, dt.date]] = {
    "buster": ("4.19", _d("2019-07-06"), _d("2024-06-30")),
    "bullseye": ("5.10", _d("2021-08-14"), _d("2026-08-31")),
    "bookworm": ("6.1", _d("2023-06-10"), _d("2028-06-30")),
    "trixie": ("6.12", _d("2025-08-09"), _d("2030-06-30")),
}
DEBIAN_SERIES: Mapping[str, str] = {name: rel[0] for name, rel in DEBIAN_RELEASES.items()}
#: RHEL minor releases (Red Hat's "RHEL release dates" article); a minor's kernel stream
#: (``el9_4``) gets fixes until the next minor ships, or with EUS for 24 months.
EL_MINORS: Mapping[str, tuple[tuple[int, dt.date], ...]] = {
    "8": ((6, _d("2022-05-10")), (7, _d("2022-11-09")), (8, _d("2023-05-16")),
          (9, _d("2023-11-14")), (10, _d("2024-05-22"))),
    "9": ((0, _d("2022-05-17")), (1, _d("2022-11-15")), (2, _d("2023-05-10")),
          (3, _d("2023-11-07")), (4, _d("2024-04-30")), (5, _d("2024-11-12")),
          (6, _d("2025-05-20")), (7, _d("2025-11-12"))),
    "10": ((0, _d("2025-05-20")), (1, _d("2025-11-12"))),
}
#: The end of a RHEL major's maintenance (after it: Extended Life Cycle Support only).
EL_END: Mapping[str, dt.date] = {"7": _d("2024-06-30"), "8": _d("2029-05-31"),
                                 "9": _d("2032-05-31"), "10": _d("2035-05-31")}
#: RHEL minors with Extended Update Support (24 months from their release).
EL_EUS: Mapping[str, frozenset[int]] = {"8": frozenset({6, 8}), "9": frozenset({0, 2, 4, 6}),
                                        "10": frozenset({0})}
#: SLE service packs: (major, SP) -> (release, end of general support; LTSS after it).
SLE_SERVICE_PACKS: Mapping[tuple[int, int], tuple[dt.date, dt.date]] = {
    (15, 3): (_d("2021-06-22"), _d("2022-12-31")),
    (15, 4): (_d("2022-06-21"), _d("2023-12-31")),
    (15, 5): (_d("2023-06-20"), _d("2024-12-31")),
    (15, 6): (_d("2024-06-20"), _d("2025-12-31")),
    (15, 7): (_d("2025-06-17"), _d("2031-07-31")),
    (16, 0): (_d("2025-11-04"), _d("2026-11-30")),
}
#: Fedora releases: end of life (the kernel rolls to upstream stable until then).
FEDORA_EOL: Mapping[int, dt.date] = {
    38: _d("2024-05-21"), 39: _d("2024-11-26"), 40: _d("2025-05-13"), 41: _d("2025-12-15"),
    42: _d("2026-05-13"), 43: _d("2026-12-09")}
#: Upstream longterm series and their projected end of life (kernel.org/category/releases).
LONGTERM_EOL: Mapping[str, dt.date] = {
    "4.19": _d("2024-12-31"), "5.4": _d("2025-12-31"), "5.10": _d("2026-12-31"),
    "5.15": _d("2026-12-31"), "6.1": _d("2027-12-31"), "6.6": _d("2026-12-31"),
    "6.12": _d("2026-12-31")}
#: Rolling lines judged by a number (the policy minimum) and by a dated end of life too.
DATED_ROLLING_LINES = frozenset({"fedora"})
#: The newest date the tables above know of: a judgement far past it says so.
TABLES_DATE = _d("2026-02-12")

_SUSE = lazy_re(r"([0-9]{1,3})\.([0-9]{1,3})\.[0-9]{1,3}-(1[0-9])([0-9]{2})00\.[0-9.]{1,32}"
                r"-([a-z0-9]{2,16})")
_SUSE_ROLLING = lazy_re(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?-[0-9]{1,4}(?:\.[0-9]{1,4})?"
                        r"-(default|longterm|vanilla|rt|64kb|kvmsmall|azure)")
_ARCH = lazy_re(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?-(arch|zen|hardened|lts)?"
                r"[0-9]{0,3}-?[0-9]{1,3}(?:-(lts|zen|hardened|rt|rt-lts))?")
_AZL = lazy_re(r"\.(cm2|azl[0-9])(?:\.|$)")
_UPSTREAM = lazy_re(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?(?:-rc[0-9]{1,2})?\+?")


class KernelLine(NamedTuple):
    """The line a kernel release belongs to."""

    #: ``ubuntu-generic``, ``ubuntu-nvidia``, ``ubuntu-nvidia-64k``, ``ubuntu-aws``, ``el9``,
    #: ``el9-uek``, ``sles``, ``suse-tumbleweed``, ``debian``, ``pve``, ``fedora``, ``arch``,
    #: ``arch-lts``, ``amzn``, ``azurelinux``, ``vanilla`` (an upstream build), ``unknown``.
    name: str
    #: The upstream series (``6.8``).
    series: str
    #: The distribution's minor stream where it has one (``el9_6`` -> ``6``; SLE ``15.6``;
    #: ``fc41`` -> ``41``).
    stream: str = ""
    flavour: str = ""

    @property
    def vendor(self) -> bool:
        """Return whether a vendor maintains the line (judged by its release, not the number)."""
        return self.name not in ("vanilla", "unknown", "pve", "fedora", "arch",
                                 "suse-tumbleweed")

    def describe(self) -> str:
        """Return the line in a few words."""
        words = {
            "pve": "Proxmox VE kernel", "vanilla": "upstream (vanilla) kernel",
            "debian": "Debian kernel", "fedora": "Fedora kernel", "amzn": "Amazon Linux kernel",
            "unknown": "kernel of an unknown line", "arch": "Arch Linux kernel",
            "arch-lts": "Arch Linux LTS kernel", "suse-tumbleweed": "openSUSE Tumbleweed kernel",
            "azurelinux": "Azure Linux kernel",
        }
        if self.name == "sles":
            return f"SUSE kernel {self.series} (SLE {self.stream}, -{self.flavour})"
        if self.name in words:
            return f"{words[self.name]} {self.series}"
        if self.name.startswith("arch-"):
            return f"Arch Linux -{self.flavour} kernel {self.series}"
        if self.name.startswith("ubuntu-"):
            return f"Ubuntu -{self.flavour} kernel {self.series}"
        if self.name.startswith("el"):
            minor = f"_{self.stream}" if self.stream else ""
            name = self.name.replace("-uek", " UEK")
            return f"{name} kernel {self.series} ({self.name[:4]}{minor})"
        return f"{self.name} kernel {self.series}"


def _ids(os_release: Mapping[str, str]) -> set[str]:
    return {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}


def classify(release: str, os_release: Mapping[str, str]) -> KernelLine:
    """Return the line of a kernel release (the distribution's os-release helps tell apart)."""
    numbers = version_tuple(release)
    series = ".".join(str(n) for n in numbers[:2])
    ids = _ids(os_release)
    if _PVE.fullmatch(release):
        return KernelLine("pve", series)
    el = _EL.search(release)
    if el:
        name = f"el{el.group(1)}" + ("-uek" if el.group(3) else "")
        return KernelLine(name, series, el.group(2) or "")
    fedora = _FEDORA.search(release)
    if fedora:
        return KernelLine("fedora", series, fedora.group(1))
    if _AMZN.search(release):
        return KernelLine("amzn", series)
    if _AZL.search(release):
        return KernelLine("azurelinux", series)
    suse = _SUSE.fullmatch(release)
    if suse:
        return KernelLine("sles", series, f"{int(suse.group(3))}.{int(suse.group(4))}",
                          flavour=suse.group(5))
    ubuntu = _UBUNTU.fullmatch(release)
    # A flavour Ubuntu ships, or on Ubuntu one of a family it ships (a new -azure-cvm...).
    if ubuntu and (ubuntu.group(4) in UBUNTU_FLAVOURS or (
            "ubuntu" in ids and ubuntu.group(4).split("-")[0] in _UBUNTU_STEMS)):
        flavour = ubuntu.group(4)
        return KernelLine(f"ubuntu-{flavour}", series, flavour=flavour)
    debian = _DEBIAN.fullmatch(release)
    if debian:
        return KernelLine("debian", series, "bpo" if "+bpo" in release else "",
                          flavour=debian.group(3))
    rolling = _SUSE_ROLLING.fullmatch(release)
    if rolling and ids & {"suse", "opensuse", "opensuse-tumbleweed", "opensuse-slowroll"}:
        return KernelLine("suse-tumbleweed", series, flavour=rolling.group(1))
    arch = _ARCH.fullmatch(release)
    if arch and (arch.group(1) in ("arch", "zen", "hardened") or
                 ({"arch", "archarm", "endeavouros", "manjaro"} & ids)):
        flavour = arch.group(2) or ("" if arch.group(1) in (None, "arch") else arch.group(1))
        return KernelLine(f"arch-{flavour}" if flavour else "arch", series, flavour=flavour)
    if _UPSTREAM.fullmatch(release):
        return KernelLine("vanilla", series)
    return KernelLine("unknown", series)


class Currency(NamedTuple):
    """Whether a vendor line's kernel is current for the distribution release it runs on."""

    current: bool
    why: str


def _ubuntu(line: KernelLine, version_id: str, on: dt.date) -> Currency:
    known = UBUNTU_RELEASES.get(version_id)
    if known is None:
        return Currency(True, f"Ubuntu {version_id or '?'}: its kernel series are not "
                        "tabled here, judged current")
    if on > known.support_end:
        return Currency(False, f"Ubuntu {version_id} left standard support on "
                        f"{known.support_end}: its kernels get fixes only with Ubuntu Pro "
                        "(ESM)")
    if line.flavour not in ROLLING_FLAVOURS:
        return Currency(True, f"a kernel line Canonical maintains ({line.flavour}), judged by "
                        "its line rather than its upstream number")
    steps = [s for s in known.hwe if s.since <= on]
    what = "GA" if line.flavour in ("generic", "generic-64k") else f"-{line.flavour} GA"
    if line.series == known.ga:
        return Currency(True, f"the {what} kernel series of Ubuntu {version_id}")
    if steps and line.series == steps[-1].series:
        return Currency(True, f"the current HWE kernel series of Ubuntu {version_id} (since "
                        f"{steps[-1].since})")
    later = [s for s in known.hwe if s.since <= on and
             version_tuple(s.series) > version_tuple(line.series)]
    if any(s.series == line.series for s in steps) and later:
        return Currency(False, f"{line.series} is a superseded HWE series of Ubuntu "
                        f"{version_id}: the -{line.flavour} kernel rolled to "
                        f"{steps[-1].series} on {steps[-1].since}")
    newest = steps[-1].series if steps else known.ga
    if version_tuple(line.series) > version_tuple(newest):
        return Currency(True, f"newer than the series tabled for Ubuntu {version_id}")
    return Currency(False, f"{line.series} is not a kernel series of Ubuntu {version_id} "
                    f"(GA {known.ga}, HWE {', '.join(s.series for s in steps) or 'none'})")


def _el(line: KernelLine, os_release: Mapping[str, str], on: dt.date) -> Currency:
    version_id = os_release.get("VERSION_ID", "")
    major, _, minor = version_id.partition(".")
    mine = line.name[2:].removesuffix("-uek")
    if major and mine != major:
        return Currency(False, f"an {line.name} kernel on a release {version_id} system")
    if mine in EL_END and on > EL_END[mine]:
        return Currency(False, f"release {mine} left maintenance on {EL_END[mine]} (Extended "
                        "Life Cycle Support only)")
    if line.name.endswith("-uek"):
        return Currency(True, f"Oracle's UEK for release {mine}, maintained by its vendor")
    if line.stream and minor.isdigit() and int(line.stream) < int(minor):
        return Currency(False, f"a {line.name}_{line.stream} kernel on a {version_id} "
                        "system: the kernel stream is older than the release")
    if not line.stream:
        return Currency(True, f"the {line.name} kernel stream of release "
                        f"{version_id or '?'}")
    stream = int(line.stream)
    shipped = [(n, when) for n, when in EL_MINORS.get(mine, ()) if when <= on]
    newer = [(n, when) for n, when in shipped if n > stream]
    if not newer:
        return Currency(True, f"the {line.name} kernel stream of release {version_id or '?'}")
    nxt = newer[0]
    since = dict(EL_MINORS.get(mine, ())).get(stream)
    if os_release.get("ID") == "rhel" and stream in EL_EUS.get(mine, frozenset()) and \
            since is not None and on <= since.replace(year=since.year + 2):
        return Currency(True, f"the {mine}.{stream} stream, maintained after {mine}.{nxt[0]} "
                        f"shipped ({nxt[1]}) only under an Extended Update Support "
                        f"subscription, until {since.replace(year=since.year + 2)}")
    return Currency(False, f"the {mine}.{stream} kernel stream stopped getting fixes when "
                    f"{mine}.{nxt[0]} shipped on {nxt[1]} (the current minor is "
                    f"{mine}.{shipped[-1][0]})")


def _sles(line: KernelLine, os_release: Mapping[str, str], on: dt.date) -> Currency:
    version_id = os_release.get("VERSION_ID", "")
    if version_id and version_tuple(line.stream) < version_tuple(version_id):
        return Currency(False, f"an SLE {line.stream} kernel on a {version_id} system: the "
                        "kernel stream is older than the release")
    major, _, sp = line.stream.partition(".")
    dates = SLE_SERVICE_PACKS.get((int(major), int(sp or 0)))
    if dates is None:
        return Currency(True, f"SLE {line.stream}: its service pack is not tabled here, "
                        "judged current")
    if on > dates[1]:
        return Currency(False, f"SLE {major} SP{sp} left general support on {dates[1]} "
                        "(fixes only under LTSS)")
    return Currency(True, f"the kernel stream of SLE {major} SP{sp} (general support until "
                    f"{dates[1]})")


def currency(line: KernelLine, os_release: Mapping[str, str],
             on: dt.date | None = None) -> Currency:
    """Judge a vendor kernel by its release's lifecycle on date ``on`` (default: today, UTC)."""
    on = on or dt.datetime.now(dt.timezone.utc).date()
    version_id = os_release.get("VERSION_ID", "")
    if line.name.startswith("ubuntu-"):
        return _ubuntu(line, version_id, on)
    if line.name.startswith("el"):
        return _el(line, os_release, on)
    if line.name == "sles":
        return _sles(line, os_release, on)
    if line.name == "fedora" and line.stream.isdigit():
        eol = FEDORA_EOL.get(int(line.stream))
        if eol is not None and on > eol:
            return Currency(False, f"Fedora {line.stream} reached its end of life on {eol}")
        return Currency(True, f"a kernel of Fedora {line.stream}, which rolls with upstream")
    if line.name == "arch-lts":
        eol = LONGTERM_EOL.get(line.series)
        if eol is None:
            return Currency(False, f"{line.series} is not a maintained upstream longterm "
                            "series")
        if on > eol:
            return Currency(False, f"upstream longterm {line.series} reached its end of life "
                            f"on {eol}")
        return Currency(True, f"upstream longterm {line.series}, maintained until {eol}")
    if line.name == "debian":
        if line.stream == "bpo":
            return Currency(True, "a Debian backports kernel")
        codename = os_release.get("VERSION_CODENAME", "")
        known = DEBIAN_RELEASES.get(codename)
        if known is None or line.series == known[0]:
            if known is not None and on > known[2]:
                return Currency(False, f"Debian {codename} left (LTS) support on {known[2]}")
            return Currency(True, f"the kernel series of Debian {codename or version_id or '?'}")
        if version_tuple(line.series) > version_tuple(known[0]):
            return Currency(True, f"newer than Debian {codename}'s {known[0]}")
        return Currency(False, f"{line.series} is older than Debian {codename}'s {known[0]}")
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
