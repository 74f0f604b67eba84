"""nvidia.driver: the loaded kernel module against the installed userspace, and who upgrades it.

NVML and the CUDA driver library refuse a kernel module of another version: after an upgrade
of the userspace (``libnvidia-ml.so.<v>``, ``libcuda.so.<v>``) under a running module, every new
process gets "Failed to initialize NVML: Driver/library version mismatch" or
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, while processes already running carry on
(canonical/ubuntu-server-documentation#369; oddmario/NVIDIA-Ubuntu-Driver-Guide#4). Unattended
upgrades cause it: Ubuntu ships NVIDIA driver updates through the -security pocket that
unattended-upgrades follows by default (pando85/homelab#4110).

Three subjects: ``userspace`` (module against libraries, per root: the host's and the GPU
Operator's ``/run/nvidia/driver``), ``upgrades`` (a pending reboot for NVIDIA packages,
unattended upgrades that do not keep NVIDIA packages back), ``nouveau`` (DCGM's deny-list:
an NVIDIA GPU bound to nouveau, NVIDIA/DCGM nvvs/src/Software.cpp ``checkDenylist``). The
next boot's module is ``kernel.version``'s ``nvidia-driver`` subject.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import kernels, modprobe, nvidia, packages, pci
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts import gpufiles
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy, Step

#: Package name prefixes of NVIDIA's driver on Debian and Ubuntu (distribution and CUDA repo).
NVIDIA_PACKAGES = ("nvidia-driver-", "nvidia-utils-", "nvidia-compute-utils-",
                   "nvidia-kernel-common-", "nvidia-kernel-source-", "nvidia-dkms-",
                   "nvidia-headless-", "libnvidia-", "linux-modules-nvidia-",
                   "linux-objects-nvidia-", "linux-signatures-nvidia-", "nvidia-fabricmanager",
                   "cuda-drivers", "xserver-xorg-video-nvidia-", "nvidia-firmware-")
APT_KEEP = "/etc/apt/apt.conf.d/51host-auditor-nvidia"
APT_KEEP_TEXT = (
    "// Written by host-auditor: unattended-upgrades must not replace the NVIDIA driver under\n"
    "// a running kernel module (new processes would fail with a version mismatch).\n"
    "Unattended-Upgrade::Package-Blacklist {\n"
    '    "nvidia-";\n    "libnvidia-";\n    "linux-modules-nvidia-";\n'
    '    "linux-objects-nvidia-";\n    "linux-signatures-nvidia-";\n    "cuda-drivers";\n'
    '    "xserver-xorg-video-nvidia-";\n};\n'
)
NOUVEAU_CONF = "/etc/modprobe.d/host-auditor-blacklist-nouveau.conf"
NOUVEAU_TEXT = ("# Written by host-auditor: nouveau must not take NVIDIA GPUs from the NVIDIA "
                "driver.\nblacklist nouveau\noptions nouveau modeset=0\n")


def nvidia_package(name: str) -> bool:
    """Return whether a package name is part of NVIDIA's driver."""
    return name.startswith(NVIDIA_PACKAGES)



def keep_back_how(tool: str) -> str:
    """Return how NVIDIA packages are kept out of ``tool``'s upgrades, naming the mechanism."""
    if tool == "unattended-upgrades":
        return (f"keep NVIDIA packages out of unattended upgrades: "
                f"Unattended-Upgrade::Package-Blacklist in {APT_KEEP}, or apt-mark hold")
    if tool == "dnf-automatic":
        return ("keep NVIDIA packages out of dnf-automatic: dnf versionlock add (the "
                "versionlock plugin), or exclude= in /etc/dnf/dnf.conf")
    return ("keep NVIDIA packages out of unattended upgrades (apt: "
            "Unattended-Upgrade::Package-Blacklist or apt-mark hold; dnf: dnf versionlock)")

class NvidiaDriver(Check[CheckOptions]):
    """The loaded NVIDIA module must match the installed userspace driver, and stay matched."""

    id: ClassVar[str] = "nvidia.driver"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *nvidia.DRIVER_READS,
        *nvidia.USERSPACE_READS,
        *pci.DEVICE_READS,
        *packages.DPKG_READS,
        *packages.UPGRADE_READS,
        *kernels.RELEASE_READS,
        *kernels.MODULE_READS,
        *modprobe.READS,
        *ENVIRONMENT_READS,
        *gpufiles.READS,
    )
    fix_reads: ClassVar[tuple[str, ...]] = modprobe.INITRAMFS_READS
    rationale: ClassVar[str] = (
        "NVML and the CUDA driver refuse a kernel module of another version: once the "
        "userspace driver is upgraded under a running module, every new process (the "
        "inference server's next restart, nvidia-smi, the device plugin) fails with "
        "'Driver/library version mismatch' until the module is reloaded or the host reboots. "
        "Unattended upgrades do this on their own schedule."
    )
    remedy: ClassVar[str] = (
        "Reload the NVIDIA modules with no GPU process running, or reboot, so the module "
        "matches the userspace; keep NVIDIA packages out of unattended upgrades "
        "(Unattended-Upgrade::Package-Blacklist, apt-mark hold, dnf versionlock) and upgrade "
        "them with a planned reboot."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        gpus = nvidia.gpus(host)
        driver = nvidia.loaded_driver(host)
        if driver is None and not gpus:
            yield self.skipped("userspace", "no NVIDIA driver loaded and no NVIDIA GPU")
            return
        held = [g for g in gpus if g.driver in nvidia.PASSTHROUGH_DRIVERS]
        if driver is None and gpus and len(held) == len(gpus):
            yield self.skipped("userspace", f"{len(gpus)} NVIDIA GPU(s) bound to a passthrough "
                               "driver: no host driver expected")
            return
        yield self._userspace(host, driver, gpus)
        env = environment(host)
        if env.in_container:
            # The image's own apt configuration and modprobe.d are not the host's: the
            # host's upgrade policy and its nouveau blacklist are judged on the host.
            why = (f"inside a {env.describe()}: the host's {{}} is judged on the host, not "
                   "from the image's own files")
            yield self.skipped("upgrades", why.format("upgrade policy"))
            if gpus:
                yield self.skipped("nouveau", why.format("nouveau blacklist"))
            return
        yield self._upgrades(host)
        if gpus:
            yield self._nouveau(host, gpus)

    # -- module against userspace -----------------------------------------------------------

    def _userspace(self, host: Host, driver: nvidia.LoadedDriver | None,
                   gpus: Sequence[pci.PciDevice] = ()) -> Finding:
        space = nvidia.userspace(host)
        # What the driver itself said where it was asked (NVML or nvidia-smi): the library
        # missing, or a version mismatch, is this check's to judge.
        from auditor.checks.lib import gpustate

        state = gpustate.state(host)
        said = state.error if state is not None else None
        bound = [g.address for g in gpus if g.driver == "nvidia"]
        ev: dict[str, str] = {"libraries": " ".join(
            f"{lib.path}" for lib in space.libraries)[:2048]}
        if space.unsearched:
            ev["ld_so_conf_unsearched"] = " ".join(space.unsearched)[:512]
        if driver is not None:
            ev.update(loaded=driver.version, flavour=driver.flavour)
        if said is not None:
            ev["driver_said"] = f"{said[0]}: {said[1]}"[:300]
        if said is not None and said[0] == "library_not_found" and bound:
            return self.failed(
                "userspace", f"{len(bound)} GPU(s) are bound to the nvidia driver "
                f"({', '.join(bound[:4])}) but there is no NVIDIA userspace to use them "
                f"({state.source if state else 'nvml'}: {said[1][:200]})",
                observed="no userspace", expected=driver.version if driver else "nvidia driver",
                evidence=ev, fix="install the userspace driver of the loaded module's version")
        if said is not None and said[0] == "version_mismatch":
            return self.failed(
                "userspace", f"the driver refuses the userspace: {said[1][:200]} (NVML and "
                "every new CUDA process fail until the module is reloaded or the host reboots)",
                observed=driver.version if driver else "mismatch",
                expected=", ".join(sorted(space.versions())) or "the module's version",
                evidence=ev, fix="reload the nvidia modules with no GPU process running, or "
                "reboot")
        if not space.libraries:
            where = (f"; ld.so.conf also names {', '.join(space.unsearched[:4])}, not searched"
                     if space.unsearched else "")
            if driver is None:
                return self.warned("userspace", "NVIDIA GPU(s) but neither the kernel module "
                                   "nor the userspace driver is installed" + where,
                                   observed="no driver", expected="nvidia driver", evidence=ev)
            return self.skipped("userspace", f"NVIDIA module {driver.version} is loaded but no "
                                "libcuda.so/libnvidia-ml.so was found in the library "
                                "directories" + where, evidence=ev)
        if driver is None:
            versions = sorted(space.versions())
            return self.failed(
                "userspace", f"the userspace driver ({', '.join(versions)}) is installed but no "
                "NVIDIA kernel module is loaded: NVML and CUDA cannot reach the GPUs",
                observed="no module", expected=versions[-1], evidence=ev)
        problems: list[str] = []
        for root in space.roots():
            mismatched = sorted({lib.version for lib in space.libraries
                                 if lib.root == root and lib.version != driver.version})
            if mismatched:
                files = [lib.path for lib in space.libraries
                         if lib.root == root and lib.version in mismatched]
                problems.append(f"{root} userspace {', '.join(mismatched)} "
                                f"({', '.join(files[:2])})")
        ev["roots"] = " ".join(space.roots())
        if not problems:
            return self.passed(
                "userspace", f"the loaded module and the userspace driver are both "
                f"{driver.version} ({', '.join(space.roots())})",
                observed=driver.version, expected=driver.version, evidence=ev)
        running = kernels.running_kernel(host) or ""
        on_disk = kernels.gpu_modules(host, running, "nvidia") if running else None
        disk_versions = sorted({m.version for m in on_disk.modules if m.version}) \
            if on_disk else []
        if disk_versions:
            ev["on_disk"] = " ".join(disk_versions)
        wanted = sorted(space.versions() - {driver.version})
        if disk_versions and set(disk_versions) & set(wanted):
            then = (f"; the {disk_versions[-1]} module is installed for {running}: reload the "
                    "modules or reboot to load it")
        elif disk_versions:
            then = (f"; the module installed for {running} is {', '.join(disk_versions)} too: "
                    "the userspace was upgraded without its kernel module")
        else:
            then = ""
        return self.failed(
            "userspace",
            f"the loaded NVIDIA module is {driver.version} but the " + "; ".join(problems)
            + ": every new process fails with 'Driver/library version mismatch' (processes "
            "already running keep working)" + then,
            observed=driver.version, expected=", ".join(wanted), evidence=ev,
            fix="reload the nvidia modules with no GPU process running, or reboot")

    # -- upgrades -------------------------------------------------------------------------------

    def _upgrades(self, host: Host) -> Finding:
        policy = packages.upgrade_policy(host)
        installed = [p for p in packages.dpkg_packages(host).installed()
                     if nvidia_package(p.name)]
        ev: dict[str, str] = {"tool": policy.tool, "kept": " ".join(policy.kept)[:512],
                              "packages": " ".join(p.name for p in installed)[:1024]}
        reboot = [p for p in policy.reboot_required if nvidia_package(p)
                  or p.startswith(("linux-image", "linux-modules"))]
        exposed = [p.name for p in installed if not p.held and not packages.kept_back(
            policy, p.name)]
        parts: list[str] = []
        if [p for p in reboot if nvidia_package(p)]:
            ev["reboot_required"] = " ".join(reboot)
            parts.append(f"a reboot is pending for NVIDIA packages ({', '.join(reboot[:6])}, "
                         "/var/run/reboot-required.pkgs)")
        if policy.tool and (exposed or (not installed and policy.tool == "dnf-automatic")):
            ev["exposed"] = " ".join(exposed)[:1024]
            ev["where"] = policy.where
            which = (f"{len(exposed)} NVIDIA package(s) ({', '.join(exposed[:4])})"
                     if exposed else "the NVIDIA packages, where its repositories carry them")
            parts.append(f"{policy.tool} is on ({policy.where}) and may upgrade {which} under "
                         "the running module: new processes then fail until a reboot")
        if not parts:
            why = (f"{policy.tool} is on but keeps the NVIDIA packages back" if policy.tool
                   else "no unattended upgrade tool is on")
            return self.passed("upgrades", why, evidence=ev)
        return self.warned("upgrades", "; ".join(parts), evidence=ev,
                           fix=f"{keep_back_how(policy.tool)}; upgrade them with a planned "
                               "reboot")

    # -- nouveau ------------------------------------------------------------------------------

    def _nouveau(self, host: Host, gpus: list[pci.PciDevice]) -> Finding:
        taken = [g.address for g in gpus if g.driver == "nouveau"]
        banned = modprobe.read_config(host).directives_for("nouveau", "blacklist")
        if taken and banned:
            where = f"{banned[0].path}:{banned[0].line}"
            return self.warned(
                "nouveau", f"nouveau is bound to {len(taken)} NVIDIA GPU(s) "
                f"({', '.join(taken[:4])}) although {where} blacklists it: reboot pending "
                "(and rebuild the initramfs if nouveau is loaded from it)",
                observed="nouveau", expected="nvidia",
                evidence={"gpus": " ".join(taken), "blacklist": where})
        if taken:
            return self.failed(
                "nouveau", f"nouveau is bound to {len(taken)} NVIDIA GPU(s) "
                f"({', '.join(taken[:4])}): the NVIDIA driver cannot use them",
                observed="nouveau", expected="nvidia", evidence={"gpus": " ".join(taken)})
        return self.passed("nouveau", f"no NVIDIA GPU is bound to nouveau ({len(gpus)} GPU(s))")

    # -- the fix ------------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Keep NVIDIA packages out of unattended upgrades; say how to reload; banish nouveau."""
        from auditor.remedy import Advice, Remedy, RunCommand, WriteFile
        from auditor.remedy import evidence as evidence_of
        remedies: list[Remedy] = []
        for finding in findings:
            ev = evidence_of(finding)
            if finding.subject == "userspace":
                remedies.append(Remedy(
                    check=self.id, subject="userspace",
                    title="load the kernel module that matches the userspace driver",
                    advice=(
                        Advice("stop every GPU process (inference servers, "
                               "nvidia-persistenced, dcgm, the device plugin), then unload "
                               "the modules", ("rmmod", "nvidia_uvm", "nvidia_drm",
                                               "nvidia_modeset", "nvidia")),
                        Advice("and load them again (or reboot instead)",
                               ("modprobe", "nvidia")),
                    ),
                    reboot=True,
                ))
            elif finding.subject == "upgrades":
                remedies.append(self._keep_back(host, ev))
            elif finding.subject == "nouveau":
                steps: list[Step] = [WriteFile(NOUVEAU_CONF, NOUVEAU_TEXT)]
                ramfs = modprobe.initramfs(host, ("nouveau",))
                if ramfs.rebuild:
                    steps.append(RunCommand(ramfs.rebuild, after=(0,), undo=ramfs.rebuild))
                remedies.append(Remedy(
                    check=self.id, subject="nouveau", title="blacklist nouveau",
                    persistent=tuple(steps), reboot=True,
                    advice=(Advice("reboot so the NVIDIA driver binds the GPUs"),),
                ))
        return remedies

    def _keep_back(self, host: Host, ev: dict[str, str]) -> Remedy:
        from auditor.remedy import Advice, Remedy, WriteFile
        steps: list[Step] = []
        advice: list[Advice] = []
        notes: list[str] = []
        if ev.get("tool") == "unattended-upgrades":
            steps.append(WriteFile(APT_KEEP, APT_KEEP_TEXT))
            exposed = [p for p in ev.get("exposed", "").split() if p]
            if exposed:
                advice.append(Advice("or hold the packages instead",
                                     ("apt-mark", "hold", *exposed[:32])))
        elif ev.get("tool") == "dnf-automatic":
            advice.append(Advice("lock the NVIDIA driver packages at their version",
                                 ("dnf", "versionlock", "add", "nvidia-*", "kmod-nvidia*",
                                  "cuda-drivers*")))
        if ev.get("reboot_required"):
            advice.append(Advice("reboot: NVIDIA packages were upgraded and wait for it"))
            notes.append(f"reboot-required.pkgs: {ev['reboot_required']}")
        return Remedy(check=self.id, subject="upgrades",
                      title=keep_back_how(ev.get("tool", "")),
                      persistent=tuple(steps), advice=tuple(advice), notes=tuple(notes),
                      reboot=bool(ev.get("reboot_required")))
