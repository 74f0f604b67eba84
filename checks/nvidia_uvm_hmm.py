"""nvidia.uvm_hmm: UVM's HMM left on where it breaks CUDA initialisation and P2P.

With HMM enabled, nvidia-uvm reserves a device-private physical range as large as each GPU's
memory (``devmem_alloc_pagemap`` -> ``request_free_mem_region``,
kernel-open/nvidia-uvm/uvm_pmm_gpu.c). With x86 KASLR randomising the direct map, that
search fails on some kernels (``request_free_mem_region() err -34``) and ``cuInit`` returns
"initialization error". NVIDIA lists it as a known issue (CUDA 12.9 and 13.x release notes:
"CUDA initialization can fail on certain Linux kernels with KASLR enabled"; workarounds
``nokaslr`` or ``options nvidia_uvm uvm_disable_hmm=1``); NVIDIA/open-gpu-kernel-modules#797,
#901, #947 report it, #1223 an HMM eviction deadlock on Blackwell.

The parameter (``module_param(uvm_disable_hmm, bool, 0444)``, kernel-open/nvidia-uvm/uvm_hmm.c)
defaults to false on x86_64 and true elsewhere; HMM needs a kernel built with
``CONFIG_HMM_MIRROR`` and ``CONFIG_DEVICE_PRIVATE`` (``UVM_IS_CONFIG_HMM``, uvm_linux.h) and is
off where ATS is on (Grace).

Configured is not live: a module parameter is read once, when the module loads
(``module_param`` values are parsed by ``load_module`` -> ``parse_args``, kernel/module/main.c;
a 0444 parameter cannot change afterwards). A host with ``uvm_disable_hmm=1`` written but
``N`` live runs with HMM on: it is judged by that live value, with the written setting named as
the pending fix (a reload of nvidia_uvm or a reboot applies it, and where the initramfs carries
the nvidia modules, an image built before the setting loads them without it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import files, kernels, modprobe, nvidia, pci
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.parsing import kernel_cmdline_params

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

MODULE = "nvidia_uvm"
PARAM = "uvm_disable_hmm"
LIVE = f"/sys/module/{MODULE}/parameters/{PARAM}"
MODULE_DIR = f"/sys/module/{MODULE}"
PROC_DEVICES = "/proc/devices"
CMDLINE = "/proc/cmdline"
CONF = "/etc/modprobe.d/nvidia-uvm-hmm.conf"
CONF_LINE = f"options {MODULE} {PARAM}=1"
INITRAMFS_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")


class UvmHmmOptions(CheckOptions):
    """Options of ``nvidia.uvm_hmm``."""

    min_gpus: int = option(
        2, minimum=1, maximum=64,
        help="the fewest NVIDIA GPUs for which HMM with KASLR is a finding (single GPUs are "
             "reported to fail too: set 1 to judge them)")
    blackwell: str = option(
        "fail", choices=("fail", "warn"),
        help="the status when a Blackwell GPU is among them")


class NvidiaUvmHmm(Check[UvmHmmOptions]):
    """UVM's HMM with KASLR on multi-GPU hosts fails cuInit and locks up P2P; turn it off."""

    id: ClassVar[str] = "nvidia.uvm_hmm"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        LIVE,
        MODULE_DIR,
        PROC_DEVICES,
        CMDLINE,
        kernels.CPUINFO,
        kernels.OSRELEASE,
        kernels.PROC_VERSION,
        kernels.KERNEL_CONFIGS,
        *modprobe.READS,
        *modprobe.INITRAMFS_READS,
        *modprobe.IMAGE_READS,
        *nvidia.DRIVER_READS,
        *pci.DEVICE_READS,
        *ENVIRONMENT_READS,
    )
    fix_reads: ClassVar[tuple[str, ...]] = (nvidia.OPERATOR_ROOT,)
    rationale: ClassVar[str] = (
        "With HMM on, nvidia-uvm reserves a device-private physical range as large as each "
        "GPU's memory; with KASLR on some kernels that reservation fails and cuInit returns "
        "'initialization error' (CUDA release notes, known issue; open-gpu-kernel-modules "
        "#797, #901). Multi-GPU Blackwell hosts are hit hardest: NCCL P2P locks up and an HMM "
        "eviction deadlock (#1223) needs a reboot. Inference engines do not use HMM (GPU "
        "access to pageable host memory)."
    )
    remedy: ClassVar[str] = (
        "options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d (and a rebuilt initramfs "
        "where it carries the nvidia modules), then reload nvidia_uvm with no CUDA process "
        "running, or reboot. nokaslr on the boot line also avoids the KASLR failure, at a "
        "security cost."
    )
    options_type: ClassVar[type[CheckOptions]] = UvmHmmOptions
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self._judge(host)

    def _judge(self, host: Host) -> Finding:
        env = environment(host)
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        blackwell = [g for g in gpus if g.device is not None and nvidia.is_blackwell(g.device)]
        live = files.read_optional(host, LIVE)
        config = modprobe.read_config(host)
        setting = config.effective(MODULE).get(PARAM)
        arch = kernels.machine(host)
        release = kernels.running_kernel(host) or ""
        build = kernels.kernel_config(host, release)
        params = kernel_cmdline_params(files.read_optional(host, CMDLINE) or "")
        ev = {
            "gpus": str(len(gpus)),
            "blackwell": " ".join(f"{g.address}={g.device:#06x}" for g in blackwell
                                  if g.device is not None),
            "live": live or "",
            "arch": arch,
            "kernel": release,
            "environment": env.describe(),
        }
        if setting is not None:
            ev["configured"] = setting.value
            ev["configured_at"] = setting.where
        if env.in_container:
            return self.skipped("nvidia_uvm", f"inside a {env.describe()}: nvidia_uvm and its "
                                "options are the host's; audit the host", evidence=ev)
        # The module registers its character device when it loads: /proc/devices tells a
        # loaded module whose /sys/module entry a capture left out.
        devices = (files.read_optional(host, PROC_DEVICES) or "")[:65536].split()
        loaded = host.exists(MODULE_DIR) or "nvidia-uvm" in devices
        if not gpus and not loaded and setting is None:
            return self.skipped("nvidia_uvm", "no NVIDIA GPU, nvidia_uvm is not loaded and not "
                                "configured", evidence=ev)
        if setting is not None and modprobe.truthy(setting.value) is None:
            return self.failed(
                "nvidia_uvm", f"{setting.where} sets {PARAM}={setting.value!r}, which is not a "
                "boolean: the kernel refuses it and nvidia_uvm does not load (no CUDA at all)",
                observed=setting.value, expected="1", fix=f"set {PARAM}=1 in {setting.where}",
                evidence=ev)
        configured_off = setting is not None and modprobe.truthy(setting.value) is True
        if live is None and loaded:
            return self.skipped("nvidia_uvm", f"nvidia_uvm is loaded but {LIVE} cannot be read",
                                evidence=ev)
        if live is None and not arch:
            return self.skipped("nvidia_uvm", "nvidia_uvm is not loaded and the CPU architecture "
                                "(which sets its default) cannot be read", evidence=ev)
        # What HMM is now (live) or will be when the module loads (default or configured).
        if live is not None:
            hmm_on = live.strip() in ("N", "n", "0")
            state = f"{PARAM}={live.strip()} (live)"
        else:
            hmm_on = not configured_off if arch == "x86_64" else (
                setting is not None and not configured_off)
            state = (f"nvidia_uvm not loaded; it would load with {PARAM}="
                     f"{'N' if hmm_on else 'Y'}")
        if build is not None and (build.get("CONFIG_DEVICE_PRIVATE", "n") == "n"
                                  or build.get("CONFIG_HMM_MIRROR", "n") == "n"):
            return self.passed(
                "nvidia_uvm", f"{state}, but kernel {release} is built without "
                "CONFIG_DEVICE_PRIVATE/CONFIG_HMM_MIRROR: UVM cannot use HMM",
                observed=live or "", evidence=ev)
        if not hmm_on:
            return self._off_or_pending(live, setting, state, ev)
        if arch and arch != "x86_64":
            return self.warned(
                "nvidia_uvm", f"{state} on {arch}: HMM is off by default here because NVIDIA "
                "found it broken on this architecture (uvm_hmm.c); something turned it on",
                observed=live or "N", expected="Y", fix=CONF_LINE, evidence=ev)
        kaslr = "nokaslr" not in params and (build is None
                                             or build.get("CONFIG_RANDOMIZE_BASE", "y") != "n")
        ev["kaslr"] = "on" if kaslr else "off"
        pending = ""
        fix = CONF_LINE + " in /etc/modprobe.d, then reload nvidia_uvm or reboot"
        if configured_off and setting is not None:
            # Judged by what runs (HMM on), not by what is written: the setting is the
            # pending fix, and the fix does not write it a second time.
            pending, fix = self._pending(host, setting, release, config, ev)
        count = f"{len(gpus)} NVIDIA GPU(s)"
        if not kaslr:
            if blackwell:
                return self.warned(
                    "nvidia_uvm", f"HMM is on ({state}) with KASLR off on {count}, "
                    f"{len(blackwell)} of them Blackwell: the KASLR failure is avoided, the HMM "
                    "eviction deadlock of open-gpu-kernel-modules #1223 is not" + pending,
                    observed=live or "N", expected="Y", fix=fix, evidence=ev)
            return self.passed(
                "nvidia_uvm", f"HMM is on ({state}) but KASLR is off (nokaslr): the known "
                f"cuInit failure does not apply to these {count}" + pending,
                observed=live or "N", evidence=ev)
        if len(gpus) < self.options.min_gpus:
            return self.passed(
                "nvidia_uvm", f"HMM is on ({state}) with KASLR, on {count}: below the "
                f"{self.options.min_gpus} GPUs judged (single GPUs are reported to fail "
                "cuInit on some kernels too: open-gpu-kernel-modules #797, #947)" + pending,
                observed=live or "N", evidence=ev)
        status = Status.FAIL if blackwell and self.options.blackwell == "fail" else Status.WARN
        what = (f"{count}, {len(blackwell)} of them Blackwell" if blackwell else count)
        return self.finding(
            status, "nvidia_uvm",
            f"UVM HMM is on ({state}) with KASLR on {what}: cuInit can fail "
            "(request_free_mem_region() err -34) and NCCL P2P can lock up" + pending,
            observed=live or "N", expected="Y (uvm_disable_hmm=1)", fix=fix, evidence=ev)

    def _pending(self, host: Host, setting: modprobe.ModOption, release: str,
                 config: modprobe.ModprobeConfig, ev: dict[str, str]) -> tuple[str, str]:
        """Return the message tail and fix naming a written setting that is not live yet."""
        ramfs = modprobe.initramfs(host, INITRAMFS_MODULES)
        tail = (f"; {setting.where} sets {PARAM}={setting.value}, not live yet: it applies "
                "once nvidia_uvm is reloaded (no CUDA process running) or the host reboots")
        fix = "reload nvidia_uvm with no CUDA process running (modprobe -r nvidia_uvm; " \
            "modprobe nvidia_uvm), or reboot"
        if not ramfs.carries or not setting.path:
            return tail, fix
        ev["initramfs_carries"] = ramfs.where
        age = modprobe.initramfs_age(host, release, config, INITRAMFS_MODULES)
        rebuild = " ".join(ramfs.rebuild) or "rebuild the initramfs"
        if age.unknown:
            ev["initramfs_age"] = age.unknown
            return (tail + f"; the initramfs carries the nvidia modules ({ramfs.where}) and "
                    f"whether it holds the setting cannot be told ({age.unknown})",
                    f"{rebuild} if it predates {setting.path}, then {fix}")
        if setting.path in age.newer:
            ev["initramfs_stale"] = age.image
            return (tail + f"; {age.image}, which loads the nvidia modules at boot, is older "
                    f"than {setting.path}: rebuild it ({rebuild}) or a reboot brings HMM back",
                    f"{rebuild}, then {fix}")
        return tail + f" ({age.image} already carries it)", fix

    def _off_or_pending(self, live: str | None, setting: modprobe.ModOption | None, state: str,
                        ev: dict[str, str]) -> Finding:
        if live is not None and setting is not None and modprobe.truthy(setting.value) is False:
            return self.warned(
                "nvidia_uvm", f"HMM is off now ({state}) but {setting.where} sets "
                f"{PARAM}={setting.value}: it comes back on when nvidia_uvm is reloaded or the "
                "host reboots", observed=f"{live} (configured: {setting.value})", expected="Y",
                fix=f"set {PARAM}=1 in {setting.where}", evidence=ev)
        source = f" ({setting.where})" if setting is not None else ""
        return self.passed("nvidia_uvm", f"HMM is off: {state}{source}",
                           observed=live or "Y", expected="Y", evidence=ev)

    # -- the fix ------------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Set uvm_disable_hmm=1 in modprobe.d, rebuild the initramfs where it carries nvidia."""
        from auditor.remedy import Advice, Remedy, ReplaceLine, RunCommand, WriteFile, evidence
        remedies: list[Remedy] = []
        for finding in findings:
            ev = evidence(finding)
            config = modprobe.read_config(host)
            steps: list[Step] = []
            notes: list[str] = []
            boot_params: tuple[str, ...] = ()
            for setting in config.options_for(MODULE):
                if setting.name != PARAM or modprobe.truthy(setting.value) is True:
                    continue
                if not setting.path:
                    boot_params = (f"{MODULE}.{PARAM}=1",)
                    continue
                real = host.resolve(setting.path)
                raw = modprobe_line(host, setting)
                if real.startswith("/etc/") and raw is not None:
                    steps.append(ReplaceLine(real, setting.line, raw,
                                             _set_true(raw, setting.name, setting.value)))
                else:
                    notes.append(f"{setting.where} sets {PARAM}={setting.value}: "
                                 f"{CONF} is written to override it")
            if not any(o.name == PARAM and modprobe.truthy(o.value) is True and o.path
                       for o in config.options_for(MODULE)):
                steps.insert(0, WriteFile(CONF, CONF_LINE + "\n"))
            ramfs = modprobe.initramfs(host, INITRAMFS_MODULES)
            rebuild: list[Advice] = []
            if ramfs.carries and ramfs.rebuild and steps:
                # Built after the edit, so the image carries it (initramfs-tools'
                # mkinitramfs copies modprobe.d; dracut's 90kernel-modules installs it).
                steps.append(RunCommand(ramfs.rebuild, after=tuple(range(len(steps))),
                                        undo=ramfs.rebuild))
                notes.append(f"the initramfs carries the nvidia modules ({ramfs.where}): it is "
                             "rebuilt so the option applies at boot")
            elif ramfs.carries and ramfs.rebuild and ev.get("initramfs_stale"):
                # The setting is written already; only the image lags behind it. A
                # RunCommand runs after a step of its remedy changed something, and none
                # does here: the rebuild is the first thing to do by hand.
                rebuild.append(Advice(f"rebuild the initramfs: {ev['initramfs_stale']} predates "
                                      "the setting and loads nvidia_uvm at boot",
                                      ramfs.rebuild))
            elif ramfs.carries and ramfs.rebuild and ev.get("initramfs_age"):
                notes.append(f"the initramfs carries the nvidia modules ({ramfs.where}): "
                             f"rebuild it ({' '.join(ramfs.rebuild)}) if it predates the "
                             "setting")
            if host.exists(nvidia.OPERATOR_ROOT):
                notes.append("the GPU Operator's driver container ignores the host's "
                             "modprobe.d: set uvm_disable_hmm=1 in its kernel-module-params "
                             "ConfigMap (nvidia-uvm.conf) too")
            remedies.append(Remedy(
                check=self.id, subject=finding.subject,
                title="turn UVM HMM off (uvm_disable_hmm=1)",
                persistent=tuple(steps), boot_params=boot_params, notes=tuple(notes),
                advice=(
                    *rebuild,
                    Advice("with no CUDA process running (stop the inference server, "
                           "nvidia-persistenced, dcgm), reload nvidia_uvm to apply it now",
                           ("modprobe", "-r", MODULE)),
                    Advice("then load it again", ("modprobe", MODULE)),
                ),
                reboot=True,
            ))
        return remedies


def modprobe_line(host: Host, setting: modprobe.ModOption) -> str | None:
    """Return the physical line an option was read from, if it is one line, else None."""
    text = files.read_text(host, setting.path)
    if text is None:
        return None
    lines = text.split("\n")
    if not 1 <= setting.line <= len(lines):
        return None
    raw = lines[setting.line - 1]
    if raw.endswith("\\") or raw.strip() != setting.raw.strip() or "\ufffd" in raw:
        return None
    return raw


def _set_true(raw: str, name: str, value: str) -> str:
    """Return an options line with ``name=value`` (or a bare ``name``) set to 1."""
    words = raw.split(" ")
    for index, word in enumerate(words):
        if word in (f"{name}={value}", f'{name}="{value}"', name):
            words[index] = f"{name}=1"
    return " ".join(words)
