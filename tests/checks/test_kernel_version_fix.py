"""kernel.version: its advice-only fix."""

from __future__ import annotations

from pathlib import Path

from tests.support.factories import make_report
from tests.support.fixkit import copy_tree, plan_for, run, tree_hash, write_scripts
from tests.support.plant import plant_old_kernel
from tests.support.sysroot import Sysroot


def test_kernel_upgrade_is_commented_out_and_needs_reboot(h200: Sysroot, tmp_path: Path) -> None:
    findings = plant_old_kernel(h200)
    plan = plan_for(h200, make_report(findings))
    assert plan.reboot and not plan.actions
    fix, _ = write_scripts(plan, tmp_path)
    text = fix.read_text()
    assert "#   apt install proxmox-kernel-6.14" in text
    assert not [ln for ln in text.splitlines() if ln.startswith("apt ")]
    copy = copy_tree(h200.root, tmp_path / "copy")
    before = tree_hash(copy)
    assert run(fix, copy).returncode == 0
    assert tree_hash(copy) == before


def test_upgrade_commands_per_distribution() -> None:
    from auditor.checks.kernel_version import upgrade_command

    assert upgrade_command("6.8.12-4-pve", "6.14", {"ID": "debian"}) == (
        "apt", "install", "proxmox-kernel-6.14")
    assert upgrade_command("6.8.0-45-generic", "6.11", {"ID": "ubuntu", "VERSION_ID": "24.04"}
                           ) == ("apt", "install", "--install-recommends",
                                 "linux-generic-hwe-24.04")
    assert upgrade_command("5.14.0-427.13.1.el9_4.x86_64", "6.0",
                           {"ID": "rocky", "ID_LIKE": "rhel centos fedora"}
                           ) == ("dnf", "install", "kernel")
    assert upgrade_command("6.1.0", "6.8", {"ID": "debian", "VERSION_CODENAME": "x; rm -rf"}
                           ) == ()


def test_pending_reboot_into_a_new_enough_kernel_is_advised_alone(h200: Sysroot) -> None:
    from dataclasses import replace

    [finding] = plant_old_kernel(h200)
    pending = replace(finding, evidence=(*finding.evidence, ("installed_newer", "6.14.8-2-pve")))
    [section] = plan_for(h200, make_report([pending])).sections
    assert [a.argv for a in section.remedy.advice] == [()]
    assert "reboot into it" in section.remedy.advice[0].text


def test_family_tools_in_the_advice() -> None:
    from auditor.checks.kernel_version import default_kernel_advice, upgrade_command

    rocky = {"ID": "rocky", "ID_LIKE": "rhel centos fedora"}
    sles = {"ID": "sles", "ID_LIKE": "suse", "VERSION_ID": "15.6"}
    assert [a.argv for a in default_kernel_advice("5.14.0-570.23.1.el9_6.x86_64", rocky)] == [
        ("grubby", "--set-default", "/boot/vmlinuz-5.14.0-570.23.1.el9_6.x86_64")]
    assert [a.argv for a in default_kernel_advice("6.4.0-150600.23.25-default", sles)] == [
        ("update-bootloader", "--refresh")]
    assert default_kernel_advice("6.1$(reboot)", rocky) == []
    assert upgrade_command("6.4.0-150600.23.25-default", "6.14", sles) == (
        "zypper", "--non-interactive", "install", "kernel-default")
    assert upgrade_command("6.12.8-arch1-1", "6.14", {"ID": "arch"}) == ("pacman", "-Syu")
    assert upgrade_command("6.12.9-custom-gpu", "6.14", {"ID": "ubuntu"}) == ()


def test_a_held_kernel_is_released_in_the_advice(tmp_path: Path) -> None:
    from tests.support.hostgen.nvidia import DriverSpec, build_driver_host

    spec = DriverSpec(version_id="22.04", running="6.5.0-1025-azure", kernel_held=True)
    root = Sysroot(build_driver_host(spec).write_dir(tmp_path / "t"))
    from auditor.checks.kernel_version import KernelVersion
    from auditor.hosts import DirectoryHost

    findings = [f for f in KernelVersion.configured(as_of="2025-01-10").evaluate(
        DirectoryHost(str(root.root))) if f.subject == "kernel"]
    [section] = plan_for(root, make_report(findings)).sections
    argvs = [a.argv for a in section.remedy.advice]
    assert ("apt-mark", "unhold", "linux-azure", "linux-image-6.5.0-1025-azure") in argvs
