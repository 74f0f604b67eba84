"""boot.module_signing: Secure Boot with a DKMS module and no key, a key not enrolled, a key
in MokListRT, the running DKMS module as proof of enrollment, a vendor-built module that
files cannot judge, Ubuntu's prebuilt modules in a Hyper-V Trusted Launch VM, lockdown,
Secure Boot off; the proprietary module on Grace-Blackwell and on H100; in a container."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    grace_blackwell,
    hyperv_vm,
    rhel_metal,
)
from tests.support.sysroot import Sysroot

CHECK = "boot.module_signing"
SB = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e39d2bb0d4e2"
MOK = "/sys/firmware/efi/efivars/MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23"
DER = b"0\x82\x03\x1f0\x82\x02\x07\xa0\x03\x02\x01\x02\x02\x14DKMS module signing key"
ESL = b"\xa1Y\xc0\xa5\xe4\x94\xa7J\x87\xb5\xab\x15\\+\xf0r" + b"\x00" * 12


def secure_boot(root: Sysroot, on: bool = True) -> None:
    root.write(SB, b"\x06\x00\x00\x00" + (b"\x01" if on else b"\x00"))
    root.write("/sys/kernel/security/lockdown",
               "none [integrity] confidentiality\n" if on else "[none] integrity "
               "confidentiality\n")


def sb_off(root: Sysroot) -> None:
    secure_boot(root, on=False)


def sb_no_key(root: Sysroot) -> None:
    secure_boot(root)


def sb_key_not_enrolled(root: Sysroot) -> None:
    secure_boot(root)
    root.write("/var/lib/dkms/mok.pub", DER)
    root.write(MOK, b"\x07\x00\x00\x00" + ESL + b"0\x82\x05other vendor key")


def sb_key_enrolled(root: Sysroot) -> None:
    secure_boot(root)
    root.write("/var/lib/dkms/mok.pub", DER)
    root.write(MOK, b"\x07\x00\x00\x00" + ESL + DER)


def sb_key_running_proof(root: Sysroot) -> None:
    secure_boot(root)
    root.write("/var/lib/dkms/mok.pub", DER)


def lockdown_only(root: Sysroot) -> None:
    root.write("/sys/kernel/security/lockdown", "none [integrity] confidentiality\n")


CASES = [
    Case("Secure Boot off", Status.PASS, sb_off, base=base(dgx_class, "dgx")),
    Case("Secure Boot on, DKMS module, no signing key", Status.FAIL, sb_no_key,
         base=base(dgx_class, "dgx")),
    Case("Secure Boot on, DKMS key not in MokListRT", Status.FAIL, sb_key_not_enrolled,
         base=base(dgx_class, "dgx")),
    Case("Secure Boot on, DKMS key enrolled", Status.PASS, sb_key_enrolled,
         base=base(rhel_metal, "rhel")),
    Case("Secure Boot on, MokListRT not collected, the DKMS module loaded now", Status.PASS,
         sb_key_running_proof, base=base(dgx_class, "dgx")),
    Case("lockdown without the efivar, runfile module", Status.WARN, lockdown_only,
         base=base(lambda: dgx_class(module_origin="runfile"), "dgx-runfile")),
    Case("Hyper-V Trusted Launch VM with Ubuntu's prebuilt modules", Status.PASS, sb_no_key,
         base=base(lambda: hyperv_vm(module_origin="precompiled"), "hyperv")),
    Case("Grace-Blackwell with the proprietary module", Status.FAIL, sb_off,
         base=base(lambda: grace_blackwell(flavour="proprietary"), "gb200-prop")),
    Case("H100 with the proprietary module", Status.WARN, sb_off,
         base=base(lambda: dgx_class(flavour="proprietary"), "dgx-prop")),
    Case("inside a Docker container", Status.SKIP, base=base(docker_gpu_container, "docker")),
]
