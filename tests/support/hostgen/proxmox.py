"""An 8-GPU, 128-CPU Proxmox node with the six problems the project was made for.

Problems are planted by flags, all of them on by default: the host the project exists
for. The layout follows the kernel's sysfs and procfs, so real pciutils read it too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tests.support.hostgen.base import SPEEDS, Tree, pcie_config, sysfs_common


@dataclass
class HostSpec:
    """What to build, and which of the six problems to plant."""

    hostname: str = "pve-gpu-01"
    cpus: int = 128
    nodes: int = 2
    gpus: int = 8
    nics: int = 4
    bad_governor: bool = True
    deep_cstates: bool = True
    numa_balancing: bool = True
    old_kernel: bool = True
    low_mrrs: bool = True
    stale_lxc_major: bool = True
    uvm_major: int = 511
    stale_uvm_major: int = 509
    #: "amd" (amd-pstate-epp, acpi_idle) or "intel" (intel_pstate, intel_idle).
    vendor: str = "amd"
    #: "systemd-boot" (/etc/kernel/cmdline, as Proxmox on ZFS) or "grub" only.
    boot: str = "systemd-boot"
    #: Write the container's allow rules with the cgroup v1 key.
    cgroup1: bool = False
    #: sysfs as trees built by hand lay it out: cpufreq in each CPU's own directory
    #: (no policyN), PCI devices as plain directories in /sys/bus/pci/devices.
    flat_sysfs: bool = False


#: The checks whose problems a fix script repairs on the generated host; the sixth,
#: the kernel upgrade, stays the operator's choice.
FIXED_BY_SCRIPT = ("cpu.governor", "cpu.cstates", "numa.balancing", "pcie.mrrs",
                   "lxc.device_majors")


def build_host(spec: HostSpec | None = None) -> Tree:
    """Build an AMD EPYC Proxmox node with GPUs and NICs, problems as the spec says."""
    spec = spec or HostSpec()
    tree = Tree()
    cpu = "/sys/devices/system/cpu"
    last = spec.cpus - 1
    for name in ("online", "possible", "present"):
        tree.put(f"{cpu}/{name}", f"0-{last}\n")
    intel = spec.vendor == "intel"
    tree.put(f"{cpu}/cpuidle/current_driver", "intel_idle\n" if intel else "acpi_idle\n")
    tree.put(f"{cpu}/cpuidle/current_governor", "menu\n")
    if intel:
        tree.put(f"{cpu}/intel_pstate/status", "active\n")
        tree.put(f"{cpu}/intel_pstate/no_turbo", "0\n")
    else:
        tree.put(f"{cpu}/amd_pstate/status", "active\n")
        tree.put(f"{cpu}/cpufreq/boost", "1\n")
    governor = "powersave" if spec.bad_governor else "performance"
    epp = "balance_power" if spec.bad_governor else "performance"
    states = ([("POLL", 0, 0), ("C1", 1, 1), ("C1E", 4, 4), ("C6", 170, 600)] if intel
              else [("POLL", 0, 0), ("C1", 1, 2), ("C2", 800, 1600)])
    deep = "C6" if intel else "C2"
    for n in range(spec.cpus):
        if spec.flat_sysfs:
            policy = f"{cpu}/cpu{n}/cpufreq"
        else:
            policy = f"{cpu}/cpufreq/policy{n}"
            tree.links[f"{cpu}/cpu{n}/cpufreq"] = f"../cpufreq/policy{n}"
        for key, value in {
            "scaling_driver": "intel_pstate" if intel else "amd-pstate-epp",
            "scaling_governor": governor,
            "scaling_available_governors": "performance powersave",
            "affected_cpus": str(n),
            "related_cpus": str(n),
            "cpuinfo_max_freq": "3700000",
            "cpuinfo_min_freq": "400000",
            "scaling_max_freq": "3700000",
            "scaling_min_freq": "400000",
            "energy_performance_preference": epp,
            "energy_performance_available_preferences":
                "default performance balance_performance balance_power power",
        }.items():
            tree.put(f"{policy}/{key}", value + "\n")
        for index, (name, latency, residency) in enumerate(states):
            state = f"{cpu}/cpu{n}/cpuidle/state{index}"
            disabled = "1" if (name == deep and not spec.deep_cstates) else "0"
            for key, value in {
                "name": name, "desc": f"{'MWAIT' if intel else 'ACPI'} {name}",
                "latency": str(latency),
                "residency": str(residency), "disable": disabled, "default_status": "enabled",
            }.items():
                tree.put(f"{state}/{key}", value + "\n")
    per_node = spec.cpus // spec.nodes
    for node in range(spec.nodes):
        low = node * per_node
        tree.put(f"/sys/devices/system/node/node{node}/cpulist", f"{low}-{low + per_node - 1}\n")
    tree.put("/sys/devices/system/node/online", f"0-{spec.nodes - 1}\n")
    tree.put("/proc/sys/kernel/numa_balancing", "1\n" if spec.numa_balancing else "0\n")
    tree.put("/etc/sysctl.d/99-sysctl.conf", "# placeholder\n")
    tree.put("/etc/sysctl.conf", "# defaults\n")

    running = "6.8.12-4-pve" if spec.old_kernel else "6.14.8-2-pve"
    tree.put("/proc/sys/kernel/osrelease", running + "\n")
    tree.put("/proc/version", f"Linux version {running} (build@proxmox) #1 SMP PREEMPT_DYNAMIC\n")
    if spec.boot == "systemd-boot":
        tree.put("/proc/cmdline", f"initrd=\\EFI\\proxmox\\{running}\\initrd.img-{running} "
                 "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
        tree.put("/etc/kernel/proxmox-boot-uuids", "2A4B-1C3D\n2A4B-1C3E\n")
    else:
        tree.put("/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{running} "
                 "root=/dev/mapper/pve-root ro quiet\n")
    for version in {running, "6.14.8-2-pve"}:
        tree.put(f"/boot/vmlinuz-{version}", b"\x7fELF")
        # The driver's module, built by DKMS for every installed kernel.
        tree.put(f"/lib/modules/{version}/modules.dep",
                 "updates/dkms/nvidia.ko:\nupdates/dkms/nvidia-uvm.ko: updates/dkms/nvidia.ko\n")
    if spec.boot == "systemd-boot":
        tree.put("/etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    tree.put("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
             'GRUB_CMDLINE_LINUX=""\n')
    tree.put("/etc/hostname", spec.hostname + "\n")
    tree.put("/etc/machine-id", "4f0c2b6de0a94b4f9a0a2b8ad5c1e7a1\n")
    tree.put("/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian '
             'GNU/Linux"\nVERSION_ID="12"\nID=debian\n')
    tree.put("/etc/pve/.version", "{}\n")
    tree.put("/proc/driver/nvidia/version",
             "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
             "  (dvs-builder@U22-I3-AE18-09-3)  \nGCC version:  gcc version 12.2.0 (Debian "
             "12.2.0-14) \n")
    tree.put("/proc/devices", (
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n 10 misc\n"
        " 13 input\n195 nvidia-frontend\n195 nvidia\n195 nvidiactl\n226 drm\n"
        f"{spec.uvm_major} nvidia-uvm\n{spec.uvm_major + 1} nvidia-nvswitch\n"
        f"{spec.uvm_major + 2} nvidia-caps\n{spec.uvm_major + 3} nvidia-caps-imex-channels\n"
        "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
    ))
    tree.devices["/dev/nvidiactl"] = (195, 255)
    tree.devices["/dev/nvidia-uvm"] = (spec.uvm_major, 0)
    tree.devices["/dev/nvidia-uvm-tools"] = (spec.uvm_major, 1)
    tree.devices["/dev/nvidia-caps/nvidia-cap1"] = (spec.uvm_major + 2, 1)
    tree.devices["/dev/nvidia-caps/nvidia-cap2"] = (spec.uvm_major + 2, 2)

    devices: list[tuple[str, bytes, str, str]] = []
    for index in range(spec.gpus):
        bus = 0x18 + index * 0x10
        devices.append((
            f"0000:{bus:02x}:00.0",
            pcie_config(0x10DE, 0x2901, 0x030200, mrrs=512 if spec.low_mrrs else 4096,
                        current_speed=1),
            "0x030200", "nvidia",
        ))
        tree.devices[f"/dev/nvidia{index}"] = (195, index)
    for index in range(spec.nics):
        bus = 0x1A + index * 0x20
        devices.append((
            f"0000:{bus:02x}:00.0",
            pcie_config(0x15B3, 0x1021, 0x020700, mrrs=4096, mps=256),
            "0x020700", "mlx5_core",
        ))
    for address, config, class_code, driver in devices:
        bus = int(address[5:7], 16)
        root_port = f"0000:{bus - 1:02x}:01.0"
        domain = f"/sys/devices/pci0000:{bus - 1:02x}"
        port_dir = f"{domain}/{root_port}"
        if not spec.flat_sysfs:
            tree.put(f"{port_dir}/config", pcie_config(0x1022, 0x14AB, 0x060400, port_type=4,
                                                       mrrs=512))
            sysfs_common(tree, port_dir)
            tree.put(f"{port_dir}/class", "0x060400\n")
            tree.put(f"{port_dir}/vendor", "0x1022\n")
            tree.put(f"{port_dir}/device", "0x14ab\n")
            tree.links[f"/sys/bus/pci/devices/{root_port}"] = (
                f"../../../devices/pci0000:{bus - 1:02x}/{root_port}"
            )
        dev_dir = (f"/sys/bus/pci/devices/{address}" if spec.flat_sysfs
                   else f"{port_dir}/{address}")
        vendor, device = struct.unpack_from("<HH", config, 0)
        sysfs_common(tree, dev_dir)
        tree.put(f"{dev_dir}/config", config)
        tree.put(f"{dev_dir}/class", class_code + "\n")
        tree.put(f"{dev_dir}/vendor", f"0x{vendor:04x}\n")
        tree.put(f"{dev_dir}/device", f"0x{device:04x}\n")
        tree.put(f"{dev_dir}/numa_node", "0\n" if bus < 0x80 else "1\n")
        tree.put(f"{dev_dir}/max_link_speed", SPEEDS[5] + "\n")
        tree.put(f"{dev_dir}/max_link_width", "16\n")
        current = 1 if class_code.startswith("0x03") else 5
        tree.put(f"{dev_dir}/current_link_speed", SPEEDS[current] + "\n")
        tree.put(f"{dev_dir}/current_link_width", "16\n")
        if spec.flat_sysfs:
            tree.links[f"{dev_dir}/driver"] = f"../../drivers/{driver}"
        else:
            tree.links[f"{dev_dir}/driver"] = f"../../../../bus/pci/drivers/{driver}"
            tree.links[f"/sys/bus/pci/devices/{address}"] = (
                f"../../../devices/pci0000:{bus - 1:02x}/{root_port}/{address}"
            )
        if driver == "nvidia":
            tree.put(f"/proc/driver/nvidia/gpus/{address}/information",
                     "Model: \t\t NVIDIA B200\nBus Location: \t " + address + "\n")

    allowed = spec.stale_uvm_major if spec.stale_lxc_major else spec.uvm_major
    allow = "lxc.cgroup.devices.allow" if spec.cgroup1 else "lxc.cgroup2.devices.allow"
    mounts = [f"/dev/nvidia{i}" for i in range(spec.gpus)] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
    ]
    lines = [
        "arch: amd64", "cores: 64", "hostname: inference", "memory: 524288",
        "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth",
        "ostype: ubuntu", "rootfs: local-zfs:subvol-101-disk-0,size=200G", "unprivileged: 0",
        f"{allow}: c 195:* rwm",
        f"{allow}: c {allowed}:* rwm",
        f"{allow}: c {spec.uvm_major + 2}:* rwm",
    ]
    lines += [
        f"lxc.mount.entry: {node} {node[1:]} none bind,optional,create=file" for node in mounts
    ]
    lines += ["", "[before-upgrade]", "arch: amd64", "hostname: inference",
              f"lxc.cgroup2.devices.allow: c {spec.stale_uvm_major - 2}:* rwm",
              "snaptime: 1730000000", ""]
    tree.put("/etc/pve/lxc/101.conf", "\n".join(lines))
    tree.put("/etc/pve/lxc/102.conf", "arch: amd64\nhostname: web\nmemory: 2048\n"
             "rootfs: local-zfs:subvol-102-disk-0,size=8G\n")
    return tree
