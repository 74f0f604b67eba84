"""iommu.mode: GPUs and RDMA NICs whose DMA the IOMMU translates, and IOMMU boot tokens
that do not do what they say.

With the IOMMU translating (an IOMMU group of type ``DMA`` or ``DMA-FQ``), every peer
transfer between GPUs, and every GPUDirect RDMA read, is remapped through the IOMMU, and
on many platforms routed up to the root complex. NCCL's troubleshooting guide: IO
virtualization "can interfere with GPU Direct by redirecting all PCI point-to-point
traffic to the CPU root complex, causing a significant performance reduction or even a
hang". Passthrough (``identity`` groups) keeps the IOMMU for VFIO and interrupt
remapping and leaves host DMA untranslated.

The type of each group is ``/sys/kernel/iommu_groups/N/type`` (kernel 5.11 and later,
Documentation/ABI/testing/sysfs-kernel-iommu_groups); before 5.11 it is inferred from the
command line and the kernel's build configuration, and the finding says so.

The next boot's line is the one every check shares (checks/lib/bootloader.py
``next_boot``): passthrough configured there but not booted is *pending a reboot* (a
warning whose fix is the reboot, never a second token), and passthrough booted but no longer
configured is a finding now, before the reboot translates the devices again. GeForce boards
are never a finding: the NVIDIA driver refuses them peer-to-peer and GPUDirect RDMA.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment
from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import bootloader, pci
from auditor.checks.lib.gpupath import (
    CMDLINE,
    NODE_READS,
    OSRELEASE,
    PEER_READS,
    VFIO_DRIVERS,
    architecture,
    cmdline_tokens,
    kernel_before,
    kernel_release,
    nvlink_c2c,
    params,
    peers,
    short_list,
)
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

IOMMU_CLASS = "/sys/class/iommu"
GROUPS = "/sys/kernel/iommu_groups"
KERNEL_CONFIGS = "/boot/config-*"
TRANSLATED = frozenset({"DMA", "DMA-FQ"})
PASSTHROUGH_PARAM = "iommu.passthrough=1"
TRANSLATED_PARAM = "iommu.passthrough=0"

#: Values each IOMMU driver parses; anything else is logged and ignored
#: (drivers/iommu/amd/init.c ``parse_amd_iommu_options``: "Unknown option";
#: drivers/iommu/intel/iommu.c ``intel_iommu_setup``). ``amd_iommu=pt`` is the classic
#: mistake: the host stays translated (kyuz0/amd-strix-halo-toolboxes#66).
AMD_IOMMU_OPTIONS = ("fullflush", "force_enable", "off", "force_isolation", "pgtbl_v1",
                     "pgtbl_v2", "irtcachedis", "nohugepages", "v2_pgsizes_only")
INTEL_IOMMU_OPTIONS = ("on", "off", "igfx_off", "forcedac", "strict", "sp_off", "sm_on",
                       "sm_off", "tboot_noforce")
#: arm-smmu-v3 before 6.11 cannot attach a PASID to an identity domain: under
#: passthrough nvidia_uvm's ATS/SVA bind fails and no CUDA context can be created
#: (NVIDIA/nodewright-packages nvidia-tuned/skyhook_dir/configure_iommu_passthrough.sh).
SMMU_IDENTITY_FIXED = (6, 11)


class IommuOptions(CheckOptions):
    """Options of ``iommu.mode``."""

    translated: str = option(
        "warn", choices=("warn", "fail"),
        help="the status of a GPU or RDMA NIC whose DMA the IOMMU translates on a host with "
             "peer traffic")


class _Mode(NamedTuple):
    """How the IOMMU treats one group: its type, and whether that was read or inferred."""

    type: str
    inferred: str = ""


def _passthrough_on_cmdline(tokens: Sequence[str], arch: str) -> bool | None:
    """Return the default domain the command line asks for (True: passthrough), or None.

    ``iommu.passthrough=`` (any arch) and ``iommu=pt`` / ``iommu=nopt`` (x86 only:
    arch/x86/kernel/pci-dma.c) are early parameters handled in order: the last wins.
    """
    choice: bool | None = None
    for token in tokens:
        key, _, value = token.partition("=")
        if key == "iommu.passthrough" and value in ("0", "1", "y", "n", "Y", "N", "on", "off"):
            choice = value in ("1", "y", "Y", "on")
        elif key == "iommu" and arch != "aarch64":
            for item in value.split(","):
                if item == "pt":
                    choice = True
                elif item == "nopt":
                    choice = False
    return choice


def _default_passthrough(host: Host) -> bool:
    """Return whether the running kernel's build defaults to passthrough domains."""
    release = kernel_release(host)
    config = pci.read_file(host, f"/boot/config-{release}", 1 << 20) if release and "/" not in \
        release else None
    return config is not None and "CONFIG_IOMMU_DEFAULT_PASSTHROUGH=y" in config


class IommuMode(Check[IommuOptions]):
    """GPUs and RDMA NICs should not sit in IOMMU-translated domains when they talk peer to peer."""

    id: ClassVar[str] = "iommu.mode"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *PEER_READS,
        CMDLINE,
        f"{IOMMU_CLASS}/*",
        f"{GROUPS}/*/type",
        OSRELEASE,
        KERNEL_CONFIGS,
        *pci.DEVICE_READS,
        *pci.IOMMU_GROUP_READS,
        *NODE_READS,
        *environment.READS,
        *bootloader.NEXT_BOOT_READS,
    )
    rationale: ClassVar[str] = (
        "With the IOMMU translating, every GPU-to-GPU transfer and every GPUDirect RDMA read is "
        "remapped by the IOMMU and often routed up to the root complex: NCCL's guide warns of "
        "\"a significant performance reduction or even a hang\", and 8-GPU all-reduce hangs "
        "and IO_PAGE_FAULTs with zeroed tensors have been traced to it. Passthrough "
        "(iommu.passthrough=1 or iommu=pt) keeps the IOMMU for VFIO and interrupt remapping "
        "while host DMA goes untranslated. amd_iommu=pt is not a valid value: the kernel "
        "ignores it and the host stays translated."
    )
    remedy: ClassVar[str] = (
        "Put iommu.passthrough=1 (or iommu=pt on x86) on the kernel command line and reboot. "
        "Never iommu=off on a host that passes devices to VMs through VFIO. A group's type can "
        "be changed at runtime only with every device in it unbound (echo identity > "
        "/sys/kernel/iommu_groups/N/type): the fix script only prints that procedure."
    )
    options_type: ClassVar[type[CheckOptions]] = IommuOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {"latency": {"translated": "fail"}}
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        if env.vm and not env.in_container:
            yield self.skipped("iommu", f"{env.describe()}: the hypervisor host's IOMMU "
                               "translates this guest's DMA; audit the host",
                               evidence={"environment": env.describe()})
            return
        if env.in_container:
            yield self.skipped("iommu", f"inside a {env.describe()}: the IOMMU and the boot "
                               "command line are the host's; audit the host",
                               evidence={"environment": env.describe()})
            return
        tokens = cmdline_tokens(host)
        arch = architecture(host)
        try:
            units = [n for n in host.listdir(IOMMU_CLASS)
                     if n.isprintable() and not n.startswith(".")][:256]
        except OSError:
            units = []
        lint = list(self._lint(tokens, arch))
        found = peers(host, exclude_vfio=True)
        vfio = [d.address for d in peers(host).devices if d.driver in VFIO_DRIVERS]
        base = {"cmdline_iommu": " ".join(t for t in tokens if t.startswith(
                    ("iommu", "amd_iommu", "intel_iommu")))[:400],
                "iommu_units": short_list(units, 8), "architecture": arch,
                "kernel": kernel_release(host)}
        if vfio:
            base["vfio_devices"] = short_list(vfio)
        if not units:
            yield from lint
            yield self.passed("iommu", f"no IOMMU driver is active ({IOMMU_CLASS} is empty): "
                              "DMA is not translated", evidence=base)
            return
        if not found.devices:
            yield from lint
            reason = ("every GPU and RDMA NIC is bound to vfio-pci: a passthrough host needs "
                      "the IOMMU" if vfio else "no GPU or RDMA NIC")
            yield self.skipped("iommu", reason, evidence=base)
            return
        if not found.traffic:
            yield from lint
            yield self.skipped("iommu", f"no peer DMA ({found.describe()}): translation costs "
                               "little without GPU-to-GPU or GPUDirect RDMA traffic",
                               evidence={**base, "peers": found.describe()})
            return
        groups = self._group_members(host)
        # The next boot's line, as boot.cmdline and every other check read it: passthrough
        # configured but not booted is pending a reboot, not a fix to write again.
        nxt = bootloader.next_boot(host)
        base.update(nxt.evidence())
        live_choice = _passthrough_on_cmdline(tokens, arch)
        next_choice = _passthrough_on_cmdline(nxt.tokens, arch) if nxt.known else live_choice
        pending_pt = next_choice is True and live_choice is not True
        pt_source = next(
            (nxt.source(t) for t in reversed(nxt.tokens)
             if t.startswith(("iommu.passthrough=", "iommu="))), "") if nxt.known else ""
        refused = {d.address for d in found.refused}
        old_smmu = (arch == "aarch64" and any(u.startswith("smmu3.") for u in units)
                    and kernel_before(host, SMMU_IDENTITY_FIXED) is True)
        # Passthrough is one switch for the whole host: where it would break the NVIDIA
        # GPUs (arm-smmu-v3 before 6.11) it is not recommended for the NICs either.
        keep_translated = old_smmu and any(d.is_nvidia_gpu for d in found.gpus)
        translated_devices: list[str] = []
        findings: list[Finding] = []
        for device in found.devices:
            group = pci.iommu_group(host, device.address)
            mode = self._mode(host, group, tokens, arch)
            kind = "GPU" if device.is_gpu else "RDMA NIC"
            what = f"{pci.vendor_name(device.vendor)} {kind}"
            members = groups.get(group or "", [])
            ev = {**base, "group": group or "", "type": mode.type, "driver": device.driver,
                  "class": f"{device.class_code or 0:#08x}", "peers": found.describe(),
                  "group_devices": short_list(members)}
            if mode.inferred:
                ev["inferred"] = mode.inferred
            how = f" ({mode.inferred})" if mode.inferred else ""
            if device.address in refused:
                # Rule 9: the NVIDIA driver gives GeForce boards neither P2P nor GPUDirect
                # RDMA, so translation of their DMA costs no peer traffic.
                findings.append(self.passed(
                    device.address, f"{what}: a GeForce board, which the driver refuses "
                    f"peer-to-peer and GPUDirect RDMA: IOMMU group {group or 'none'} "
                    f"({mode.type}) carries none of its peer traffic", evidence=ev))
            elif group is None:
                findings.append(self.passed(device.address, f"{what}: in no IOMMU group, its "
                                            "DMA is not translated", evidence=ev))
            elif mode.type == "identity":
                if old_smmu and device.is_nvidia_gpu:
                    findings.append(self.warned(
                        device.address,
                        f"{what}: IOMMU group {group} is identity{how} on arm-smmu-v3 with "
                        f"kernel {kernel_release(host)} (before 6.11): nvidia_uvm cannot bind "
                        "ATS/SVA to an identity domain and no CUDA context can be created; "
                        "use iommu.passthrough=0 or a 6.11+ kernel",
                        observed="identity", expected="DMA (arm-smmu-v3 before 6.11)",
                        fix=TRANSLATED_PARAM, evidence={**ev, "problem": "smmu-identity"}))
                elif (nxt.known and live_choice is True and next_choice is not True
                      and not mode.inferred and not _default_passthrough(host)):
                    findings.append(self.warned(
                        device.address,
                        f"{what}: IOMMU group {group} is identity (passthrough) now, but the "
                        f"next boot's line ({nxt.describe()}) no longer asks for passthrough: "
                        "its peer DMA is translated after the reboot",
                        observed="identity", expected="identity at the next boot",
                        fix=PASSTHROUGH_PARAM,
                        evidence={**ev, "problem": "translated-next-boot"}))
                else:
                    findings.append(self.passed(device.address, f"{what}: IOMMU group {group} "
                                                f"is identity (passthrough){how}",
                                                observed="identity", evidence=ev))
            elif mode.type in TRANSLATED:
                if keep_translated:
                    findings.append(self.passed(
                        device.address,
                        f"{what}: IOMMU group {group} is {mode.type}{how}; kept translated "
                        "because passthrough breaks ATS/SVA on arm-smmu-v3 before 6.11",
                        observed=mode.type, evidence=ev))
                    continue
                translated_devices.append(device.address)
                c2c = " (its host traffic runs over NVLink-C2C; peer and NIC traffic still " \
                      "goes through the IOMMU)" if nvlink_c2c(host, device) else ""
                if pending_pt:
                    findings.append(self.warned(
                        device.address,
                        f"{what}: IOMMU group {group} is {mode.type}{how}: the IOMMU translates "
                        f"its peer DMA on a host with {found.describe()}{c2c}; passthrough is "
                        f"configured for the next boot ({pt_source or nxt.describe()}): "
                        "pending a reboot",
                        observed=mode.type, expected="identity",
                        fix=f"reboot into {nxt.release or 'the configured kernel'}",
                        evidence={**ev, "problem": "translated-pending"}))
                    continue
                status = self.failed if self.options.translated == "fail" else self.warned
                findings.append(status(
                    device.address,
                    f"{what}: IOMMU group {group} is {mode.type}{how}: the IOMMU translates "
                    f"its peer DMA on a host with {found.describe()}{c2c}",
                    observed=mode.type, expected="identity", fix=PASSTHROUGH_PARAM,
                    evidence={**ev, "problem": "translated"}))
            else:
                findings.append(self.skipped(device.address, f"{what}: IOMMU group {group} has "
                                             f"type {mode.type!r}: a driver manages its own "
                                             "domain (VFIO or a user-space driver)",
                                             evidence=ev))
        if translated_devices and _passthrough_on_cmdline(tokens, arch):
            lint.append(self.warned(
                "cmdline",
                "the command line asks for passthrough but "
                f"{len(translated_devices)} GPU/NIC group(s) are still translated: a later "
                "token (iommu=nopt, iommu.passthrough=0) or amd_iommu=force_isolation overrides "
                "it, or the devices are untrusted (external-facing ports get DMA domains)",
                evidence={**base, "devices": short_list(translated_devices),
                          "problem": "passthrough-ignored"}))
        yield from lint
        yield from findings

    def _lint(self, tokens: Sequence[str], arch: str) -> Iterable[Finding]:
        """Yield a warning for each IOMMU token the kernel ignores or contradicts."""
        for value in params(tokens, "amd_iommu"):
            unknown = [v for v in value.split(",") if v and not v.startswith(AMD_IOMMU_OPTIONS)]
            for item in unknown:
                hint = (": it is not a passthrough switch, the host stays translated; use "
                        "iommu=pt or iommu.passthrough=1" if item == "pt" else
                        ": the AMD IOMMU is on by default" if item == "on" else "")
                yield self.warned("cmdline", f"amd_iommu={item} is not a valid value: the kernel "
                                  f"logs \"AMD-Vi: Unknown option - '{item}'\" and ignores it"
                                  + hint, observed=f"amd_iommu={value}"[:80],
                                  evidence={"token": f"amd_iommu={value}"[:200],
                                            "problem": "invalid-token"})
        for value in params(tokens, "intel_iommu"):
            unknown = [v for v in value.split(",") if v and v not in INTEL_IOMMU_OPTIONS]
            for item in unknown:
                hint = ": use iommu=pt or iommu.passthrough=1" if item == "pt" else ""
                yield self.warned("cmdline", f"intel_iommu={item} is not a valid value: the "
                                  "kernel ignores it" + hint,
                                  observed=f"intel_iommu={value}"[:80],
                                  evidence={"token": f"intel_iommu={value}"[:200],
                                            "problem": "invalid-token"})
        iommu_values = [v for value in params(tokens, "iommu") for v in value.split(",")]
        if "off" in iommu_values and (
            "on" in [v for value in params(tokens, "intel_iommu") for v in value.split(",")]
            or params(tokens, "amd_iommu")
        ):
            yield self.warned("cmdline", "iommu=off contradicts the intel_iommu=/amd_iommu= "
                              "tokens beside it: iommu=off wins and no IOMMU is set up, so VFIO "
                              "passthrough cannot work", evidence={"problem": "contradiction"})
        if arch == "aarch64" and ("pt" in iommu_values or "nopt" in iommu_values):
            yield self.warned("cmdline", "iommu=pt is an x86 parameter: arm64 kernels ignore it; "
                              "use iommu.passthrough=1", evidence={"problem": "wrong-arch"})

    def _group_members(self, host: Host) -> dict[str, list[str]]:
        members: dict[str, list[str]] = {}
        for device in pci.devices(host):
            group = pci.iommu_group(host, device.address)
            if group is not None:
                members.setdefault(group, []).append(device.address)
        return members

    def _mode(self, host: Host, group: str | None, tokens: Sequence[str], arch: str) -> _Mode:
        if group is None:
            return _Mode("none")
        text = pci.read_file(host, f"{GROUPS}/{group}/type")
        if text is not None:
            kind = text.strip()
            return _Mode(kind if kind.isprintable() and len(kind) <= 16 else "unknown")
        # Before 5.11 there is no type file: the command line, then the build default.
        chosen = _passthrough_on_cmdline(tokens, arch)
        if chosen is not None:
            return _Mode("identity" if chosen else "DMA",
                         "inferred from the command line: this kernel has no type file")
        release = kernel_release(host)
        config = pci.read_file(host, f"/boot/config-{release}", 1 << 20) if release and "/" not in \
            release else None
        if config is not None and "CONFIG_IOMMU_DEFAULT_PASSTHROUGH=y" in config:
            return _Mode("identity", f"inferred from /boot/config-{release}: this kernel has "
                         "no type file")
        source = f"/boot/config-{release}" if config is not None else "the kernel's default"
        return _Mode("DMA", f"inferred from {source}: this kernel has no type file")

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Put passthrough on the boot line; print the runtime procedure as a manual step."""
        from auditor.remedy import Advice, Remedy, evidence
        problems = {evidence(f).get("problem", "") for f in findings}
        tokens = cmdline_tokens(host)
        notes: list[str] = []
        if "smmu-identity" in problems:
            return [Remedy(
                check=self.id, subject="iommu",
                title="translated IOMMU domains for the GPUs (arm-smmu-v3 before 6.11)",
                boot_params=(TRANSLATED_PARAM,),
                notes=("a 6.11 or later kernel can attach ATS/SVA to identity domains: after "
                       "upgrading, passthrough (iommu.passthrough=1) is the faster choice",),
                reboot=True,
            )]
        if "translated" not in problems and "translated-next-boot" not in problems:
            lint = [f for f in findings if f.subject == "cmdline"]
            if "translated-pending" in problems:
                # Passthrough is already configured: writing it again would duplicate it.
                nxt = bootloader.next_boot(host)
                return [Remedy(
                    check=self.id, subject="iommu",
                    title="IOMMU passthrough configured, pending a reboot",
                    advice=(Advice(f"reboot into {nxt.release or 'the configured kernel'} to "
                                   "boot with the configured passthrough"),
                            *(Advice(f"fix the boot configuration by hand: {f.message}")
                              for f in lint[:8])),
                    notes=(f"passthrough is configured for the next boot ({nxt.describe()}); "
                           "boot.cmdline reports it as pending a reboot",),
                    reboot=True)]
            if not lint:
                return []
            return [Remedy(
                check=self.id, subject="cmdline", title="IOMMU tokens that do not do what they say",
                advice=tuple(Advice(f"fix the boot configuration by hand: {f.message}")
                             for f in lint[:8]))]
        groups = sorted({evidence(f).get("group", "") for f in findings
                         if evidence(f).get("problem") in ("translated", "translated-next-boot")}
                        - {""})
        if any(v in ("pt",) for value in params(tokens, "amd_iommu") for v in value.split(",")):
            notes.append("remove amd_iommu=pt from the boot configuration by hand: it is not a "
                         "valid value and does nothing")
        if "nopt" in [v for value in params(tokens, "iommu") for v in value.split(",")]:
            notes.append("iommu=nopt is on the command line: remove it, or keep "
                         "iommu.passthrough=1 after it (the last one wins)")
        notes += [
            "passthrough keeps the IOMMU for VFIO and interrupt remapping; iommu=off does not, "
            "and breaks VFIO passthrough",
            "on AMD hosts iommu=pt / passthrough disables SEV-SNP confidential VMs",
            "on arm64 with arm-smmu-v3, kernels before 6.11 cannot run CUDA with identity "
            "domains: keep translated domains there",
            "a BIOS reset or update that turns the IOMMU back on, a GRUB drop-in that sets the "
            "line again, or tuned's [bootloader] plugin can undo this",
        ]
        procedure = (
            "to switch without a reboot: stop every GPU user (inference servers, "
            "nvidia-persistenced, dcgm), unbind each device of group(s) "
            f"{' '.join(groups[:16]) or '?'} from its driver, echo identity > "
            "/sys/kernel/iommu_groups/N/type for each group, then bind the devices again"
        )
        return [Remedy(
            check=self.id, subject="iommu",
            title="IOMMU passthrough for GPU and RDMA NIC DMA",
            boot_params=(PASSTHROUGH_PARAM,),
            notes=tuple(notes),
            advice=(Advice(procedure),) if "translated" in problems else (),
            reboot=True,
        )]
