"""nvidia.modparams: options configured for the NVIDIA modules that are not the live values.

modprobe passes a module's options when it loads it (kmod, modprobe.d(5)); a file changed
after that, an initramfs holding an older copy, or an option the driver does not know (the
kernel logs "unknown parameter ... ignored" and loads the module without it) leaves the
configured value on disk and another one live. Live values:

- nvidia.ko: only ``/proc/driver/nvidia/params``, by registry name (its ``NVreg_*``
  parameters have permission 0; kernel-open/common/inc/nv-linux.h, nv-reg.h, nv-procfs.c);
- nvidia_uvm, nvidia_peermem: ``/sys/module/<module>/parameters/<name>`` (0444);
- nvidia_drm, nvidia_modeset: the same files, mode 0400: root only.

An initramfs that carries the modules (dracut ``add_drivers``, initramfs-tools' ``modules`` file
or an nvidia hook) loads them with its own copy of modprobe.d, taken when it was built
(initramfs-tools mkinitramfs ``copy_file config`` of /etc and /lib/modprobe.d; dracut
modules.d/90kernel-modules): an image older than a file that sets their options boots without
them. That is judged on the running kernel's image by file times, and a time the collection did
not keep is said, never taken for "older".

Values compare as the kernel stores them: booleans ``Y``/``N`` against ``1``/``0``/``y``...,
integers numerically (nvidia.ko's are 32-bit unsigned: ``-1`` reads back 4294967295), strings
as written without quotes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import files, kernels, modprobe, nvidia
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy

MODULES = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem")
#: nvidia.ko parameters that exist but are not printed in /proc/driver/nvidia/params
#: (NV_DEFINE_REG_ENTRY without a params-table entry, nv-reg.h; rm_firmware_active, nv.c).
UNPRINTED = frozenset({"NVreg_EnableNonblockingOpen", "NVreg_ExcludeAllGpus",
                       "NVreg_GpuInitOnProbe", "NVreg_RmNvlinkBandwidth",
                       "rm_firmware_active", "NVreg_AssignGpus"})
#: Live nvidia.ko values worth showing (nv-reg.h): what they change for P2P and power.
NOTABLE = ("EnableResizableBar", "EnablePCIERelaxedOrderingMode", "DynamicPowerManagement",
           "RegistryDwords", "RegistryDwordsPerDevice", "NvLinkDisable")
#: The subject of the initramfs finding.
INITRAMFS = "initramfs"
_STOPPERS = ("/bin/false", "/bin/true", "/usr/bin/false", "/usr/bin/true", "false", "true")


def _int(text: str) -> int | None:
    text = text.strip()
    try:
        return int(text, 0) if len(text) < 24 else None
    except ValueError:
        return None


def same_value(configured: str, live: str, *, unsigned32: bool = False) -> bool | None:
    """Return whether a configured option value is what reads back live, None if unknowable."""
    if live in ("Y", "N"):
        truth = modprobe.truthy(configured)
        return None if truth is None else truth == (live == "Y")
    left, right = _int(configured), _int(live)
    if left is not None and right is not None:
        if unsigned32:
            left &= 0xFFFFFFFF
        return left == right
    return configured.strip().strip('"') == live


class Drift(NamedTuple):
    """One configured option and what the loaded module has."""

    option: modprobe.ModOption
    live: str | None
    #: ``differs``, ``unknown`` (not a parameter of the module), ``unreadable``.
    kind: str


class NvidiaModparams(Check[CheckOptions]):
    """Options written for the NVIDIA modules but not live (no reload, stale initramfs, typos)."""

    id: ClassVar[str] = "nvidia.modparams"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *modprobe.READS,
        nvidia.PROC_PARAMS,
        *nvidia.DRIVER_READS,
        *(f"/sys/module/{m}" for m in MODULES),
        *(f"/sys/module/{m}/parameters/*" for m in MODULES),
        *modprobe.INITRAMFS_READS,
        *modprobe.IMAGE_READS,
        kernels.OSRELEASE,
        kernels.PROC_VERSION,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "A module option is read when the module loads: written afterwards, held in an older "
        "initramfs, overridden by a later file or the boot line, or misspelt (the kernel "
        "ignores unknown parameters), it is configured and not in effect. NVIDIA's P2P, "
        "resizable-BAR, power and HMM switches are module options: the fix that was "
        "written may not be the one running."
    )
    remedy: ClassVar[str] = (
        "Rebuild the initramfs where it carries the nvidia modules (update-initramfs -u -k "
        "all, dracut -f --regenerate-all), then reload the modules with no GPU process "
        "running, or reboot. Correct options the driver does not know."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment(host)
        config = modprobe.read_config(host)
        params = nvidia.live_params(host)
        ramfs = modprobe.initramfs(host, MODULES)
        judged = False
        for module in MODULES:
            options = config.effective(module)
            loaded = host.exists(f"/sys/module/{module}") or (module == "nvidia"
                                                                and params is not None)
            if not options and not (module == "nvidia" and params):
                continue
            if env.in_container:
                yield self.skipped(module, f"inside a {env.describe()}: the modules and their "
                                   "options are the host's; audit the host")
                judged = True
                continue
            judged = True
            yield self._judge(host, module, options, loaded, params, ramfs, config)
        if not judged:
            yield self.skipped("nvidia", "no NVIDIA module is loaded and none has options "
                               "configured")
        elif not env.in_container and ramfs.carries:
            yield self._image(host, ramfs, config)

    def _image(self, host: Host, ramfs: modprobe.Initramfs,
               config: modprobe.ModprobeConfig) -> Finding:
        """Judge whether the running kernel's initramfs carries the current options."""
        release = kernels.running_kernel(host) or ""
        age = modprobe.initramfs_age(host, release, config, MODULES)
        ev = {"initramfs": ramfs.tool, "initramfs_carries": ramfs.where, "kernel": release,
              "image": age.image, "files": " ".join(age.files)[:1024]}
        rebuild = " ".join(ramfs.rebuild)
        if age.unknown and not age.files:
            return self.passed(INITRAMFS, f"the initramfs carries the nvidia modules "
                               f"({ramfs.where}); {age.unknown}", evidence=ev)
        if age.unknown:
            return self.skipped(INITRAMFS, f"the initramfs carries the nvidia modules "
                                f"({ramfs.where}), but whether it holds the current options "
                                f"cannot be told: {age.unknown}", evidence=ev)
        if age.newer:
            ev["newer"] = " ".join(age.newer)[:1024]
            return self.warned(
                INITRAMFS, f"{age.image} is older than {', '.join(age.newer[:4])}: the "
                f"initramfs carries the nvidia modules ({ramfs.where}) and loads them with "
                "the options it was built with, so the newer options do not apply at boot; "
                f"rebuild it ({rebuild or 'with the tool that built it'})",
                observed=f"{age.image} older than the options", expected="rebuilt after them",
                fix=rebuild or "rebuild the initramfs", evidence=ev)
        return self.passed(
            INITRAMFS, f"{age.image} was built after the {len(age.files)} modprobe.d file(s) "
            "with options for the nvidia modules: it carries them", evidence=ev)

    def _judge(self, host: Host, module: str, options: dict[str, modprobe.ModOption],
               loaded: bool, params: dict[str, str] | None, ramfs: modprobe.Initramfs,
               config: modprobe.ModprobeConfig) -> Finding:
        ev: dict[str, str] = {"loaded": "yes" if loaded else "no",
                              "configured": " ".join(f"{o.name}={o.value}"
                                                     for o in options.values())[:1024]}
        if ramfs.tool:
            ev["initramfs"] = ramfs.tool
            if ramfs.carries:
                ev["initramfs_carries"] = ramfs.where
        if module == "nvidia" and params:
            for name in NOTABLE:
                if params.get(name):
                    ev[name] = params[name][:256]
        stoppers = [d for d in config.directives_for(module, "install")
                    if d.argument.split()[:1] and d.argument.split()[0] in _STOPPERS]
        if stoppers and not loaded:
            where = f"{stoppers[0].path}:{stoppers[0].line}"
            return self.warned(
                module, f"{where} replaces loading {module} with {stoppers[0].argument!r}: "
                "the module never loads, its options never apply", observed="not loaded",
                expected="loaded", evidence={**ev, "install": where})
        if not loaded:
            return self.passed(
                module, f"{module} is not loaded: its {len(options)} option(s) apply when it "
                "loads", observed="not loaded", evidence=ev)
        drifts = [d for d in (self._drift(host, module, o, params) for o in options.values())
                  if d is not None]
        for index, drift in enumerate(drifts[:16]):
            ev[f"drift{index}"] = f"{drift.option.name}={drift.option.value}"
            ev[f"drift{index}_at"] = drift.option.where
            ev[f"drift{index}_live"] = drift.live if drift.live is not None else ""
            ev[f"drift{index}_kind"] = drift.kind
        problems = [d for d in drifts if d.kind != "unreadable"]
        if not options:
            shown = ", ".join(f"{k}={ev[k]}" for k in NOTABLE if k in ev)
            return self.passed(module, f"no option configured for {module}"
                               + (f"; live: {shown}" if shown else ""), evidence=ev)
        if not problems:
            unreadable = [d.option.name for d in drifts]
            tail = (f"; {', '.join(unreadable)} cannot be read back (root-only or not "
                    "exported)") if unreadable else ""
            return self.passed(
                module, f"{len(options) - len(unreadable)} configured option(s) of {module} "
                f"are live{tail}", observed=ev["configured"], evidence=ev)
        parts = []
        for drift in problems[:6]:
            option = drift.option
            if drift.kind == "unknown":
                parts.append(f"{option.name}={option.value} ({option.where}) is not a "
                             f"parameter of the loaded {module}: the kernel ignored it")
            else:
                parts.append(f"{option.name}={option.value} ({option.where}) but the loaded "
                             f"module has {drift.live}")
        # Where the image was built after the options, the next boot applies them: only a
        # reload is missing. An image found older says so in its own finding (INITRAMFS).
        age = modprobe.initramfs_age(host, kernels.running_kernel(host) or "", config,
                                     MODULES) if ramfs.carries else None
        if age is not None and not age.unknown and not age.newer:
            ev["initramfs_current"] = age.image
            why = (f" {age.image}, which loads the nvidia modules at boot, was built after "
                   "them: it carries them to the next boot.")
        elif age is not None and age.newer:
            why = (f" {age.image}, which loads the nvidia modules at boot, predates "
                   f"{', '.join(age.newer[:4])}: rebuild it, or the next boot loads the old "
                   "options too.")
        elif ramfs.carries:
            why = (" The initramfs carries the nvidia modules "
                   f"({ramfs.where}): rebuild it, or the next boot loads the old options.")
        else:
            why = ""
        return self.warned(
            module, "configured but not live: " + "; ".join(parts) + "." + why
            + " Reload the module (no GPU process running) or reboot.",
            observed="; ".join(f"{d.option.name}={d.live}" for d in problems)[:512],
            expected="; ".join(f"{d.option.name}={d.option.value}" for d in problems)[:512],
            evidence=ev)

    def _drift(self, host: Host, module: str, option: modprobe.ModOption,
               params: dict[str, str] | None) -> Drift | None:
        if module == "nvidia":
            name = nvidia.registry_name(option.name)
            if params is None or name is None or option.name in UNPRINTED:
                return Drift(option, None, "unreadable")
            if name not in params:
                return Drift(option, None, "unknown")
            same = same_value(option.value, params[name], unsigned32=True)
            return None if same or same is None else Drift(option, params[name], "differs")
        directory = f"/sys/module/{module}/parameters"
        path = f"{directory}/{option.name}"
        if not host.lstat_follow_ok(path):
            try:
                listed = host.listdir(directory)
            except OSError:
                listed = []
            # A listing with other parameters and not this one: the module has no such
            # parameter. An empty one is a collection that could not read root-only files.
            return Drift(option, None, "unknown" if listed else "unreadable")
        live = files.read_optional(host, path)
        if live is None:
            return Drift(option, None, "unreadable")
        same = same_value(option.value, live)
        return None if same or same is None else Drift(option, live, "differs")

    # -- the fix (advice: a module reload stops every GPU process) ----------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Say how to make the configured options live: initramfs, reload, or reboot."""
        from auditor.remedy import Advice, Remedy, evidence

        remedies: list[Remedy] = []
        ramfs = modprobe.initramfs(host, MODULES)
        for finding in findings:
            ev = evidence(finding)
            if finding.subject == INITRAMFS:
                remedies.append(self._rebuild(ramfs, ev))
                continue
            advice: list[Advice] = []
            # Said once: by the initramfs finding where there is one, not where the image
            # already carries the options.
            rebuilt = any(f.subject == INITRAMFS for f in findings) or "initramfs_current" in ev
            if ramfs.carries and ramfs.rebuild and not rebuilt:
                advice.append(Advice(f"rebuild the initramfs, which carries the nvidia modules "
                                     f"({ramfs.where})", ramfs.rebuild))
            if "install" in ev:
                advice.append(Advice(f"remove the install line at {ev['install']} if "
                                     f"{finding.subject} should load"))
            unknown = [ev[k.removesuffix("_kind")] for k, v in ev.items()
                       if k.endswith("_kind") and v == "unknown"]
            if unknown:
                advice.append(Advice("correct or remove options the driver does not know: "
                                     + ", ".join(unknown)))
            advice.append(Advice(f"with no GPU process running, reload {finding.subject} (and "
                                 "the modules that use it), or reboot",
                                 ("modprobe", "-r", finding.subject)))
            remedies.append(Remedy(
                check=self.id, subject=finding.subject,
                title=f"make the configured options of {finding.subject} live",
                advice=tuple(advice), reboot=True,
            ))
        return remedies

    def _rebuild(self, ramfs: modprobe.Initramfs, ev: dict[str, str]) -> Remedy:
        """Say to rebuild every kernel's initramfs, so it carries the current modprobe.d.

        Advice, not a step: a RunCommand runs after steps of its remedy that changed a file
        (templates/fix.sh.j2 ``run_after``), and here no file is changed; where a fix writes
        the option (nvidia.uvm_hmm) it rebuilds the image after that write.
        """
        from auditor.remedy import Advice, Remedy

        newer = ev.get("newer", "")
        advice = [Advice(f"rebuild the initramfs, which carries the nvidia modules "
                         f"({ramfs.where}) and predates {newer or 'their options'}",
                         ramfs.rebuild)] if ramfs.rebuild else [
            Advice("rebuild the initramfs with the tool that built it (not recognised here)")]
        advice.append(Advice("then reboot, or reload the nvidia modules with no GPU process "
                             "running, for the options to apply"))
        return Remedy(check=self.id, subject=INITRAMFS,
                      title="rebuild the initramfs so it carries the current module options",
                      advice=tuple(advice), reboot=True)
