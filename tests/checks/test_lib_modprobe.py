"""checks/lib/modprobe: kmod's file order, continuations, the boot line, booleans, the initramfs."""

from __future__ import annotations

import pytest

from auditor.checks.lib import modprobe
from auditor.hosts import DirectoryHost
from tests.support.sysroot import Sysroot


def config(root: Sysroot) -> modprobe.ModprobeConfig:
    return modprobe.read_config(DirectoryHost(str(root.root)))


def test_files_sort_by_name_across_directories_and_etc_hides_lib(h200: Sysroot) -> None:
    h200.write("/lib/modprobe.d/nvidia.conf", "options nvidia NVreg_EnableMSI=0\n")
    h200.write("/usr/lib/modprobe.d/50-uvm.conf", "options nvidia_uvm uvm_disable_hmm=0\n")
    # Same name in /etc hides the vendor file; "zz" sorts last and wins for the key.
    h200.write("/etc/modprobe.d/nvidia.conf", "options nvidia NVreg_EnableMSI=1\n")
    h200.write("/run/modprobe.d/zz.conf", "options nvidia-uvm uvm_disable_hmm=1\n")
    found = config(h200)
    assert found.files == ("/usr/lib/modprobe.d/50-uvm.conf", "/etc/modprobe.d/nvidia.conf",
                           "/run/modprobe.d/zz.conf")
    assert found.effective("nvidia")["NVreg_EnableMSI"].value == "1"
    hmm = found.effective("nvidia-uvm")["uvm_disable_hmm"]
    assert (hmm.value, hmm.where) == ("1", "/run/modprobe.d/zz.conf:1")


def test_the_boot_line_comes_last_and_dashes_are_underscores(h200: Sysroot) -> None:
    h200.write("/etc/modprobe.d/uvm.conf", "options nvidia_uvm uvm_disable_hmm=1\n")
    h200.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz ro nvidia-uvm.uvm_disable_hmm=0 quiet\n")
    hmm = config(h200).effective("nvidia_uvm")["uvm_disable_hmm"]
    assert (hmm.value, hmm.where) == ("0", "the kernel command line")


def test_continuations_comments_quotes_and_directives() -> None:
    text = ("# options nvidia NVreg_X=1\n"
            "options nvidia \\\n  NVreg_RegistryDwords=\"A=1;B=2\" NVreg_EnableResizableBar=1\n"
            "blacklist nouveau\ninstall nvidia_peermem /bin/false\n  # indented comment\n"
            "options bad/name x=1\noptions nvidia_drm modeset\n")
    options, directives = modprobe.parse(text, "/etc/modprobe.d/x.conf")
    assert [(o.module, o.name, o.value, o.line) for o in options] == [
        ("nvidia", "NVreg_RegistryDwords", "A=1;B=2", 2),
        ("nvidia", "NVreg_EnableResizableBar", "1", 2),
        ("nvidia_drm", "modeset", "", 8),
    ]
    assert [(d.kind, d.module, d.argument) for d in directives] == [
        ("blacklist", "nouveau", ""), ("install", "nvidia_peermem", "/bin/false")]


@pytest.mark.parametrize(("value", "truth"), [
    ("", True), ("1", True), ("Y", True), ("yes", True), ("on", True), ("true", True),
    ("0", False), ("N", False), ("off", False), ("false", False), ("2", None), ("maybe", None),
])
def test_booleans_read_as_kstrtobool_reads_them(value: str, truth: bool | None) -> None:
    assert modprobe.truthy(value) is truth


def test_hostile_files_are_bounded(h200: Sysroot) -> None:
    h200.write("/etc/modprobe.d/huge.conf", "options nvidia " + "x" * 100_000 + "=1\n"
               + "\\\n" * 20_000 + "options nvidia NVreg_A=1\n")
    h200.write("/etc/modprobe.d/binary.conf", b"\xff\xfe\x00options nvidia\x00\n")
    found = config(h200)
    assert all(len(o.raw) <= modprobe.MAX_LINE for o in found.options)


def test_initramfs_tools_dracut_and_mkinitcpio(h200: Sysroot) -> None:
    host = DirectoryHost(str(h200.root))
    assert modprobe.initramfs(host, ("nvidia",)).tool == ""
    h200.write("/etc/initramfs-tools/modules", "# modules\nnvidia-drm\n")
    found = modprobe.initramfs(DirectoryHost(str(h200.root)), ("nvidia_drm",))
    assert (found.tool, found.carries, found.where) == (
        "initramfs-tools", True, "/etc/initramfs-tools/modules:2")
    assert found.rebuild == ("update-initramfs", "-u", "-k", "all")
    h200.remove("/etc/initramfs-tools")
    h200.write("/usr/lib/dracut/dracut.conf.d/99-nvidia.conf",
               'omit_drivers+=" nvidia nvidia-drm "\n')
    found = modprobe.initramfs(DirectoryHost(str(h200.root)), ("nvidia",))
    assert (found.tool, found.carries) == ("dracut", False)
    # /etc's drop-in of the same name replaces the vendor one.
    h200.write("/etc/dracut.conf.d/99-nvidia.conf", 'force_drivers+=" nvidia "\n')
    found = modprobe.initramfs(DirectoryHost(str(h200.root)), ("nvidia",))
    assert (found.carries, found.where) == (True, "/etc/dracut.conf.d/99-nvidia.conf:1")


# -- initramfs_age: the image against the modprobe.d files it must carry --------------------

RELEASE = "6.8.0-45-generic"
IMAGE = f"/boot/initrd.img-{RELEASE}"


def _aged(root: Sysroot, files: dict[str, float]) -> modprobe.ImageAge:
    import os

    for path, when in files.items():
        os.utime(root.root / path.lstrip("/"), (when, when))
    host = DirectoryHost(str(root.root))
    return modprobe.initramfs_age(host, RELEASE, modprobe.read_config(host),
                                  ("nvidia", "nvidia_uvm"))


def test_initramfs_age_by_the_files_that_name_the_modules(h200: Sysroot) -> None:
    h200.write(IMAGE, b"\x1f\x8b")
    h200.write("/etc/modprobe.d/nvidia-uvm.conf", "options nvidia-uvm uvm_disable_hmm=1\n")
    h200.write("/lib/modprobe.d/50-nvidia.conf", "blacklist nvidia\n")
    h200.write("/etc/modprobe.d/other.conf", "options snd_hda_intel power_save=0\n")
    # Not carried by any image build: read from the root file system at boot.
    h200.write("/run/modprobe.d/nvidia-late.conf", "options nvidia NVreg_A=1\n")
    found = _aged(h200, {IMAGE: 2000.0, "/etc/modprobe.d/nvidia-uvm.conf": 3000.0,
                         "/lib/modprobe.d/50-nvidia.conf": 1000.0,
                         "/etc/modprobe.d/other.conf": 9000.0,
                         "/run/modprobe.d/nvidia-late.conf": 9000.0})
    assert found == modprobe.ImageAge(
        IMAGE, ("/etc/modprobe.d/nvidia-uvm.conf",),
        ("/lib/modprobe.d/50-nvidia.conf", "/etc/modprobe.d/nvidia-uvm.conf"), "")
    # Rebuilt in the same second as the edit: it read the edited file.
    found = _aged(h200, {IMAGE: 3000.9})
    assert (found.newer, found.unknown) == ((), "")


def test_initramfs_age_missing_is_not_older(h200: Sysroot) -> None:
    h200.write("/etc/modprobe.d/nvidia.conf", "options nvidia NVreg_EnableResizableBar=1\n")
    found = _aged(h200, {})
    assert found.image == "" and found.newer == ()
    assert found.unknown == (f"no initramfs image for kernel {RELEASE} ({IMAGE} or "
                             f"/boot/initramfs-{RELEASE}.img)")
    host = DirectoryHost(str(h200.root))
    assert "cannot be read" in modprobe.initramfs_age(
        host, "", modprobe.read_config(host), ("nvidia",)).unknown


def test_initramfs_age_unknown_where_a_capture_keeps_no_times(h200: Sysroot) -> None:
    from auditor.hosts.archive import ArchiveHost
    from tests.support.hostgen.base import Tree

    tree = Tree()
    tree.put(IMAGE, b"\x1f\x8b")
    tree.put("/etc/modprobe.d/nvidia.conf", "options nvidia NVreg_EnableResizableBar=1\n")
    kept = tree.write_tar(h200.root / "kept.tar.gz")
    host = ArchiveHost.from_path(str(kept))
    assert host.mtime(IMAGE) is None  # written with no times (0): not known, never "1970"
    found = modprobe.initramfs_age(host, RELEASE, modprobe.read_config(host), ("nvidia",))
    assert found.newer == () and "not known" in found.unknown
    tree.mtimes.update({IMAGE: 1000.0, "/etc/modprobe.d/nvidia.conf": 5000.0})
    host = ArchiveHost.from_path(str(tree.write_tar(h200.root / "timed.tar.gz")))
    assert host.mtime(IMAGE) == 1000.0
    found = modprobe.initramfs_age(host, RELEASE, modprobe.read_config(host), ("nvidia",))
    assert found.newer == ("/etc/modprobe.d/nvidia.conf",)
