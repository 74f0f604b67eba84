"""checks/lib/bootloader: GRUB's defaults expanded in order unrun, BLS entries, edits in place."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.lib import bootloader
from auditor.hosts import DirectoryHost
from tests.support.sysroot import Sysroot

DEBIAN = {"ID": "debian"}


def expanded(root: Sysroot) -> bootloader.ShellDefaults:
    return bootloader.expand_grub_defaults(DirectoryHost(str(root.root)))


def test_drop_ins_extend_and_override_in_glob_order(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
               'GRUB_CMDLINE_LINUX="rd.auto"\n')
    h200.write("/etc/default/grub.d/10-iommu.cfg",
               'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\n')
    h200.write("/etc/default/grub.d/50-cloudimg-settings.cfg",
               "GRUB_CMDLINE_LINUX_DEFAULT='console=tty1 console=ttyS0'\n")
    h200.write("/etc/default/grub.d/60-acs.cfg",
               'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX:+$GRUB_CMDLINE_LINUX }'
               'pci=disable_acs_redir=pci:0:0"\n')
    shell = expanded(h200)
    linux = [(t.text, t.source.where) for t in shell.variables["GRUB_CMDLINE_LINUX"]]
    assert linux == [("rd.auto", "/etc/default/grub:2"),
                     ("iommu=pt", "/etc/default/grub.d/10-iommu.cfg:1"),
                     ("pci=disable_acs_redir=pci:0:0", "/etc/default/grub.d/60-acs.cfg:1")]
    # The cloud image's drop-in replaces quiet splash: those are not configured any more.
    assert [t.text for t in shell.variables["GRUB_CMDLINE_LINUX_DEFAULT"]] == [
        "console=tty1", "console=ttyS0"]
    assert shell.setters["GRUB_CMDLINE_LINUX_DEFAULT"][0].endswith("50-cloudimg-settings.cfg")


def test_lines_that_are_not_plain_assignments_are_listed_not_run(h200: Sysroot,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    h200.write("/etc/default/grub",
               f'GRUB_CMDLINE_LINUX_DEFAULT="$(touch {marker}) quiet"\n'
               'if [ -e /x ]; then GRUB_CMDLINE_LINUX_DEFAULT="a"; fi\n'
               'GRUB_CMDLINE_LINUX=`touch /tmp/x`\n'
               'GRUB_CMDLINE_LINUX_DEFAULT="nomodeset" update-grub\n'
               'GRUB_CMDLINE_LINUX="ok=1" # comment\n')
    shell = expanded(h200)
    assert not marker.exists()
    assert shell.unexpanded == ["/etc/default/grub:1", "/etc/default/grub:2",
                                "/etc/default/grub:3", "/etc/default/grub:4"]
    assert [t.text for t in shell.variables["GRUB_CMDLINE_LINUX"]] == ["ok=1"]
    assert "GRUB_CMDLINE_LINUX_DEFAULT" not in shell.variables


def test_bls_entry_of_the_release_with_grubenv_variables(h200: Sysroot) -> None:
    h200.write("/boot/loader/entries/abc-5.14.0-570.el9.x86_64.conf",
               "title Rocky\nlinux /vmlinuz-5.14.0-570.el9.x86_64\n"
               "options root=/dev/sda1 ro $tuned_params\n")
    h200.write("/boot/grub2/grubenv", "# GRUB Environment Block\ntuned_params=skew_tick=1\n"
               + "#" * 900)
    found = bootloader.configured(DirectoryHost(str(h200.root)), "5.14.0-570.el9.x86_64",
                                  {"ID": "rocky", "ID_LIKE": "rhel"})
    assert found is not None and found.loader == "bls"
    assert [t.text for t in found.tokens] == ["root=/dev/sda1", "ro", "skew_tick=1"]


def test_grub_cfg_entry_tokens_tell_whether_update_grub_ran(h200: Sysroot) -> None:
    h200.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n')
    h200.write("/boot/grub/grub.cfg", "menuentry 'x' {\n\tlinux\t/boot/vmlinuz-6.18.44 "
               "root=/dev/vda1 ro quiet\n}\n")
    found = bootloader.configured(DirectoryHost(str(h200.root)), "6.18.44", DEBIAN)
    assert found is not None
    assert found.loader == "grub" and found.regenerate == ("update-grub",)
    assert found.generated == ("root=/dev/vda1", "ro", "quiet")


def test_rewrite_line_keeps_quotes_and_tails() -> None:
    raw = "GRUB_CMDLINE_LINUX_DEFAULT='quiet amd_iommu=pt' # by hand"
    assert bootloader.rewrite_line(raw, "GRUB_CMDLINE_LINUX_DEFAULT",
                                   {"amd_iommu=pt": ["iommu=pt"]}) == (
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet iommu=pt' # by hand")
    assert bootloader.rewrite_line("options ro a=1b=2", "options", {"a=1b=2": ["a=1", "b=2"]}) \
        == "options ro a=1 b=2"
    assert bootloader.rewrite_line("root=/dev/sda x=1", "cmdline", {"x=1": []}) == "root=/dev/sda"
    assert bootloader.rewrite_line('GRUB_CMDLINE_LINUX="$(x)"', "GRUB_CMDLINE_LINUX_DEFAULT",
                                   {}) is None
