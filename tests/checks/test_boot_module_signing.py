"""boot.module_signing: what says the kernel enforces module signatures, strongest first."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.boot_module_signing import LOCKDOWN, SECURE_BOOT, enforcement
from auditor.hosts import DirectoryHost
from tests.support.hostgen.serving import base, dgx_class


def test_enforcement_evidence(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)

    def host() -> DirectoryHost:  # read again after each change
        return DirectoryHost(str(root.root))

    assert enforcement(host(), "6.8.0-45-generic").why.startswith("booted without UEFI")
    root.remove("/proc/cmdline")
    assert enforcement(host(), "6.8.0-45-generic").on is None  # nothing read: unknown
    root.write("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro\n")
    root.write(SECURE_BOOT, b"\x06\x00\x00\x00\x00")
    assert enforcement(host(), "6.8.0-45-generic") == (False, "UEFI Secure Boot is off")
    root.write(LOCKDOWN, "none integrity [confidentiality]\n")
    assert enforcement(host(), "6.8.0-45-generic").why == \
        "the kernel is locked down (confidentiality)"
    root.write(LOCKDOWN, "[none] integrity confidentiality\n")
    root.write("/proc/cmdline", root.read("/proc/cmdline").strip() + " module.sig_enforce=1\n")
    assert enforcement(host(), "6.8.0-45-generic").on is True
    root.write(SECURE_BOOT, b"\x06\x00\x00\x00\x01")
    assert enforcement(host(), "6.8.0-45-generic").why == "UEFI Secure Boot is on"
