"""kernel.version: the running kernel judged by its line, a pending reboot, and the GPU driver.

Subjects:

- ``kernel``: the running release judged by the line it belongs to
  (:func:`auditor.checks.lib.kernels.classify`). The policy minimum applies to vanilla
  kernels, to kernels of an unknown line and to the rolling lines that follow upstream
  (Proxmox, Fedora, Arch, Tumbleweed); a vendor-maintained line (Ubuntu's flavours, RHEL and
  rebuilds, SUSE, Debian, cloud kernels) passes when it is current for its release on the
  judged date (dated tables: a superseded HWE step of a rolling Ubuntu flavour, a RHEL minor
  stream or SLE service pack past its support is behind), since its upstream number says
  little about its backports; a policy can set a minimum per line. A kernel found behind
  names what keeps it there: a hold on its packages (``apt-mark hold``, ``dnf versionlock``)
  and unattended upgrades that are off. The date judged against is the capture's (its
  manifest) when a snapshot is replayed, else today's, and the finding says which. A newer
  kernel of the same line that is installed but not booted is "reboot pending"; a next boot
  that would start a kernel of another line is said.
- ``nvidia-driver``: Blackwell GPUs need NVIDIA's open kernel module from R570 on; and the
  kernel the next boot picks must carry the nvidia module (in its modules.dep: DKMS's
  ``updates/dkms``, the runfile's ``kernel/drivers/video``, Ubuntu's precompiled
  ``kernel/nvidia-<branch>`` tree, RHEL's ``extra``), of the userspace's version, or the
  reboot comes up without GPUs.
- ``amdgpu-driver`` (hosts with AMD GPUs): the next boot's kernel must carry ``amdgpu``
  (in-tree, which Ubuntu ships in linux-modules-extra, or amdgpu-dkms).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import files, kernels, nvidia, packages, pci
from auditor.checks.lib.kernels import (  # noqa: F401 - kept importable from here
    KERNEL_IMAGES,
    MODULE_DIRS,
    OSRELEASE,
    PROC_VERSION,
    installed_kernels,
    newest_installed,
    running_kernel,
)
from auditor.checks.lib.nvidia import (  # noqa: F401 - kept importable from here
    BLACKWELL_DEVICE_RANGES,
    PASSTHROUGH_DRIVERS,
    is_blackwell,
)
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.errors import PolicyError
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.parsing import parse_os_release, safe_word, version_tuple

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy

OS_RELEASE = "/etc/os-release"
#: A replayed capture's manifest (:mod:`auditor.manifest`): the date the capture was taken.
CAPTURE_MANIFEST = "/host-auditor/manifest.json"
NVIDIA_VENDOR = pci.NVIDIA
#: Lines the policy ``minimum`` applies to: no vendor backports to the number (rolling
#: lines that follow upstream, upstream builds, and a line not known, judged by its number).
MINIMUM_LINES = frozenset({"vanilla", "unknown", "pve", "fedora", "arch", "arch-zen",
                           "arch-hardened", "arch-rt", "suse-tumbleweed"})
#: Package names that carry a kernel, per family (a hold on one keeps the kernel back).
KERNEL_PACKAGES = ("linux-image-", "linux-generic", "linux-modules-", "linux-headers-",
                   "linux-virtual", "linux-aws", "linux-azure", "linux-gcp", "linux-oracle",
                   "linux-nvidia", "linux-lowlatency", "linux-oem", "linux-hwe",
                   "proxmox-kernel", "pve-kernel")
#: A versionlock entry or exclude= glob as it may be said in a message (nothing else).
_RPM_SPEC = re.compile(r"[A-Za-z0-9._:+*~-]{1,128}")
RPM_KERNEL = ("kernel", "kernel-core", "kernel-modules", "kernel-default", "kernel-uek")
RHEL_LIKE = {"rhel", "centos", "rocky", "almalinux", "fedora", "ol"}


def nvidia_driver(host: Host) -> tuple[str, str] | None:
    """Return the loaded NVIDIA driver as (version, flavour), or None if none is loaded."""
    driver = nvidia.loaded_driver(host)
    return (driver.version, driver.flavour) if driver else None


def os_release_id(host: Host) -> str:
    """Return the ID from /etc/os-release (``debian``, ``ubuntu``), or an empty string."""
    value = parse_os_release(files.read_optional(host, OS_RELEASE) or "").get("ID", "")
    return value if re.fullmatch(r"[a-z0-9._-]{1,64}", value) else ""


def _codename(os_release: Mapping[str, str]) -> str:
    """Return the codename a release names in parentheses (``12 (bookworm)``), or ""."""
    for key in ("VERSION", "PRETTY_NAME"):
        match = re.search(r"\(([a-z]{1,32})\)", os_release.get(key, "")[:256])
        if match:
            return match.group(1)
    return ""


def upgrade_command(
    running: str, minimum: str, os_release: Mapping[str, str], arch: str = "amd64"
) -> tuple[str, ...]:
    """Return the command that installs a newer kernel of the running line, or ()."""
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    line = kernels.classify(running, os_release)
    wanted = version_tuple(minimum)
    if line.name == "pve" or "pve" in os_release.get("NAME", "").lower():
        series = ".".join(str(n) for n in (wanted[:2] if len(wanted) >= 2 else (6, 14)))
        return ("apt", "install", f"proxmox-kernel-{series}")
    if line.name.startswith("ubuntu-") or os_release.get("ID") == "ubuntu" or "ubuntu" in ids:
        version = os_release.get("VERSION_ID", "")
        flavour = line.flavour or "generic"
        if flavour in ("generic", "generic-64k"):
            if safe_word(version):
                return ("apt", "install", "--install-recommends",
                        f"linux-{flavour}-hwe-{version}")
            return ()
        # Another Ubuntu line (-nvidia, -nvidia-64k, a cloud's): its own metapackage, never
        # the generic HWE kernel.
        return ("apt", "install", "--only-upgrade", f"linux-{flavour}")
    if line.name in ("vanilla", "unknown"):
        # A kernel built from upstream sources (or of a line not known): the distribution's
        # kernel is another line.
        return ()
    if line.name == "sles" or ids & {"suse", "sles", "opensuse"}:
        flavour = line.flavour if safe_word(line.flavour) else "default"
        return ("zypper", "--non-interactive", "install", f"kernel-{flavour}")
    if line.name.startswith("arch"):
        # Arch supports no partial upgrade: the kernel comes with the whole system.
        return ("pacman", "-Syu")
    if line.name == "fedora":
        return ("dnf", "upgrade", "--refresh", "kernel")
    if "debian" in ids:
        codename = os_release.get("VERSION_CODENAME", "") or _codename(os_release)
        if safe_word(codename):
            return ("apt", "install", "-t", f"{codename}-backports", f"linux-image-{arch}")
        return ()
    if ids & RHEL_LIKE:
        return ("dnf", "install", "kernel")
    return ()


def judged_on(host: Host, as_of: str = "") -> tuple[dt.date, str]:
    """Return the date kernel lifecycles are judged on, and where that date comes from.

    A replayed capture is judged on the day it was taken (its manifest's ``created``): a
    kernel current then is not made "behind" by a table row written later.
    """
    if as_of:
        return dt.date.fromisoformat(as_of), "the policy's as_of"
    today = dt.datetime.now(dt.timezone.utc).date()
    if host.kind != "sysroot":
        return today, "today"
    from auditor.errors import SnapshotError
    from auditor.manifest import PATH, read_manifest
    try:
        manifest = read_manifest(host)
    except SnapshotError:
        manifest = None
    if manifest is None:
        return today, "today (the capture carries no manifest: its own date is unknown)"
    return (dt.datetime.fromisoformat(manifest.created).date(),
            f"the capture's date ({PATH.lstrip('/')})")


def kernel_holds(host: Host) -> list[str]:
    """Return the kernel packages held back: ``apt-mark hold``, dnf versionlock or exclude."""
    held = [p.name for p in packages.dpkg_packages(host).by_name.values()
            if p.held and p.name.startswith(KERNEL_PACKAGES)]
    for path, key in ((packages.VERSIONLOCK, ""), (packages.DNF_CONF, "exclude")):
        for raw in (files.read_optional(host, path) or "").split("\n")[:4096]:
            line = raw.strip()
            if key:
                name, sep, value = line.partition("=")
                if not sep or name.strip() not in ("exclude", "excludepkgs"):
                    continue
                words = value.replace(",", " ").split()[:256]
            else:
                words = [line.lstrip("!")] if line and not line.startswith("#") else []
            for word in words:
                # versionlock: name-[epoch:]version-release.arch; exclude=: a name or glob.
                stem = word.rstrip("*")
                name = re.split(r"-[0-9]", stem, maxsplit=1)[0] if not key else stem
                if name.rstrip("-") in RPM_KERNEL and _RPM_SPEC.fullmatch(word):
                    held.append(f"{word[:128]} ({path})")
    return sorted(set(held))[:16]


class KernelOptions(CheckOptions):
    """Options of ``kernel.version``."""

    minimum: str = option(
        "6.14", help="the oldest release that passes on lines without vendor backports "
                     "(vanilla, Proxmox, Fedora)")
    line_minimums: tuple[str, ...] = option(
        (), help="per-line minimums, LINE=VERSION (e.g. ubuntu-nvidia=6.8, el9=5.14.0-570, "
                 "ubuntu-generic=6.8); a line named here is judged by this number")
    blackwell_min_driver: str = option(
        "570", help="the oldest NVIDIA driver branch that supports Blackwell GPUs")
    as_of: str = option(
        "", help="judge kernel lifecycles on this date (YYYY-MM-DD); default: the capture's "
                 "date when a snapshot with a manifest is replayed, else today")

    def validate(self, where: str) -> None:
        """Versions must read as versions; line minimums as LINE=VERSION."""
        for name in ("minimum", "blackwell_min_driver"):
            value = getattr(self, name)
            if not version_tuple(value):
                raise PolicyError(f"{where}.{name} must be a version such as 6.14, got "
                                  f"{value!r}")
        if self.as_of:
            try:
                dt.date.fromisoformat(self.as_of)
            except ValueError:
                raise PolicyError(f"{where}.as_of must be a date such as 2025-06-30, got "
                                  f"{self.as_of!r}") from None
        for entry in self.line_minimums:
            line, sep, version = entry.partition("=")
            if not sep or not re.fullmatch(r"[a-z0-9-]{2,40}", line) or not version_tuple(
                    version):
                raise PolicyError(f"{where}.line_minimums entries must read LINE=VERSION "
                                  f"(ubuntu-nvidia=6.8), got {entry!r}")

    def minimum_for(self, line: str) -> str | None:
        """Return the minimum a line is held to, or None for a vendor line judged by release."""
        for entry in self.line_minimums:
            name, _, version = entry.partition("=")
            if name == line:
                return version
        return self.minimum if line in MINIMUM_LINES else None


class KernelVersion(Check[KernelOptions]):
    """The kernel must be current for its line, and the next boot must find the GPU driver."""

    id: ClassVar[str] = "kernel.version"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *kernels.RELEASE_READS,
        *kernels.NEXT_BOOT_READS,
        *kernels.MODULE_READS,
        OS_RELEASE,
        *packages.UPGRADE_READS,
        CAPTURE_MANIFEST,
        *nvidia.DRIVER_READS,
        *nvidia.USERSPACE_READS,
        nvidia.OPERATOR_ROOT,
        *packages.DPKG_READS,
        *pci.DEVICE_READS,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "Recent kernels carry the fixes and features inference hosts lean on (HMM and "
        "device-memory migration, io_uring, NUMA and scheduler fixes, support for the newest "
        "CPUs, NICs and GPUs); a vendor's kernel line carries them as backports, so it is "
        "judged by its release, not its number. A newer kernel installed but not booted is a "
        "fix that has not landed, and a next kernel without the GPU driver's module is a "
        "reboot that comes up without GPUs. NVIDIA Blackwell GPUs are supported only by the "
        "open kernel modules, from driver branch R570 on."
    )
    remedy: ClassVar[str] = (
        "Upgrade within the running kernel's line (its metapackage, HWE on Ubuntu generic, "
        "proxmox-kernel-6.14 or newer on Proxmox) and reboot into it; before rebooting, build "
        "or install the GPU driver's module for the next kernel (dkms autoinstall -k VERSION, "
        "or the precompiled linux-modules-nvidia package of the same branch). For Blackwell, "
        "install the open flavour of a R570 or newer NVIDIA driver."
    )
    options_type: ClassVar[type[CheckOptions]] = KernelOptions
    fix_reads: ClassVar[tuple[str, ...]] = ("/proc/cpuinfo",)
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment(host)
        os_release = parse_os_release(files.read_optional(host, OS_RELEASE) or "")
        distro = os_release_id(host)
        running = running_kernel(host)
        installed = installed_kernels(host)
        nxt = kernels.next_boot(host, running or "", installed) if running else None
        if env.in_container:
            reason = (f"inside a {env.describe()}: the kernel and its modules are the host's; "
                      "audit the host (a kernel is never installed inside a container)")
            yield self.skipped("kernel", reason, evidence={"running": running or ""})
            yield self.skipped("nvidia-driver", reason)
            return
        yield self._judge_kernel(host, running, distro, os_release, installed, nxt)
        amd = [d for d in pci.devices(host) if d.is_gpu and d.vendor == pci.AMD_GPU
               and d.driver not in PASSTHROUGH_DRIVERS]
        if not amd or nvidia.gpus(host) or nvidia.loaded_driver(host) is not None:
            yield self._judge_driver(host, running or "", distro, nxt)
        if amd:
            yield self._judge_amdgpu(host, amd, nxt, os_release)

    # -- the running kernel -----------------------------------------------------------------

    def _judge_kernel(self, host: Host, running: str | None, distro: str,
                      os_release: Mapping[str, str], installed: list[str],
                      nxt: kernels.NextBoot | None) -> Finding:
        if not running or not version_tuple(running):
            return self.skipped(
                "kernel",
                f"the running kernel release cannot be read from {OSRELEASE} or {PROC_VERSION}",
                evidence={"running": running or "", "distro": distro})
        line = kernels.classify(running, os_release)
        minimum = self.options.minimum_for(line.name)
        ev = {"running": running, "minimum": minimum or "", "distro": distro}
        if line.name != "vanilla" or self.options.line_minimums:
            ev["line"] = line.name
        same_line = [r for r in installed
                     if kernels.classify(r, os_release).name == line.name]
        pending = newest_installed(running, same_line)
        if pending:
            ev["installed_newer"] = pending
        other = ""
        if nxt is not None and nxt.release != running and \
                kernels.classify(nxt.release, os_release).name != line.name:
            other = nxt.release
            ev["next_boot"] = other
            ev["next_boot_line"] = kernels.classify(other, os_release).name
        if minimum and not version_tuple(minimum):
            minimum = None
        if not ev["minimum"]:
            del ev["minimum"]
        if minimum and version_tuple(running) < version_tuple(minimum):
            then, fix = "", f"install a kernel >= {minimum} and reboot"
            if pending and version_tuple(pending) >= version_tuple(minimum):
                then, fix = f"; {pending} is installed: reboot into it", f"reboot into {pending}"
            elif pending:
                then = f"; the newest installed, {pending}, is below {minimum} too"
            kept = "" if pending else self._kept_back(host, ev)
            return self.failed(
                "kernel", f"running kernel {running} ({line.describe()}) is older than "
                f"{minimum}{then}{kept}", observed=running, expected=f">= {minimum}",
                fix=fix, evidence=ev)
        if pending:
            return self.warned(
                "kernel", f"reboot pending: kernel {pending} of the same line is installed but "
                f"{running} is running", observed=running, expected=pending,
                fix=f"reboot into {pending}", evidence=ev)
        if other:
            return self.warned(
                "kernel", f"the next boot starts {other} ({ev['next_boot_line']}), a kernel of "
                f"another line than the running {running} ({line.name}): "
                f"{nxt.how if nxt else ''}", observed=running, expected=f"a {line.name} kernel",
                fix=f"remove {other} or set the boot default to the {line.name} kernel",
                evidence=ev)
        if minimum and line.name not in kernels.DATED_ROLLING_LINES:
            return self.passed(
                "kernel", f"running kernel {running} is at or above {minimum}",
                observed=running, expected=f">= {minimum}", evidence=ev)
        on, source = judged_on(host, self.options.as_of)
        ev["judged_on"] = on.isoformat()
        ev["judged_on_source"] = source
        if on > kernels.TABLES_DATE.replace(year=kernels.TABLES_DATE.year + 1):
            ev["tables_date"] = kernels.TABLES_DATE.isoformat()
        currency = kernels.currency(line, os_release, on)
        ev["current_because"] = currency.why
        if not currency.current:
            kept = self._kept_back(host, ev)
            return self.warned(
                "kernel", f"running kernel {running} ({line.describe()}) is not current for "
                f"its release on {ev['judged_on']}: {currency.why}{kept}", observed=running,
                expected="the release's current kernel series", evidence=ev,
                fix=("release the hold, " if ev.get("kernel_held") else "")
                + "upgrade within the line and reboot")
        if minimum:
            return self.passed(
                "kernel", f"running kernel {running} is at or above {minimum}: {currency.why}",
                observed=running, expected=f">= {minimum}", evidence=ev)
        return self.passed(
            "kernel", f"running kernel {running}: {line.describe()}, {currency.why}",
            observed=running, evidence=ev)

    def _kept_back(self, host: Host, ev: dict[str, str]) -> str:
        """Name what keeps an old kernel in place (a hold, upgrades that are off) in ``ev``."""
        said: list[str] = []
        held = kernel_holds(host)
        if held:
            ev["kernel_held"] = " ".join(held)[:512]
            said.append(f"held back ({', '.join(held[:3])})")
        policy = packages.upgrade_policy(host)
        if not policy.tool:
            ev["unattended_upgrades"] = "off"
            said.append("no unattended upgrade tool is on")
        else:
            ev["unattended_upgrades"] = f"{policy.tool} ({policy.where})"
            kept = [p for p in ("linux-image-", "linux-", "kernel", "kernel-core")
                    if packages.kept_back(policy, p)]
            if kept:
                ev["unattended_keeps_back"] = " ".join(kept)
                said.append(f"{policy.tool} keeps {kept[0]}* back")
        return f"; {', '.join(said)}" if said else ""

    # -- the NVIDIA driver, now and at the next boot -------------------------------------------

    def _judge_driver(self, host: Host, running: str, distro: str,
                      nxt: kernels.NextBoot | None) -> Finding:
        branch = self.options.blackwell_min_driver
        gpus = nvidia.gpus(host)
        blackwell = [(g.address, g.device) for g in gpus
                     if g.device is not None and is_blackwell(g.device)]
        driver = nvidia.loaded_driver(host)
        ev = {
            "running": running,
            "distro": distro,
            "gpus": str(len(gpus)),
            "blackwell": " ".join(f"{a}={d:#06x}" for a, d in blackwell),
        }
        if driver is None:
            if not gpus:
                return self.skipped(
                    "nvidia-driver", "no NVIDIA driver loaded and no NVIDIA GPU", evidence=ev)
            if all(g.driver in PASSTHROUGH_DRIVERS for g in gpus):
                return self.skipped(
                    "nvidia-driver",
                    f"{len(gpus)} NVIDIA GPU(s) bound to a passthrough driver "
                    f"({', '.join(sorted({g.driver for g in gpus}))}): no host driver expected",
                    evidence=ev)
            return self.warned(
                "nvidia-driver", f"{len(gpus)} NVIDIA GPU(s) but no NVIDIA driver is loaded",
                observed="no driver", expected="nvidia driver loaded", evidence=ev)
        version, flavour = driver.version, driver.flavour
        ev.update(version=version, flavour=flavour)
        described = f"NVIDIA driver {version} ({flavour} kernel module)"
        problems: list[tuple[Status, str]] = []
        expected = ""
        if blackwell:
            expected = f"open kernel module, >= {branch}"
            if flavour == "proprietary":
                problems.append((Status.FAIL, "Blackwell GPUs are supported only by the open "
                                 "kernel module"))
            if version_tuple(version) < version_tuple(branch):
                problems.append((Status.FAIL, f"Blackwell needs driver branch R{branch} or "
                                 "newer"))
        problems += self._next_boot_module(host, running, driver, nxt, ev)
        if problems:
            worst = Status.FAIL if any(s is Status.FAIL for s, _ in problems) else Status.WARN
            gpus_said = (f" with {len(blackwell)} Blackwell GPU(s)" if blackwell else "")
            return self.finding(
                worst, "nvidia-driver",
                f"{described}{gpus_said}: {'; '.join(text for _, text in problems)}",
                observed=f"{version} {flavour}", expected=expected or "a module for the next "
                "boot", evidence=ev,
                fix=ev.get("module_fix", f"install the open NVIDIA kernel module, driver "
                                         f"{branch} or newer"))
        if blackwell and flavour == "unknown":
            return self.skipped(
                "nvidia-driver",
                f"{described} with {len(blackwell)} Blackwell GPU(s): cannot tell whether the "
                "open or the proprietary module is loaded", evidence=ev)
        said = (f"supports its {len(blackwell)} Blackwell GPU(s)" if blackwell
                else f"no Blackwell GPU among {len(gpus)} NVIDIA GPU(s)")
        nextsaid = (f"; the next boot's kernel {ev['next_boot']} gets the module from "
                    f"{ev['next_boot_module']}" if ev.get("next_boot_module") else "")
        return self.passed(
            "nvidia-driver", f"{described}; {said}{nextsaid}" if not blackwell else
            f"{described} {said}{nextsaid}",
            observed=f"{version} {flavour}", expected=expected, evidence=ev)

    def _next_boot_module(self, host: Host, running: str, driver: nvidia.LoadedDriver,
                          nxt: kernels.NextBoot | None, ev: dict[str, str]
                          ) -> list[tuple[Status, str]]:
        """Judge the nvidia module of the kernel the next boot starts."""
        if nxt is None:
            return []
        ev["next_boot"] = nxt.release
        ev["next_boot_how"] = nxt.how
        if host.exists(nvidia.OPERATOR_ROOT):
            # The GPU Operator's driver container builds and loads the module at every boot,
            # from its own tree: the host's modules.dep never lists it.
            ev["next_boot_module"] = "the GPU Operator's driver container"
            return []
        search = kernels.gpu_modules(host, nxt.release, "nvidia")
        if not search.indexed:
            ev["next_boot_module"] = ""
            return []
        if search.dkms_built:
            ev["dkms_built"] = " ".join(search.dkms_built)
        versions = kernels.dkms_versions(host, "nvidia")
        if versions:
            ev["dkms_sources"] = " ".join(versions)
        if not search.modules:
            ev["module_fix"] = f"build or install the nvidia module for {nxt.release}"
            running_search = kernels.gpu_modules(host, running, "nvidia") if running else None
            if running_search and running_search.modules:
                ev["running_module"] = running_search.modules[0].path
                ev["running_origin"] = running_search.modules[0].origin
            built = (" (DKMS built it but did not install it)" if search.dkms_built else "")
            return [(Status.FAIL, f"the next boot starts {nxt.release} ({nxt.how}), whose "
                     f"modules.dep has no nvidia module{built}: the reboot comes up without "
                     "GPUs")]
        module = search.modules[0]
        ev["next_boot_module"] = module.path
        ev["next_boot_origin"] = module.origin
        if module.version:
            ev["next_boot_module_version"] = module.version
        userspace = sorted(nvidia.userspace(host).versions("host"))
        target = userspace[-1] if len(userspace) == 1 else driver.version
        if module.origin == "dkms" and module.version and module.version != target:
            return [(Status.FAIL, f"the next boot ({nxt.release}) loads DKMS nvidia "
                     f"{module.version} while the userspace driver is {target}: after the "
                     "reboot every process fails with a version mismatch")]
        if module.origin == "precompiled" and module.version and \
                module.version != nvidia.branch(target):
            return [(Status.FAIL, f"the next boot ({nxt.release}) loads the precompiled "
                     f"nvidia-{module.version} module while the userspace driver is {target}: "
                     "after the reboot every process fails with a version mismatch")]
        return []

    def _judge_amdgpu(self, host: Host, amd: list[pci.PciDevice],
                      nxt: kernels.NextBoot | None, os_release: Mapping[str, str]) -> Finding:
        ev = {"gpus": " ".join(g.address for g in amd)[:512]}
        if nxt is None:
            return self.skipped("amdgpu-driver", "no installed kernel found to judge the next "
                                "boot by", evidence=ev)
        search = kernels.gpu_modules(host, nxt.release, "amdgpu")
        ev.update(next_boot=nxt.release, next_boot_how=nxt.how)
        if not search.indexed:
            return self.skipped("amdgpu-driver", f"{nxt.release} has no modules.dep to judge",
                                evidence=ev)
        if search.modules:
            ev["next_boot_module"] = search.modules[0].path
            return self.passed("amdgpu-driver", f"the next boot's kernel {nxt.release} carries "
                               f"amdgpu ({search.modules[0].path}) for {len(amd)} AMD GPU(s)",
                               evidence=ev)
        if search.dkms_built:
            ev["dkms_built"] = " ".join(search.dkms_built)
        return self.failed(
            "amdgpu-driver", f"the next boot starts {nxt.release} ({nxt.how}), whose "
            "modules.dep has no amdgpu module: the reboot comes up without its "
            f"{len(amd)} AMD GPU(s)", observed="no amdgpu module", expected="amdgpu.ko",
            evidence=ev, fix=f"install the amdgpu module for {nxt.release}")

    # -- the fix (advice only: a kernel and a driver are the operator's choice) ------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Advise the kernel, driver or module to install; nothing runs unless uncommented."""
        from auditor.remedy import Advice, Remedy, evidence
        remedies: list[Remedy] = []
        cpuinfo = files.read_optional(host, "/proc/cpuinfo") or ""
        arch = "arm64" if "CPU implementer" in cpuinfo and "vendor_id" not in cpuinfo else "amd64"
        for finding in findings:
            ev = evidence(finding)
            if finding.subject == "kernel":
                remedies.append(self._kernel_remedy(finding, ev, context, arch))
            elif finding.subject == "nvidia-driver":
                remedies.append(self._driver_remedy(host, finding, ev))
            elif finding.subject == "amdgpu-driver":
                release = ev.get("next_boot", "")
                advice = []
                if kernels.dkms_versions(host, "amdgpu"):
                    advice.append(Advice("build amdgpu-dkms for the next kernel",
                                         ("dkms", "autoinstall", "-k", release)))
                if bootloader_family(context.os_release) == "ubuntu" and \
                        kernels.is_release(release):
                    advice.append(Advice("Ubuntu ships amdgpu in linux-modules-extra",
                                         ("apt", "install", f"linux-modules-extra-{release}")))
                advice.append(Advice(f"do not reboot into {release} until it carries amdgpu"))
                remedies.append(Remedy(check=self.id, subject="amdgpu-driver",
                                       title=f"no amdgpu module for {release}",
                                       advice=tuple(advice)))
        return remedies

    def _kernel_remedy(self, finding: Finding, ev: dict[str, str], context: FixContext,
                       arch: str) -> Remedy:
        from auditor.remedy import Advice, Remedy
        minimum = ev.get("minimum", "") or self.options.minimum
        running = ev.get("running", finding.observed)
        advice: list[Advice] = []
        newer = ev.get("installed_newer", "")
        if newer:
            advice.append(Advice(f"kernel {newer} is installed already: reboot into it"))
        if ev.get("next_boot"):
            advice.append(Advice(f"the next boot would start {ev['next_boot']} (line "
                                 f"{ev.get('next_boot_line', '?')}): remove it or make the "
                                 f"running line's kernel the default"))
            advice.extend(default_kernel_advice(running, context.os_release))
        held = ev.get("kernel_held", "").split()
        apt_held = [w for w in held if w.startswith(KERNEL_PACKAGES)]
        if apt_held:
            advice.append(Advice("release the hold that keeps the kernel back (apt-mark "
                                 "hold)", ("apt-mark", "unhold", *apt_held)))
        if any(w.endswith(f"({packages.VERSIONLOCK})") for w in held):
            advice.append(Advice("release the dnf versionlock that keeps the kernel back",
                                 ("dnf", "versionlock", "delete", "kernel*")))
        if any(w.endswith(f"({packages.DNF_CONF})") for w in held):
            advice.append(Advice(f"remove the kernel from exclude= in {packages.DNF_CONF}"))
        enough = bool(newer) and version_tuple(newer) >= version_tuple(minimum)
        command = upgrade_command(running, minimum, context.os_release, arch)
        if enough or (newer and finding.status is not Status.FAIL) or ev.get("next_boot"):
            pass
        elif command:
            advice.append(Advice(f"install a newer kernel of the same line ({minimum} or newer "
                                 "where a minimum applies), then reboot", command))
        else:
            advice.append(Advice(f"install a kernel >= {minimum} of the same line with this "
                                 "distribution's tools, then reboot"))
        return Remedy(check=self.id, subject="kernel",
                      title=f"kernel {running}: {finding.message[:120]}",
                      advice=tuple(advice), reboot=True)

    def _driver_remedy(self, host: Host, finding: Finding, ev: dict[str, str]) -> Remedy:
        from auditor.remedy import Advice, Remedy
        advice: list[Advice] = []
        release = ev.get("next_boot", "")
        if ev.get("module_fix") and kernels.is_release(release):
            if ev.get("dkms_sources"):
                advice.append(Advice(f"build and install the nvidia module for {release} "
                                     "with DKMS", ("dkms", "autoinstall", "-k", release)))
            running = ev.get("running", "")
            prebuilt = [p.name for p in packages.dpkg_packages(host).installed(
                "linux-modules-nvidia-") if running and p.name.endswith("-" + running)]
            if prebuilt:
                name = prebuilt[0][: -len(running)] + release
                advice.append(Advice("install the precompiled module of the same branch for "
                                     f"{release}", ("apt", "install", name)))
            if not advice:
                advice.append(Advice(f"install the NVIDIA kernel module for {release} from "
                                     "the same source as the running one"))
            advice.append(Advice(f"do not reboot into {release} until it carries the module"))
        if ev.get("blackwell") and ("R" in finding.message or "open" in finding.message):
            advice.append(Advice(
                f"install the NVIDIA open driver >= {self.options.blackwell_min_driver} from "
                "the same source as the current one (nvidia-driver-5xx-open, or NVIDIA's "
                "installer with -m=kernel-open), then reboot"))
        if "next boot" in finding.message and "mismatch" in finding.message:
            advice.append(Advice("rebuild or reinstall the next kernel's nvidia module at the "
                                 "userspace driver's version before rebooting"))
        if not advice:
            advice.append(Advice("load or install the NVIDIA driver"))
        return Remedy(check=self.id, subject="nvidia-driver",
                      title=f"NVIDIA driver {ev.get('version', finding.observed)}: "
                            f"{finding.message[:100]}",
                      advice=tuple(advice), reboot=True)


def default_kernel_advice(running: str, os_release: Mapping[str, str]) -> list[Advice]:
    """Return the family's own way to make ``running`` the kernel the next boot starts."""
    from auditor.remedy import Advice
    if not kernels.is_release(running):
        return []
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    if ids & RHEL_LIKE:
        # grubby edits BLS entries and grubenv's saved_entry (RHEL 8 and later, Fedora).
        return [Advice("make the running kernel the default (grubby)",
                       ("grubby", "--set-default", f"/boot/vmlinuz-{running}"))]
    if ids & {"suse", "sles", "opensuse", "opensuse-leap", "opensuse-tumbleweed"}:
        # perl-Bootloader: after removing the other kernel, regenerate the boot menu.
        return [Advice("after removing the other kernel, refresh SUSE's boot loader "
                       "configuration", ("update-bootloader", "--refresh"))]
    if ids & {"debian", "ubuntu"}:
        return [Advice("after removing the other kernel, regenerate grub.cfg",
                       ("update-grub",))]
    return []


def bootloader_family(os_release: Mapping[str, str]) -> str:
    """Return ``ubuntu`` for Ubuntu and its derivatives, else the os-release ID."""
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    return "ubuntu" if "ubuntu" in ids else os_release.get("ID", "")

