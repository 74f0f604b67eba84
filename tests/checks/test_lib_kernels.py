"""checks/lib/kernels: lines, the next boot's kernel, GPU modules from modules.dep and DKMS."""

from __future__ import annotations

import pytest

from auditor.checks.lib import kernels
from auditor.hosts import DirectoryHost
from tests.support.sysroot import Sysroot

UBUNTU = {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"}


@pytest.mark.parametrize(("release", "os_release", "line", "series"), [
    ("6.8.0-45-generic", UBUNTU, "ubuntu-generic", "6.8"),
    ("6.8.0-1017-nvidia-64k", UBUNTU, "ubuntu-nvidia-64k", "6.8"),
    ("6.8.0-1021-aws", {}, "ubuntu-aws", "6.8"),
    ("5.14.0-570.23.1.el9_6.x86_64", {}, "el9", "5.14"),
    ("5.15.0-300.163.18.el9uek.x86_64", {}, "el9-uek", "5.15"),
    ("6.14.8-2-pve", {}, "pve", "6.14"),
    ("6.1.0-28-amd64", {"ID": "debian"}, "debian", "6.1"),
    ("6.12.12+bpo-cloud-amd64", {"ID": "debian"}, "debian", "6.12"),
    ("6.11.4-301.fc41.x86_64", {}, "fedora", "6.11"),
    ("6.1.102-111.182.amzn2023.x86_64", {}, "amzn", "6.1"),
    ("6.18.44", {}, "vanilla", "6.18"),
    ("6.15.0-rc3+", {}, "vanilla", "6.15"),
    # Every family's kernels, and a name none of them gives: unknown, never vanilla.
    ("6.4.0-150600.23.25-default", {"ID": "sles"}, "sles", "6.4"),
    ("5.14.21-150500.55.83-azure", {}, "sles", "5.14"),
    ("6.12.0-160000.5-default", {"ID": "sles"}, "sles", "6.12"),
    ("6.12.8-1-default", {"ID": "opensuse-tumbleweed", "ID_LIKE": "opensuse suse"},
     "suse-tumbleweed", "6.12"),
    ("6.12.8-arch1-1", {}, "arch", "6.12"),
    ("6.12.41-1-lts", {"ID": "arch"}, "arch-lts", "6.12"),
    ("6.12.8-zen1-1-zen", {}, "arch-zen", "6.12"),
    ("5.15.158.2-1.cm2", {}, "azurelinux", "5.15"),
    ("6.6.57.1-7.azl3", {}, "azurelinux", "6.6"),
    ("5.14.0-592.el9.x86_64", {"ID": "centos"}, "el9", "5.14"),
    ("6.12.0-55.9.1.el10_0.x86_64", {"ID": "almalinux"}, "el10", "6.12"),
    ("6.12.9-custom-gpu", UBUNTU, "unknown", "6.12"),
    ("6.12.1-1-default", {"ID": "ubuntu"}, "unknown", "6.12"),
    ("6.6.30-gentoo", {"ID": "gentoo"}, "unknown", "6.6"),
])
def test_lines(release: str, os_release: dict[str, str], line: str, series: str) -> None:
    found = kernels.classify(release, os_release)
    assert (found.name, found.series) == (line, series)


def test_sle_stream_is_the_service_pack() -> None:
    line = kernels.classify("6.4.0-150600.23.25-default", {})
    assert (line.stream, line.flavour) == ("15.6", "default")
    assert line.describe() == "SUSE kernel 6.4 (SLE 15.6, -default)"
    assert kernels.classify("6.12.9-custom-gpu", {}).describe() == (
        "kernel of an unknown line 6.12")


def test_the_tables_are_ordered_and_dated() -> None:
    """Each rolling step comes after its release and the one before it."""
    from auditor.parsing import version_tuple

    for release in kernels.UBUNTU_RELEASES.values():
        dates = [release.released, *(s.since for s in release.hwe)]
        assert dates == sorted(dates) and release.support_end > release.released
        assert [version_tuple(s.series) for s in release.hwe] == sorted(
            version_tuple(s.series) for s in release.hwe)
    for minors in kernels.EL_MINORS.values():
        assert list(minors) == sorted(minors)
    for start, end in kernels.SLE_SERVICE_PACKS.values():
        assert start < end


def test_next_boot_is_the_newest_unless_pinned_or_saved(h200: Sysroot) -> None:
    for release in ("6.8.12-4-pve", "6.14.8-2-pve", "6.8.12-9-pve"):
        h200.write(f"/boot/vmlinuz-{release}", "")
    host = DirectoryHost(str(h200.root))
    found = kernels.next_boot(host, "6.8.12-4-pve", kernels.installed_kernels(host))
    assert found is not None and found.release == "6.14.8-2-pve"
    h200.write("/etc/kernel/proxmox-boot-pin", "6.8.12-9-pve\n")
    host = DirectoryHost(str(h200.root))
    found = kernels.next_boot(host, "6.8.12-4-pve", kernels.installed_kernels(host))
    assert found is not None and found.release == "6.8.12-9-pve" and "pinned" in found.how
    h200.remove("/etc/kernel/proxmox-boot-pin")
    h200.write("/etc/default/grub", "GRUB_DEFAULT=saved\n")
    h200.write("/boot/grub/grubenv", "saved_entry=gnulinux-advanced-x>gnulinux-6.8.12-4-pve-"
               "advanced-x\n")
    host = DirectoryHost(str(h200.root))
    found = kernels.next_boot(host, "6.8.12-4-pve", kernels.installed_kernels(host))
    assert found is not None and found.release == "6.8.12-4-pve"


def test_modules_dep_and_dkms_say_what_a_kernel_carries(h200: Sysroot) -> None:
    release = "6.8.0-50-generic"
    h200.write(f"/lib/modules/{release}/modules.dep",
               "kernel/drivers/gpu/drm/nouveau/nouveau.ko.zst: kernel/drivers/nvidia.ko.x\n"
               "kernel/nvidia-580-server-open/nvidia-drm.ko: kernel/nvidia-580-server-open/"
               "nvidia.ko\nkernel/nvidia-580-server-open/nvidia.ko:\n")
    found = kernels.gpu_modules(DirectoryHost(str(h200.root)), release, "nvidia")
    assert found.indexed
    assert [(m.path, m.origin, m.version) for m in found.modules] == [
        ("kernel/nvidia-580-server-open/nvidia.ko", "precompiled", "580")]
    h200.write(f"/lib/modules/{release}/modules.dep", "updates/dkms/nvidia.ko.zst:\n")
    h200.write(f"/var/lib/dkms/nvidia/580.95.05/{release}/x86_64/module/nvidia.ko.zst", "")
    h200.write(f"/var/lib/dkms/nvidia/575.64.05/{release}/x86_64/module/nvidia.ko.zst", "")
    h200.symlink(f"/var/lib/dkms/nvidia/kernel-{release}-x86_64", f"575.64.05/{release}/x86_64")
    found = kernels.gpu_modules(DirectoryHost(str(h200.root)), release, "nvidia")
    assert found.dkms_built == ("575.64.05", "580.95.05")
    assert found.dkms_installed == "575.64.05"
    assert [(m.origin, m.version) for m in found.modules] == [("dkms", "575.64.05")]


def test_a_kernel_without_modules_dep_is_not_judged(h200: Sysroot) -> None:
    found = kernels.gpu_modules(DirectoryHost(str(h200.root)), "6.18.44", "nvidia")
    assert not found.indexed and found.modules == ()


def test_hostile_modules_dep_is_bounded(h200: Sysroot) -> None:
    release = "6.8.0-50-generic"
    h200.write(f"/lib/modules/{release}/modules.dep",
               ("x: " + "nvidia.ko " * 30_000 + "\n") * 20 + "updates/dkms/nvidia.ko:\n")
    found = kernels.gpu_modules(DirectoryHost(str(h200.root)), release, "nvidia")
    assert [m.path for m in found.modules] == ["updates/dkms/nvidia.ko"]


def test_kernel_config_reads_set_and_unset_options(h200: Sysroot) -> None:
    h200.write("/boot/config-6.18.44", "CONFIG_DEVICE_PRIVATE=y\n# CONFIG_HMM_MIRROR is not set\n"
               'CONFIG_LOCALVERSION=""\n')
    found = kernels.kernel_config(DirectoryHost(str(h200.root)), "6.18.44")
    assert found == {"CONFIG_DEVICE_PRIVATE": "y", "CONFIG_HMM_MIRROR": "n",
                     "CONFIG_LOCALVERSION": ""}
    assert kernels.kernel_config(DirectoryHost(str(h200.root)), "../../etc/passwd") is None
