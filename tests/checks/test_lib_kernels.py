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
])
def test_lines(release: str, os_release: dict[str, str], line: str, series: str) -> None:
    found = kernels.classify(release, os_release)
    assert (found.name, found.series) == (line, series)


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
