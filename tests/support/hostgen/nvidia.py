"""GPU nodes as the NVIDIA driver's lifecycle leaves them: kernels, modules, boot loaders, daemons.

One builder, :func:`build_driver_host`, makes Ubuntu, RHEL-like, Debian and Proxmox nodes with
the files the driver checks read, laid out as the kernel, kmod, dpkg, systemd, GRUB, BLS and
the NVIDIA packages lay them out:

- kernels of several lines in /boot and /lib/modules, each with a modules.dep that carries the
  nvidia module or not (DKMS's updates/dkms, Ubuntu's precompiled kernel/nvidia-<branch>,
  the runfile's kernel/drivers/video), DKMS trees and their kernel-<release>-<arch> links;
- the loaded module (/proc/driver/nvidia/version, params, gpus/*/information, /sys/module),
  the userspace libraries with their soname links, ld.so.conf.d, dpkg's status file;
- modprobe.d, /sys/module/*/parameters, the boot line as GRUB (with drop-ins), BLS entries,
  /etc/kernel/cmdline or tuned configure it, and /proc/cmdline as booted;
- nvidia-persistenced and nv-fabricmanager with pid files, /proc/<pid>/comm and cmdline,
  their units and enablement; NVSwitch functions; RDMA NICs; CDI specs; unattended upgrades.

Each problem is a field of :class:`DriverSpec`; the defaults are a healthy Ubuntu 24.04 node.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.hostgen.base import Tree, pcie_config, sysfs_common

if TYPE_CHECKING:
    from tests.support.cases import Base

H100 = 0x2330
RTX_PRO_6000 = 0x2BB5
NVSWITCH = 0x22A3
MLX5 = 0x1021
MACHINE_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
#: When the modprobe.d files were written (2026-01-10 12:00 UTC); the initramfs is built a
#: day before or after (``DriverSpec.initramfs_stale``).
CONFIGURED_AT = 1768046400.0


@dataclass
class DriverSpec:
    """A GPU node and the state of its driver's lifecycle."""

    hostname: str = "gpu-node-01"
    #: ``ubuntu``, ``rhel`` (Rocky 9), ``debian`` or ``proxmox``.
    distro: str = "ubuntu"
    version_id: str = "24.04"
    running: str = "6.8.0-45-generic"
    #: Other installed kernels (the running one is always installed).
    installed: tuple[str, ...] = ()
    #: Kernels whose modules.dep carries no nvidia module.
    without_module: tuple[str, ...] = ()
    #: ``dkms``, ``precompiled`` (Ubuntu's linux-modules-nvidia) or ``runfile``.
    module_origin: str = "dkms"
    #: The DKMS version built per kernel where it differs from ``driver``.
    dkms_version: dict[str, str] = field(default_factory=dict)
    driver: str = "580.95.05"
    flavour: str = "open"
    #: The userspace version ("" for none installed); defaults to ``driver``.
    userspace: str | None = None
    gpus: int = 8
    gpu_device: int = H100
    nvswitches: int = 0
    rdma_nics: int = 0
    #: AMD Instinct GPUs (MI300X, class 0x1200) driven by amdgpu.
    amd_gpus: int = 0
    #: Kernels whose modules.dep lacks amdgpu (Ubuntu without linux-modules-extra).
    without_amdgpu: tuple[str, ...] = ()
    #: ``grub``, ``bls``, ``systemd-boot`` (proxmox-boot-tool) or ``kernel-install``.
    boot: str = "grub"
    #: Tokens configured for the boot line (GRUB_CMDLINE_LINUX_DEFAULT, BLS options...).
    configured: tuple[str, ...] = ("quiet",)
    #: Tokens the running kernel was booted with (default: as configured).
    booted: tuple[str, ...] | None = None
    #: GRUB drop-ins: file name -> content.
    grub_d: dict[str, str] = field(default_factory=dict)
    #: Write grub.cfg from the configured tokens (False: left as booted).
    grub_cfg_current: bool = True
    #: The tokens update-grub wrote into grub.cfg, where they are not just ``configured``
    #: (drop-ins, tuned).
    generated: tuple[str, ...] | None = None
    tuned: tuple[str, ...] = ()
    #: Live uvm_disable_hmm (``Y``/``N``), None: nvidia_uvm not loaded.
    uvm_disable_hmm: str | None = "N"
    #: modprobe.d files: path -> content.
    modprobe: dict[str, str] = field(default_factory=dict)
    #: Live nvidia.ko parameters overriding the defaults (registry name -> value).
    params: dict[str, str] = field(default_factory=dict)
    #: Live /sys/module parameters: (module, name) -> value.
    sys_params: dict[tuple[str, str], str] = field(default_factory=dict)
    initramfs_nvidia: bool = False
    #: The initramfs images were built before the modprobe.d files were last written (they
    #: carry older options); otherwise a day after.
    initramfs_stale: bool = False
    #: ``running``, ``no-persistence`` (the flag on its command line), ``stopped``, ``absent``.
    persistenced: str = "running"
    #: The version of nvidia-compute-utils-<branch>-server, the package that ships
    #: nvidia-persistenced (Debian family); None: no such package recorded.
    persistenced_version: str | None = None
    #: ``running``, ``stopped``, ``absent``.
    fabricmanager: str = "absent"
    fabricmanager_version: str | None = None
    peermem: bool = False
    #: None (no spec), or the driver version and GPU count the spec was generated for.
    cdi: tuple[str, int] | None = None
    cdi_refresh: bool = True
    unattended: bool = False
    held: bool = False
    #: The running kernel's packages (linux-image-<release>, its flavour's metapackage) are
    #: installed and held with ``apt-mark hold`` (Debian family only).
    kernel_held: bool = False
    reboot_required: tuple[str, ...] = ()
    operator: bool = False
    nouveau: bool = False
    #: The nvidia module is loaded (False: GPUs without a driver bound).
    module_loaded: bool = True
    #: ``vm`` for a KVM guest, ``container`` for an LXC container, "" bare metal.
    environment: str = ""
    kaslr: bool = True

    @property
    def userspace_version(self) -> str:
        return self.driver if self.userspace is None else self.userspace



#: The host's PID namespace, as /proc/<pid>/ns/pid links name it.
HOST_PID_NS = "pid:[4026531836]"


def process_identity(tree: Tree, pid: int, comm: str, uid: int, cgroup: str,
                     pid_ns: str = HOST_PID_NS) -> None:
    """Write what tells who runs a process: /proc/<pid>/status (Name, Uid, Gid), its cgroup
    (v2) and its PID namespace link (pid 1's is left as the host's tree has it: it decides
    whether the tree is read inside a container)."""
    ids = f"{uid}\t{uid}\t{uid}\t{uid}"
    tree.put(f"/proc/{pid}/status", f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\n"
             f"Tgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\nUid:\t{ids}\nGid:\t{ids}\n")
    tree.put(f"/proc/{pid}/cgroup", f"0::{cgroup}\n")
    tree.links[f"/proc/{pid}/ns/pid"] = pid_ns

def _os_release(spec: DriverSpec) -> str:
    if spec.distro == "ubuntu":
        return (f'PRETTY_NAME="Ubuntu {spec.version_id} LTS"\nNAME="Ubuntu"\n'
                f'VERSION_ID="{spec.version_id}"\nVERSION_CODENAME=noble\nID=ubuntu\n'
                "ID_LIKE=debian\n")
    if spec.distro == "rhel":
        return (f'NAME="Rocky Linux"\nVERSION_ID="{spec.version_id}"\nID="rocky"\n'
                'ID_LIKE="rhel centos fedora"\nPRETTY_NAME="Rocky Linux 9.6 (Blue Onyx)"\n')
    if spec.distro == "proxmox":
        return ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
                'VERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n')
    return ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
            'VERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n')


def nvrm_line(version: str, flavour: str) -> str:
    """Return /proc/driver/nvidia/version as the open or proprietary module prints it."""
    if flavour == "open":
        head = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build"
        return f"{head}  (dvs-builder@U22-I3-AE18-09-3)  Thu Sep 18 2025\nGCC version:  gcc 13.3\n"
    return (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Sep 18 01:44:30 "
            "UTC 2025\nGCC version:  gcc version 13.3.0\n")


PARAMS = {
    "ResmanDebugLevel": "4294967295", "RmLogonRC": "1", "ModifyDeviceFiles": "1",
    "DeviceFileUID": "0", "DeviceFileGID": "0", "DeviceFileMode": "438",
    "InitializeSystemMemoryAllocations": "1", "UsePageAttributeTable": "4294967295",
    "EnableMSI": "1", "EnablePCIeGen3": "0", "MemoryPoolSize": "0", "KMallocHeapMaxSize": "0",
    "VMallocHeapMaxSize": "0", "IgnoreMMIOCheck": "0", "EnableStreamMemOPs": "0",
    "EnableUserNUMAManagement": "1", "NvLinkDisable": "0", "RmProfilingAdminOnly": "1",
    "PreserveVideoMemoryAllocations": "0", "EnableS0ixPowerManagement": "0",
    "S0ixPowerManagementVideoMemoryThreshold": "256", "DynamicPowerManagement": "3",
    "DynamicPowerManagementVideoMemoryThreshold": "200", "RegisterPCIDriver": "1",
    "EnablePCIERelaxedOrderingMode": "0", "EnableResizableBar": "0", "EnableGpuFirmware": "18",
    "EnableGpuFirmwareLogs": "2", "RmNvlinkBandwidthLinkCount": "0", "EnableDbgBreakpoint": "0",
    "OpenRmEnableUnsupportedGpus": "1", "DmaRemapPeerMmio": "1", "ImexChannelCount": "2048",
    "CreateImexChannel0": "0", "GrdmaPciTopoCheckOverride": "0",
}
STRING_PARAMS = ("CoherentGPUMemoryMode", "RegistryDwords", "RegistryDwordsPerDevice", "RmMsg",
                 "GpuBlacklist", "TemporaryFilePath", "ExcludedGpus")


def params_text(overrides: dict[str, str]) -> str:
    """Return /proc/driver/nvidia/params as nv_procfs_read_params prints it."""
    lines = [f"{k}: {overrides.get(k, v)}" for k, v in PARAMS.items()]
    lines += [f'{k}: "{overrides.get(k, "")}"' for k in STRING_PARAMS]
    return "\n".join(lines) + "\n"


def _pci(tree: Tree, address: str, vendor: int, device: int, class_code: int, driver: str,
         *, index: int) -> str:
    """Write one PCI function behind its own root port; return its canonical directory."""
    bus = int(address[5:7], 16)
    port = f"0000:{bus - 1:02x}:01.0"
    domain = f"/sys/devices/pci0000:{bus - 1:02x}"
    port_dir = f"{domain}/{port}"
    tree.put(f"{port_dir}/config", pcie_config(0x8086, 0x352A, 0x060400, port_type=4))
    sysfs_common(tree, port_dir)
    tree.put(f"{port_dir}/class", "0x060400\n")
    tree.put(f"{port_dir}/vendor", "0x8086\n")
    tree.put(f"{port_dir}/device", "0x352a\n")
    tree.links[f"/sys/bus/pci/devices/{port}"] = f"../../../devices/pci0000:{bus - 1:02x}/{port}"
    directory = f"{port_dir}/{address}"
    config = pcie_config(vendor, device, class_code)
    sysfs_common(tree, directory)
    tree.put(f"{directory}/config", config)
    tree.put(f"{directory}/class", f"0x{class_code:06x}\n")
    vendor_id, device_id = struct.unpack_from("<HH", config, 0)
    tree.put(f"{directory}/vendor", f"0x{vendor_id:04x}\n")
    tree.put(f"{directory}/device", f"0x{device_id:04x}\n")
    tree.put(f"{directory}/numa_node", "0\n" if index % 2 == 0 else "1\n")
    if driver:
        tree.links[f"{directory}/driver"] = f"../../../../bus/pci/drivers/{driver}"
    tree.links[f"/sys/bus/pci/devices/{address}"] = (
        f"../../../devices/pci0000:{bus - 1:02x}/{port}/{address}")
    return directory


def _kernel(tree: Tree, spec: DriverSpec, release: str) -> None:
    tree.put(f"/boot/vmlinuz-{release}", b"\x7fELF kernel image")
    tree.put(f"/boot/config-{release}", "CONFIG_RANDOMIZE_BASE=y\nCONFIG_RANDOMIZE_MEMORY=y\n"
             "CONFIG_ZONE_DEVICE=y\nCONFIG_DEVICE_PRIVATE=y\nCONFIG_HMM_MIRROR=y\n"
             "# CONFIG_INIT_ON_ALLOC_DEFAULT_ON is not set\n")
    initrd = (f"/boot/initramfs-{release}.img" if spec.distro == "rhel"
              else f"/boot/initrd.img-{release}")
    tree.put(initrd, b"\x1f\x8b initramfs")
    deps = ["kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko.zst: "
            "kernel/drivers/infiniband/core/ib_core.ko.zst",
            "kernel/drivers/infiniband/core/ib_core.ko.zst:",
            "kernel/drivers/gpu/drm/drm.ko.zst:"]
    if spec.amd_gpus and release not in spec.without_amdgpu:
        deps.append("kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko.zst: "
                    "kernel/drivers/gpu/drm/drm.ko.zst")
    version = spec.dkms_version.get(release, spec.driver)
    if release not in spec.without_module and spec.gpus:
        if spec.module_origin == "dkms":
            where = "updates/dkms"
            built = f"/var/lib/dkms/nvidia/{version}/{release}/x86_64/module"
            tree.put(f"{built}/nvidia.ko.zst", b"module")
            link = f"/var/lib/dkms/nvidia/kernel-{release}-x86_64"
            tree.links[link] = f"{version}/{release}/x86_64"
        elif spec.module_origin == "precompiled":
            branch = version.split(".")[0]
            where = f"kernel/nvidia-{branch}{'-open' if spec.flavour == 'open' else ''}"
        else:
            where = "kernel/drivers/video"
        deps = [f"{where}/nvidia.ko.zst:", f"{where}/nvidia-uvm.ko.zst: {where}/nvidia.ko.zst",
                f"{where}/nvidia-modeset.ko.zst: {where}/nvidia.ko.zst",
                f"{where}/nvidia-drm.ko.zst: {where}/nvidia-modeset.ko.zst "
                f"{where}/nvidia.ko.zst kernel/drivers/gpu/drm/drm.ko.zst",
                f"{where}/nvidia-peermem.ko.zst: {where}/nvidia.ko.zst "
                "kernel/drivers/infiniband/core/ib_core.ko.zst", *deps]
    elif spec.module_origin == "dkms" and spec.gpus:
        # The sources are there, but nothing was built for this kernel.
        tree.put(f"/var/lib/dkms/nvidia/{spec.driver}/source/dkms.conf", 'PACKAGE_NAME="nvidia"\n')
    tree.put(f"/lib/modules/{release}/modules.dep", "\n".join(deps) + "\n")


def _boot(tree: Tree, spec: DriverSpec, kernels: list[str]) -> None:
    configured = " ".join(spec.configured)
    tokens = list(spec.booted if spec.booted is not None else spec.configured)
    if not spec.kaslr:
        tokens.append("nokaslr")
    booted = " ".join(tokens)
    if spec.boot == "grub":
        tree.put("/etc/default/grub", "# If you change this file, run 'update-grub' afterwards.\n"
                 "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
                 "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
                 f'GRUB_CMDLINE_LINUX_DEFAULT="{configured}"\nGRUB_CMDLINE_LINUX=""\n')
        for name, text in spec.grub_d.items():
            tree.put(f"/etc/default/grub.d/{name}", text)
        generated = " ".join(spec.generated) if spec.generated is not None else configured
        cfg_tokens = generated if spec.grub_cfg_current else booted
        entries = "".join(
            f"menuentry 'Linux {k}' {{\n\tlinux\t/boot/vmlinuz-{k} root=UUID=0a1b2c3d ro "
            f"{cfg_tokens}\n\tinitrd\t/boot/initrd.img-{k}\n}}\n" for k in kernels)
        cfg = "/boot/grub2/grub.cfg" if spec.distro == "rhel" else "/boot/grub/grub.cfg"
        tree.put(cfg, "### BEGIN /etc/grub.d/10_linux ###\n" + entries)
        tree.put("/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{spec.running} root=UUID=0a1b2c3d "
                 f"ro {booted}\n")
    elif spec.boot == "bls":
        tree.put("/etc/default/grub", 'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX="crashkernel=1G-4G:192M'
                 ' rd.lvm.lv=rl/root"\nGRUB_ENABLE_BLSCFG=true\n')
        for k in kernels:
            tree.put(f"/boot/loader/entries/{MACHINE_ID}-{k}.conf",
                     f"title Rocky Linux ({k})\nversion {k}\nlinux /vmlinuz-{k}\n"
                     f"initrd /initramfs-{k}.img\noptions root=/dev/mapper/rl-root ro "
                     f"crashkernel=1G-4G:192M rd.lvm.lv=rl/root {configured}\n"
                     "grub_users $grub_users\ngrub_arg --unrestricted\ngrub_class rocky\n")
        tree.put("/proc/cmdline", f"BOOT_IMAGE=(hd0,gpt2)/vmlinuz-{spec.running} "
                 "root=/dev/mapper/rl-root ro crashkernel=1G-4G:192M rd.lvm.lv=rl/root "
                 f"{booted}\n")
    elif spec.boot == "systemd-boot":
        tree.put("/etc/kernel/cmdline", f"root=ZFS=rpool/ROOT/pve-1 boot=zfs {configured}\n")
        tree.put("/etc/kernel/proxmox-boot-uuids", "2A4B-1C3D\n")
        tree.put("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
                 'GRUB_CMDLINE_LINUX=""\n')
        tree.put("/proc/cmdline", f"initrd=\\EFI\\proxmox\\{spec.running}\\initrd.img-"
                 f"{spec.running} root=ZFS=rpool/ROOT/pve-1 boot=zfs {booted}\n")
    else:
        tree.put("/etc/kernel/cmdline", f"root=UUID=0a1b2c3d rw {configured}\n")
        tree.put("/proc/cmdline", f"root=UUID=0a1b2c3d rw {booted}\n")
    if spec.tuned:
        tree.put("/etc/tuned/bootcmdline", f'TUNED_BOOT_CMDLINE="{" ".join(spec.tuned)}"\n'
                 'TUNED_BOOT_INITRD_ADD=""\n')
        tree.put("/etc/grub.d/00_tuned", "#!/bin/sh\n")


def _packages(spec: DriverSpec, kernels: list[str]) -> str:
    stanzas: list[tuple[str, str, str]] = [("base-files", "13ubuntu10", "install ok installed"),
                                          ("dkms", "3.0.11-1ubuntu13", "install ok installed")]
    want = "hold" if spec.held else "install"
    branch = spec.userspace_version.split(".")[0]
    if spec.userspace_version and spec.distro in ("ubuntu", "debian", "proxmox"):
        version = f"{spec.userspace_version}-0ubuntu0.24.04.1"
        for name in (f"nvidia-driver-{branch}-server-open", f"libnvidia-compute-{branch}-server",
                     f"nvidia-utils-{branch}-server", f"nvidia-kernel-common-{branch}-server",
                     f"nvidia-dkms-{branch}-server-open"):
            stanzas.append((name, version, f"{want} ok installed"))
        if spec.module_origin == "precompiled":
            for k in kernels:
                if k not in spec.without_module:
                    stanzas.append((f"linux-modules-nvidia-{branch}-server-open-{k}",
                                    f"{k.rsplit('-', 1)[0]}+{spec.driver}", f"{want} ok installed"))
    if spec.persistenced_version and spec.distro in ("ubuntu", "debian", "proxmox"):
        pv = spec.persistenced_version
        stanzas.append((f"nvidia-compute-utils-{pv.split('.')[0]}-server",
                        f"{pv}-0ubuntu0.24.04.1", f"{want} ok installed"))
    if spec.fabricmanager != "absent":
        fm = spec.fabricmanager_version or spec.driver
        stanzas.append((f"nvidia-fabricmanager-{fm.split('.')[0]}", f"{fm}-1",
                        f"{want} ok installed"))
    if spec.unattended:
        stanzas.append(("unattended-upgrades", "2.9.1+nmu4ubuntu1", "install ok installed"))
    if spec.kernel_held and spec.distro in ("ubuntu", "debian"):
        flavour = spec.running.split("-", 2)[-1]
        stanzas += [(f"linux-image-{spec.running}", spec.running.rsplit("-", 1)[0] + ".1",
                     "hold ok installed"),
                    (f"linux-{flavour}", spec.running.rsplit("-", 1)[0] + ".1",
                     "hold ok installed")]
    return "".join(f"Package: {n}\nStatus: {s}\nPriority: optional\nVersion: {v}\n"
                   f"Description: {n}\n continued description line\n\n" for n, v, s in stanzas)


def _cdi(spec: DriverSpec) -> str:
    version, gpus = spec.cdi or (spec.driver, spec.gpus)
    libdir = "/usr/lib/x86_64-linux-gnu"
    devices = "".join(
        f"- name: \"{i}\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n"
        for i in range(gpus))
    mounts = "".join(
        f"  - hostPath: {libdir}/{lib}.so.{version}\n    containerPath: {libdir}/{lib}.so."
        f"{version}\n    options: [ro, nosuid, nodev, bind]\n"
        for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libEGL_nvidia"))
    return ("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + devices +
            "- name: all\n  containerEdits:\n    deviceNodes:\n" +
            "".join(f"    - path: /dev/nvidia{i}\n" for i in range(gpus)) +
            "containerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  - path: /dev/nvidia-uvm\n"
            "  - path: /dev/nvidia-uvm-tools\n  mounts:\n" + mounts +
            f"  - hostPath: /lib/firmware/nvidia/{version}/gsp_ga10x.bin\n"
            f"    containerPath: /lib/firmware/nvidia/{version}/gsp_ga10x.bin\n"
            "  - hostPath: /run/nvidia-persistenced/socket\n"
            "    containerPath: /run/nvidia-persistenced/socket\n"
            "  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n"
            "    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]\n")


def build_driver_host(spec: DriverSpec | None = None) -> Tree:
    """Build a GPU node whose driver lifecycle is as the spec says."""
    spec = spec or DriverSpec()
    tree = Tree()
    tree.put("/etc/hostname", spec.hostname + "\n")
    tree.put("/etc/machine-id", MACHINE_ID + "\n")
    tree.put("/etc/os-release", _os_release(spec))
    tree.put("/proc/sys/kernel/osrelease", spec.running + "\n")
    tree.put("/proc/version", f"Linux version {spec.running} (buildd@lcy02) (gcc 13.3) #1 SMP\n")
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov"
    if spec.environment == "vm":
        flags += " hypervisor"
        tree.put("/sys/class/dmi/id/sys_vendor", "QEMU\n")
        tree.put("/sys/class/dmi/id/product_name", "Standard PC (Q35 + ICH9, 2009)\n")
    else:
        tree.put("/sys/class/dmi/id/sys_vendor", "Supermicro\n")
        tree.put("/sys/class/dmi/id/product_name", "SYS-821GE-TNHR\n")
    tree.put("/proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
             f"model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: {flags}\n\n")
    if spec.environment == "container":
        tree.put("/run/systemd/container", "lxc\n")
        tree.put("/proc/1/cgroup", "0::/\n")
    else:
        tree.put("/proc/1/cgroup", "0::/init.scope\n")
    kernels = sorted({spec.running, *spec.installed})
    for release in kernels:
        _kernel(tree, spec, release)
    _boot(tree, spec, kernels)

    devices_dir = "/proc/driver/nvidia"
    gpu_addresses = [f"0000:{0x19 + 0x10 * i:02x}:00.0" for i in range(spec.gpus)]
    if spec.gpus and spec.module_loaded:
        tree.put(f"{devices_dir}/version", nvrm_line(spec.driver, spec.flavour))
        tree.put(f"{devices_dir}/params", params_text(spec.params))
        tree.put("/sys/module/nvidia/version", spec.driver + "\n")
        tree.put("/sys/module/nvidia/taint", "OE\n" if spec.flavour == "open" else "POE\n")
        tree.put("/sys/module/nvidia_modeset/parameters/hdmi_deepcolor", "Y\n")
        tree.put("/sys/module/nvidia_drm/parameters/modeset", "Y\n")
        tree.put("/sys/module/nvidia_drm/parameters/fbdev", "Y\n")
    if spec.uvm_disable_hmm is not None and spec.gpus and spec.module_loaded:
        for name, value in (("uvm_disable_hmm", spec.uvm_disable_hmm), ("uvm_perf_prefetch_enable",
                                                                       "1"),
                            ("uvm_ats_mode", "1")):
            tree.put(f"/sys/module/nvidia_uvm/parameters/{name}", value + "\n")
    for (module, name), value in spec.sys_params.items():
        tree.put(f"/sys/module/{module}/parameters/{name}", value + "\n")
    for index, address in enumerate(gpu_addresses):
        _pci(tree, address, 0x10DE, spec.gpu_device, 0x030200,
             "nouveau" if spec.nouveau else "nvidia" if spec.module_loaded else "", index=index)
        if not spec.module_loaded:
            continue
        tree.put(f"{devices_dir}/gpus/{address}/information",
                 f"Model: \t\t NVIDIA GPU\nIRQ:   \t\t 0\nGPU UUID: \t "
                 f"GPU-{index:08x}-1111-2222-3333-444455556666\nBus Location: \t {address}\n"
                 f"Device Minor: \t {index}\nGPU Excluded:\t No\n")
        tree.devices[f"/dev/nvidia{index}"] = (195, index)
    if spec.gpus:
        tree.devices["/dev/nvidiactl"] = (195, 255)
        tree.devices["/dev/nvidia-uvm"] = (508, 0)
        tree.devices["/dev/nvidia-uvm-tools"] = (508, 1)
        tree.put(f"/lib/firmware/nvidia/{spec.driver}/gsp_ga10x.bin", b"\x00firmware")
    for index in range(spec.nvswitches):
        address = f"0000:{0x1d + 0x10 * index:02x}:00.0"
        _pci(tree, address, 0x10DE, NVSWITCH, 0x068000, "nvidia-nvswitch", index=index)
        tree.devices[f"/dev/nvidia-nvswitch{index}"] = (509, index)
    if spec.nvswitches:
        tree.devices["/dev/nvidia-nvswitchctl"] = (509, 255)
    for index in range(spec.rdma_nics):
        address = f"0000:{0x1b + 0x10 * index:02x}:00.0"
        directory = _pci(tree, address, 0x15B3, MLX5, 0x020700, "mlx5_core", index=index)
        tree.links[f"/sys/class/infiniband/mlx5_{index}"] = (
            f"../../devices/{directory.removeprefix('/sys/devices/')}/infiniband/mlx5_{index}")
        tree.put(f"{directory}/infiniband/mlx5_{index}/node_type", "1: CA\n")
        tree.links[f"{directory}/infiniband/mlx5_{index}/device"] = "../../../" + address
    if spec.rdma_nics:
        tree.put("/sys/module/ib_core/refcnt", "4\n")
    for index in range(spec.amd_gpus):
        _pci(tree, f"0000:{0x1f + 0x10 * index:02x}:00.0", 0x1002, 0x74A1, 0x120000, "amdgpu",
             index=index)
    if spec.peermem:
        tree.put("/sys/module/nvidia_peermem/refcnt", "0\n")
        tree.put("/sys/module/nvidia_peermem/parameters/peerdirect_support", "0\n")

    # The userspace driver, with soname links as ldconfig leaves them.
    if spec.userspace_version:
        root = "/run/nvidia/driver" if spec.operator else ""
        libdir = f"{root}/usr/lib64" if spec.distro == "rhel" else \
            f"{root}/usr/lib/x86_64-linux-gnu"
        for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                    "libEGL_nvidia.so"):
            tree.put(f"{libdir}/{lib}.{spec.userspace_version}", b"\x7fELF shared object")
            tree.links[f"{libdir}/{lib}.1"] = f"{lib}.{spec.userspace_version}"
        tree.put("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        tree.put("/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
                 "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n"
                 "/usr/lib/x86_64-linux-gnu\n")
    for path, text in spec.modprobe.items():
        tree.put(path, text)
        tree.mtimes[path] = CONFIGURED_AT
    for path in [p for p in tree.files if p.startswith(("/boot/initrd.img-", "/boot/initramfs-"))]:
        tree.mtimes[path] = CONFIGURED_AT + (-86400 if spec.initramfs_stale else 86400)
    if spec.initramfs_nvidia:
        if spec.distro == "rhel":
            tree.put("/etc/dracut.conf.d/nvidia.conf",
                     'add_drivers+=" nvidia nvidia_modeset nvidia_uvm nvidia_drm "\n')
        else:
            tree.put("/etc/initramfs-tools/modules", "# List of modules\nnvidia\nnvidia_uvm\n")
    elif spec.distro == "rhel":
        tree.put("/usr/lib/dracut/dracut.conf.d/99-nvidia.conf",
                 'omit_drivers+=" nvidia nvidia-drm nvidia-modeset nvidia-uvm "\n')
    else:
        tree.put("/etc/initramfs-tools/initramfs.conf", "MODULES=most\n")

    # Daemons: pid files, /proc/<pid>/comm and cmdline, units and how they start.
    unitdir = "/usr/lib/systemd/system" if spec.distro == "rhel" else "/lib/systemd/system"
    if spec.persistenced != "absent" and spec.gpus:
        flag = " --no-persistence-mode" if spec.persistenced == "no-persistence" else ""
        tree.put(f"{unitdir}/nvidia-persistenced.service",
                 "[Unit]\nDescription=NVIDIA Persistence Daemon\nWants=syslog.target\n"
                 "StopWhenUnneeded=true\n\n[Service]\nType=forking\nExecStart=/usr/bin/"
                 f"nvidia-persistenced --user nvidia-persistenced{flag} --verbose\n"
                 "ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n")
        tree.put("/lib/udev/rules.d/71-nvidia.rules",
                 'ACTION=="add" DEVPATH=="/bus/pci/drivers/nvidia" RUN+="/bin/systemctl '
                 'start --no-block nvidia-persistenced.service"\n')
        if spec.persistenced != "stopped":
            tree.put("/run/nvidia-persistenced/nvidia-persistenced.pid", "2417\n")
            tree.put("/proc/2417/comm", "nvidia-persiste\n")
            argv = ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"]
            argv += ["--no-persistence-mode"] if flag else []
            tree.put("/proc/2417/cmdline", "\0".join([*argv, "--verbose"]) + "\0")
            # It drops to its own user (--user), in its unit's cgroup.
            process_identity(tree, 2417, "nvidia-persiste", 118,
                             "/system.slice/nvidia-persistenced.service")
    if spec.fabricmanager != "absent":
        tree.put(f"{unitdir}/nvidia-fabricmanager.service",
                 "[Unit]\nDescription=NVIDIA fabric manager service\n\n[Service]\nType=forking\n"
                 "ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/"
                 "fabricmanager.cfg\n\n[Install]\nWantedBy=multi-user.target\n")
        tree.links["/etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"] = (
            f"{unitdir}/nvidia-fabricmanager.service")
        if spec.fabricmanager == "running":
            tree.put("/proc/3121/comm", "nv-fabricmanage\n")
            process_identity(tree, 3121, "nv-fabricmanage", 0,
                             "/system.slice/nvidia-fabricmanager.service")
    tree.put("/proc/1/comm", "systemd\n")
    tree.links["/etc/systemd/system/multi-user.target.wants/ssh.service"] = (
        f"{unitdir}/ssh.service")
    tree.put("/run/systemd/journal/socket.note", "")
    tree.put("/proc/815/comm", "sshd\n")
    if spec.distro != "rhel":
        tree.put("/var/lib/dpkg/status", _packages(spec, kernels))
    if spec.unattended:
        tree.put("/usr/bin/unattended-upgrade", "#!/usr/bin/python3\n")
        tree.put("/etc/apt/apt.conf.d/20auto-upgrades",
                 'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade '
                 '"1";\n')
        tree.put("/etc/apt/apt.conf.d/50unattended-upgrades",
                 'Unattended-Upgrade::Allowed-Origins {\n\t"${distro_id}:${distro_codename}'
                 '-security";\n};\nUnattended-Upgrade::Package-Blacklist {\n};\n')
    if spec.reboot_required:
        tree.put("/var/run/reboot-required.pkgs", "\n".join(spec.reboot_required) + "\n")
    if spec.cdi is not None:
        tree.put("/etc/cdi/nvidia.yaml", _cdi(spec))
        tree.put(f"{unitdir}/nvidia-cdi-refresh.path",
                 "[Unit]\nDescription=Trigger CDI refresh on NVIDIA driver changes\n\n[Path]\n"
                 "PathChanged=/lib/modules/%v/modules.dep\n\n[Install]\n"
                 "WantedBy=multi-user.target\n")
        if spec.cdi_refresh:
            tree.links["/etc/systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path"] = (
                f"{unitdir}/nvidia-cdi-refresh.path")
    return tree


def driver_host(spec: DriverSpec | None = None, plant: Callable[[Tree], None] | None = None
                ) -> Base:
    """Return a case ``base``: write the node (and a planted change) to a directory."""
    from tests.support.sysroot import Sysroot

    def make(dest: Path) -> Sysroot:
        import os

        tree = build_driver_host(spec)
        if plant is not None:
            plant(tree)
        root = tree.write_dir(dest)
        if os.geteuid() != 0:
            # Device nodes need root: as a user, empty files stand in so the paths exist.
            for path in tree.devices:
                (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                (root / path.lstrip("/")).touch()
        return Sysroot(root)

    make.__name__ = "driver-host"
    return make
