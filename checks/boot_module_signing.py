"""boot.module_signing: will the GPUs come back after the next reboot under Secure Boot, and is
the driver flavour one the GPUs can use?

With UEFI Secure Boot on, distribution kernels lock down (``integrity``) and load only modules
signed by a key the kernel trusts: the distribution's, or a Machine Owner Key enrolled
through shim's MokManager. A DKMS-built ``nvidia.ko`` is signed with DKMS's own key
(``/var/lib/dkms/mok.pub``, or Ubuntu's ``/var/lib/shim-signed/mok/MOK.der``): not enrolled,
the next kernel's module is refused ("Key was rejected by service";
NVIDIA/gpu-driver-container#44, linux-surface/linux-surface#906, dkms-project/dkms#347) and
the host reboots without GPUs. Enrollment needs the console (MokManager at the next boot),
so the fix is the operator's commands, not a script.

Evidence, strongest first: ``SecureBoot-8be4df61-...`` (its 5th byte, after 4 bytes of
attributes, is 1 when on), ``/sys/kernel/security/lockdown``, ``module.sig_enforce`` on the
command line or ``CONFIG_MODULE_SIG_FORCE`` in the next kernel's config; the key is enrolled
when its DER bytes are in ``MokListRT``, or when Secure Boot enforces and the nvidia module
DKMS built is loaded now (the kernel accepted that key). Modules a distribution ships
prebuilt (Ubuntu's ``linux-modules-nvidia-*``) carry its own signature.

Flavour: Blackwell GPUs need NVIDIA's open kernel module (the proprietary one does not drive
them), and NVIDIA recommends the open module from Turing on (its default since R560, NVIDIA's
kernel-modules page): *fail* and *warn*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import files, kernels, nvidia, pci
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import kernel_cmdline_params

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

EFI = "/sys/firmware/efi"
EFIVARS = f"{EFI}/efivars"
SECURE_BOOT = f"{EFIVARS}/SecureBoot-8be4df61-93ca-11d2-aa0d-e39d2bb0d4e2"
MOK_LIST = f"{EFIVARS}/MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23"
MOK_LIST_TABLE = f"{EFI}/mok-variables/MokListRT"
LOCKDOWN = "/sys/kernel/security/lockdown"
CMDLINE = "/proc/cmdline"
DKMS_KEYS = ("/var/lib/dkms/mok.pub", "/var/lib/shim-signed/mok/MOK.der")
#: Turing (TU1xx) is the first generation NVIDIA's open module drives.
TURING_FIRST = 0x1E00


class Enforcement(NamedTuple):
    """Whether the kernel refuses unsigned modules, and why it is believed."""

    #: True, False, or None when nothing could be read.
    on: bool | None
    why: str


def enforcement(host: Host, next_release: str) -> Enforcement:
    """Return whether module signatures are enforced (Secure Boot, lockdown, sig_enforce)."""
    secure = files.read_bytes(host, SECURE_BOOT, 64)
    if secure is not None and len(secure) >= 5 and secure[4] == 1:
        return Enforcement(True, "UEFI Secure Boot is on")
    lockdown = files.read_optional(host, LOCKDOWN)
    if lockdown and "[" in lockdown and "[none]" not in lockdown:
        selected = lockdown[lockdown.find("[") + 1:lockdown.find("]")][:32]
        return Enforcement(True, f"the kernel is locked down ({selected})")
    cmdline = files.read_optional(host, CMDLINE)
    if cmdline is not None and kernel_cmdline_params(cmdline).get("module.sig_enforce") in (
            "1", "y", "Y"):
        return Enforcement(True, "module.sig_enforce=1 on the command line")
    config = kernels.kernel_config(host, next_release) if next_release else None
    if config and config.get("CONFIG_MODULE_SIG_FORCE") == "y":
        return Enforcement(True, f"kernel {next_release} is built with CONFIG_MODULE_SIG_FORCE")
    if secure is not None:
        return Enforcement(False, "UEFI Secure Boot is off")
    if not host.exists(EFI) and cmdline is not None:
        return Enforcement(False, "booted without UEFI (no /sys/firmware/efi)")
    if lockdown is not None:
        return Enforcement(False, "lockdown is none and Secure Boot's variable was not read")
    return Enforcement(None, "neither Secure Boot's variable nor the lockdown state was "
                             "collected")


def enrolled_key(host: Host) -> tuple[str, bool | None]:
    """Return DKMS's signing certificate and whether MokListRT holds it (None: unknown)."""
    for path in DKMS_KEYS:
        der = files.read_bytes(host, path, 1 << 16)
        if der:
            for table in (MOK_LIST, MOK_LIST_TABLE):
                listed = files.read_bytes(host, table, 1 << 20)
                if listed is not None:
                    return path, der in listed
            return path, None
    return "", None


class BootModuleSigning(Check[CheckOptions]):
    """Under Secure Boot the next kernel's NVIDIA module must be signed by an enrolled key."""

    id: ClassVar[str] = "boot.module_signing"
    severity: ClassVar[Severity] = Severity.CRITICAL
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        EFI, SECURE_BOOT, MOK_LIST, MOK_LIST_TABLE, LOCKDOWN, CMDLINE, *DKMS_KEYS,
        kernels.KERNEL_CONFIGS, *kernels.RELEASE_READS, *kernels.NEXT_BOOT_READS,
        *kernels.MODULE_READS, *nvidia.DRIVER_READS, *pci.DEVICE_READS, *where.READS,
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})
    rationale: ClassVar[str] = (
        "Under Secure Boot a DKMS-built NVIDIA module signed by a key the firmware does not "
        "hold is refused at the next boot, and the host comes up without GPUs; Blackwell "
        "GPUs are not driven by the proprietary module at all."
    )
    remedy: ClassVar[str] = (
        "Enroll DKMS's key (mokutil --import /var/lib/dkms/mok.pub, then confirm in "
        "MokManager at the console on the next boot), or use the distribution's signed "
        "prebuilt modules; install the open kernel module flavour for Turing and newer GPUs."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        if not gpus:
            yield self.skipped("signing", "no NVIDIA GPU driven on this host")
            return
        env = where.environment(host)
        if env.in_container:
            yield self.skipped("signing", f"{env.inside()}: the kernel, its modules and Secure "
                               "Boot are the host's; audit the host")
            return
        yield self._signing(host)
        flavour = self._flavour(host, gpus)
        if flavour is not None:
            yield flavour

    def _signing(self, host: Host) -> Finding:
        running = kernels.running_kernel(host) or ""
        installed = kernels.installed_kernels(host)
        nxt = kernels.next_boot(host, running, installed)
        release = nxt.release if nxt else running
        state = enforcement(host, release)
        ev = {"enforcement": state.why, "next_kernel": release,
              "next_how": nxt.how if nxt else ""}
        if state.on is None:
            return self.skipped("signing", f"{state.why}: whether the next boot enforces module "
                                "signatures is unknown", evidence=ev)
        search = kernels.gpu_modules(host, release, "nvidia") if release else None
        modules = [m for m in (search.modules if search else ()) if m.driver == "nvidia"]
        if not state.on:
            return self.passed("signing", f"{state.why}: the next kernel ({release}) loads the "
                               "NVIDIA module unsigned too", evidence=ev)
        if not modules:
            return self.skipped("signing", f"{state.why}, and kernel {release} carries no "
                                "nvidia module (kernel.version judges that)", evidence=ev)
        module = modules[0]
        ev.update(module=module.path, origin=module.origin)
        if module.origin == "precompiled":
            return self.passed("signing", f"{state.why}; kernel {release}'s {module.path} is "
                               "the distribution's prebuilt module, signed with its key",
                               evidence=ev)
        key, listed = enrolled_key(host)
        loaded = nvidia.loaded_driver(host)
        running_dkms = any(m.origin == "dkms" for m in kernels.gpu_modules(
            host, running, "nvidia").modules) if running else False
        ev.update(key=key, enrolled={True: "yes", False: "no", None: "unknown"}[listed])
        fix = (f"mokutil --import {key or '/var/lib/dkms/mok.pub'}, reboot and confirm the key "
               "in MokManager at the console")
        if module.origin == "dkms" and not key:
            return self.failed(
                "signing", f"{state.why}, and kernel {release}'s {module.path} is built by "
                "DKMS with no signing key on the host (/var/lib/dkms/mok.pub): the next boot "
                "refuses it and comes up without GPUs",
                observed="unsigned", expected="signed by an enrolled key",
                fix="dkms generates /var/lib/dkms/mok.key on its next build: rebuild "
                    f"(dkms autoinstall -k {release}), then {fix}", evidence=ev)
        if module.origin == "dkms" and listed is False:
            return self.failed(
                "signing", f"{state.why}, and kernel {release}'s {module.path} is signed with "
                f"{key}, which MokListRT does not hold: the next boot refuses it ('Key was "
                "rejected by service') and comes up without GPUs",
                observed="signing key not enrolled", expected="signed by an enrolled key",
                fix=fix, evidence=ev)
        if module.origin == "dkms" and (listed or (loaded is not None and running_dkms)):
            how = ("MokListRT holds it" if listed else "the kernel loaded the running "
                   "kernel's DKMS module under enforcement")
            return self.passed("signing", f"{state.why}; kernel {release}'s {module.path} is "
                               f"signed with {key}, and {how}", evidence=ev)
        return self.warned(
            "signing", f"{state.why}, and whether kernel {release}'s {module.path} "
            f"({module.origin}) is signed by an enrolled key cannot be read from files "
            "(MokListRT not collected, or a vendor-built module)",
            observed="unknown", expected="signed by an enrolled key", fix=fix, evidence=ev)

    def _flavour(self, host: Host, gpus: list[pci.PciDevice]) -> Finding | None:
        loaded = nvidia.loaded_driver(host)
        if loaded is None or loaded.flavour == "unknown":
            return None
        blackwell = [g for g in gpus if g.device is not None and nvidia.is_blackwell(g.device)]
        newer = [g for g in gpus if g.device is not None and g.device >= TURING_FIRST]
        ev = {"flavour": loaded.flavour, "version": loaded.version,
              "gpus": " ".join(f"{g.address}:{g.device:04x}" for g in gpus
                               if g.device is not None)[:512]}
        if loaded.flavour == "open":
            return self.passed("flavour", f"the open kernel module {loaded.version} drives "
                               f"{len(gpus)} GPU(s)", evidence=ev, observed="open")
        if blackwell:
            return self.failed(
                "flavour", f"the proprietary kernel module {loaded.version} is loaded with "
                f"{len(blackwell)} Blackwell GPU(s): it does not drive them; Blackwell needs the "
                "open module", observed="proprietary", expected="open", evidence=ev,
                fix="install the driver's -open packages (nvidia-driver-<branch>-open, "
                    "nvidia-open on RHEL) and reboot")
        if newer:
            return self.warned(
                "flavour", f"the proprietary kernel module {loaded.version} drives "
                f"{len(newer)} Turing-or-newer GPU(s): NVIDIA recommends the open module for "
                "them (its default since R560)", observed="proprietary", expected="open",
                evidence=ev, fix="install the driver's -open packages and reboot")
        return self.passed("flavour", f"the proprietary module {loaded.version} drives GPUs "
                           "older than Turing, which the open module does not support",
                           evidence=ev, observed="proprietary")

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Name the operator's commands: enrollment needs the console, flavour a reinstall."""
        from auditor.remedy import Advice, Remedy
        remedies: list[Remedy] = []
        for finding in findings:
            ev = dict(finding.evidence)
            argv: tuple[str, ...] = ()
            if finding.subject == "signing" and ev.get("key"):
                argv = ("mokutil", "--import", ev["key"])
            remedies.append(Remedy(
                check=self.id, subject=finding.subject,
                title=("enroll the module signing key" if finding.subject == "signing"
                       else "the open kernel module"),
                advice=(Advice(finding.fix, argv),),
                notes=("MokManager asks for the password mokutil set at the next boot, at the "
                       "console (BMC or serial): plan the reboot",)
                if finding.subject == "signing" else ()))
        return remedies
