"""Where the audit runs when it is not bare metal: a KVM guest with passed-through GPUs,
and an unprivileged LXC container on a GPU host (the audit run inside it).

A KVM guest has the ``hypervisor`` CPU flag and QEMU's DMI strings, no cpufreq, and
the paravirtual haltpoll idle driver; its NUMA balancing is its own kernel's. Inside
an unprivileged container /sys and /proc/sys are the host's (read-only there), pid 1's
uid_map maps only part of the UIDs, systemd names the manager in
/run/systemd/container, and the container's own /etc/sysctl.d sets nothing on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.hostgen.base import Tree
from tests.support.hostgen.platforms import (
    CPU,
    EPYC_STATES,
    UBUNTU,
    cpu_tree,
    cpufreq_tree,
    epyc_cpuinfo,
    numa_tree,
)


@dataclass
class KvmGuestSpec:
    """A KVM guest with H100s passed through; flags plant problems of its own kernel."""

    vcpus: int = 32
    #: Automatic NUMA balancing on across the guest's two virtual nodes.
    numa_balancing: bool = False


def build_kvm_guest(spec: KvmGuestSpec | None = None) -> Tree:
    """Build a KVM guest: hypervisor flag, QEMU DMI, haltpoll, no cpufreq, two vNUMA nodes."""
    spec = spec or KvmGuestSpec()
    tree = Tree()
    for path, text in {
        "/etc/hostname": "h100-vm\n", "/proc/sys/kernel/hostname": "h100-vm\n",
        "/etc/machine-id": "7d1f3e5a9b2c4d6e8f0a1b2c3d4e5f60\n", "/etc/os-release": UBUNTU,
        "/proc/sys/kernel/osrelease": "6.8.0-60-generic\n",
        "/proc/cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.8.0-60-generic root=/dev/vda1 ro\n",
        "/proc/1/cgroup": "0::/init.scope\n",
        "/proc/1/uid_map": "         0          0 4294967295\n",
        "/sys/class/dmi/id/sys_vendor": "QEMU\n",
        "/sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n",
        "/sys/devices/system/clocksource/clocksource0/available_clocksource":
            "kvm-clock tsc acpi_pm \n",
        "/usr/lib/systemd/system/systemd-sysctl.service": "[Unit]\n",
        "/etc/default/grub": 'GRUB_CMDLINE_LINUX_DEFAULT=""\n',
    }.items():
        tree.put(path, text)
    tree.put("/proc/cpuinfo", "".join(
        f"processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu vme de pse tsc msr "
        "pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid tsc_known_freq "
        "pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
        "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch "
        "avx512f avx512dq\n\n" for n in range(spec.vcpus)))
    cpu_tree(tree, spec.vcpus, "haltpoll",
             (("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("haltpoll idle", "default "
              "architecture idle", 1, 1)))
    numa_tree(tree, spec.vcpus, 2, "1" if spec.numa_balancing else "0")
    if not spec.numa_balancing:
        tree.put("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    return tree


@dataclass
class ContainerAuditSpec:
    """The audit run inside an unprivileged LXC container; flags plant the host's problems."""

    cpus: int = 32
    #: The host's governor: powersave with a power-leaning EPP.
    host_powersave: bool = False
    #: The host's C2 (CC6) enabled.
    host_cc6: bool = False
    #: The host's NUMA balancing on (the container's own sysctl.d says 0).
    host_numa: bool = False


def build_container_audit(spec: ContainerAuditSpec | None = None) -> Tree:
    """Build what an unprivileged LXC container on an AMD EPYC Proxmox host sees."""
    spec = spec or ContainerAuditSpec()
    tree = Tree()
    for path, text in {
        "/etc/hostname": "llm-ct\n", "/proc/sys/kernel/hostname": "llm-ct\n",
        "/etc/machine-id": "3a5c7e9b1d2f4a6c8e0b2d4f6a8c0e2b\n", "/etc/os-release": UBUNTU,
        "/proc/sys/kernel/osrelease": "6.14.8-2-pve\n",
        "/proc/cmdline": "initrd=\\EFI\\proxmox\\6.14.8-2-pve\\initrd.img-6.14.8-2-pve "
                         "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n",
        # systemd writes the manager's name from container=lxc, which LXC sets.
        "/run/systemd/container": "lxc\n",
        "/proc/1/cgroup": "0::/\n",
        "/proc/1/uid_map": "         0     100000      65536\n",
        "/usr/lib/systemd/system/systemd-sysctl.service": "[Unit]\n",
        # The container's own sysctl.d: systemd-sysctl in the container cannot write
        # kernel.* (read-only /proc/sys), and the host never reads it.
        "/etc/sysctl.d/60-numa.conf": "kernel.numa_balancing = 0\n",
    }.items():
        tree.put(path, text)
    # The container's own PID namespace (not the kernel's initial one, 4026531836).
    tree.links["/proc/1/ns/pid"] = "pid:[4026532567]"
    tree.put("/proc/cpuinfo", epyc_cpuinfo(spec.cpus))
    cpu_tree(tree, spec.cpus, "acpi_idle", EPYC_STATES,
             frozenset() if spec.host_cc6 else frozenset({"C2"}))
    if spec.host_powersave:
        cpufreq_tree(tree, spec.cpus, "amd-pstate-epp", "powersave", "balance_power")
    else:
        cpufreq_tree(tree, spec.cpus, "amd-pstate-epp", "performance", "performance")
    tree.put(f"{CPU}/amd_pstate/status", "active\n")
    tree.put(f"{CPU}/cpufreq/boost", "1\n")
    numa_tree(tree, spec.cpus, 2, "1" if spec.host_numa else "0")
    tree.devices["/dev/nvidia0"] = (195, 0)
    tree.devices["/dev/nvidiactl"] = (195, 255)
    tree.devices["/dev/nvidia-uvm"] = (511, 0)
    return tree
