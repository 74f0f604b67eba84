"""Where the boot command line lives, and the edit that adds parameters to it."""

from __future__ import annotations

from pathlib import Path

from auditor.hosts import DirectoryHost
from auditor.remediations.boot import boot_remedy, merge_params
from auditor.remedy import AppendLine, ReplaceLine, RunCommand
from tests.support.factories import make_report
from tests.support.fixkit import assert_idempotent_and_reversible, fix_cycle, needs_root
from tests.support.plant import GRUB, plant_cstates
from tests.support.sysroot import Sysroot

PARAMS = ["processor.max_cstate=1", "intel_idle.max_cstate=1"]
DEBIAN = {"ID": "debian"}


def test_merge_replaces_a_value_and_appends_the_rest() -> None:
    assert merge_params(["quiet", "processor.max_cstate=9"], PARAMS) == [
        "quiet", "processor.max_cstate=1", "intel_idle.max_cstate=1"]
    assert merge_params(PARAMS, PARAMS) == PARAMS


def test_single_quoted_grub_value_keeps_its_quotes_and_tail(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", "GRUB_CMDLINE_LINUX_DEFAULT='quiet' # set by hand\n")
    remedy = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN)
    edit, refresh = remedy.persistent
    assert isinstance(edit, ReplaceLine) and edit.line == 1
    assert edit.new == ("GRUB_CMDLINE_LINUX_DEFAULT='quiet processor.max_cstate=1 "
                        "intel_idle.max_cstate=1' # set by hand")
    assert isinstance(refresh, RunCommand) and refresh.argv == ("update-grub",)


def test_grub_d_drop_in_that_sets_it_last_is_the_one_edited(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", GRUB)
    h200.write("/etc/default/grub.d/50-cloudimg-settings.cfg",
               'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n')
    edit = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN).persistent[0]
    assert isinstance(edit, ReplaceLine)
    assert edit.path == "/etc/default/grub.d/50-cloudimg-settings.cfg"


def test_no_variable_appends_one(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", "GRUB_TIMEOUT=5")
    edit = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN).persistent[0]
    assert edit == AppendLine("/etc/default/grub",
                              'GRUB_CMDLINE_LINUX_DEFAULT="processor.max_cstate=1 '
                              'intel_idle.max_cstate=1"')


def test_rhel_regenerates_with_grub2_mkconfig_and_grubby(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    remedy = boot_remedy(DirectoryHost(str(h200.root)), PARAMS,
                         {"ID": "rocky", "ID_LIKE": "rhel centos fedora"})
    commands = [s for s in remedy.persistent if isinstance(s, RunCommand)]
    assert commands[0].argv == ("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg")
    assert commands[1].argv[:2] == ("grubby", "--update-kernel=ALL") and commands[1].optional
    assert commands[1].undo[-1] == "--remove-args=" + " ".join(PARAMS)


def test_proxmox_boot_tool_uses_kernel_cmdline(h200: Sysroot) -> None:
    """Booted through systemd-boot (no BOOT_IMAGE= on the command line): /etc/kernel/cmdline."""
    h200.write("/etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    h200.write("/etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    h200.write("/etc/default/grub", GRUB)
    h200.write("/proc/cmdline", "initrd=\\EFI\\proxmox\\6.8.12-4-pve\\initrd.img-6.8.12-4-pve "
               "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    edit, refresh = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN).persistent
    assert isinstance(edit, ReplaceLine) and edit.path == "/etc/kernel/cmdline"
    assert edit.new == "root=ZFS=rpool/ROOT/pve-1 boot=zfs " + " ".join(PARAMS)
    assert isinstance(refresh, RunCommand) and refresh.argv == ("proxmox-boot-tool", "refresh")


def test_proxmox_booted_through_grub_edits_default_grub(h200: Sysroot) -> None:
    """proxmox-boot-tool keeping GRUB (BOOT_IMAGE= on the command line): /etc/default/grub."""
    h200.write("/etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    h200.write("/etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    h200.write("/etc/default/grub", GRUB)
    assert "BOOT_IMAGE=" in h200.read("/proc/cmdline")
    edit, refresh = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN).persistent
    assert isinstance(edit, ReplaceLine) and edit.path == "/etc/default/grub"
    assert isinstance(refresh, RunCommand) and refresh.argv == ("proxmox-boot-tool", "refresh")


def test_nothing_to_edit_says_so(h200: Sysroot) -> None:
    remedy = boot_remedy(DirectoryHost(str(h200.root)), PARAMS, DEBIAN)
    assert not remedy.persistent
    assert "by hand" in remedy.notes[0]


@needs_root
def test_kernel_cmdline_without_trailing_newline_round_trips(h200: Sysroot, tmp_path: Path
                                                             ) -> None:
    h200.write("/etc/kernel/cmdline", "root=/dev/sda1 ro")
    h200.write("/etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(plant_cstates(h200)))
    assert (copy / "etc/kernel/cmdline").read_text() == (
        "root=/dev/sda1 ro intel_idle.max_cstate=2\n")
    assert_idempotent_and_reversible(fix, rollback, copy, before)
    assert (copy / "etc/kernel/cmdline").read_text() == "root=/dev/sda1 ro"
