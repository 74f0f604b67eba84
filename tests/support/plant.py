"""Plant the problems the fix scripts repair into copies of the real captures.

Each planter also returns the findings its check emits for it, for tests of a
remediation alone.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from auditor.model import Finding, Severity, Status
from tests.support.factories import make_finding
from tests.support.sysroot import Sysroot

GPU = "0000:00:06.0"
CPUFREQ = "/sys/devices/system/cpu/cpufreq"
GOVERNORS = "conservative ondemand userspace powersave performance schedutil"


def finding(check: str, subject: str, evidence: dict[str, str], **kw: object) -> Finding:
    return make_finding(check=check, subject=subject, evidence=tuple(evidence.items()),
                        host="gpu-h200-vm", status=kw.pop("status", Status.FAIL),
                        severity=kw.pop("severity", Severity.HIGH), **kw)


def add_node(root: Sysroot, index: int) -> None:
    """Give the host NUMA node ``index`` with 8 CPUs of its own."""
    root.write(f"/sys/devices/system/node/node{index}/cpulist", f"{index * 8}-{index * 8 + 7}\n")


def plant_numa(root: Sysroot) -> list[Finding]:
    """numa_balancing=1 on 2 nodes and a sysctl.d file setting it to 1."""
    add_node(root, 1)
    root.write("/proc/sys/kernel/numa_balancing", "1\n")
    root.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 1\n")
    return [finding("numa.balancing", "kernel", {
        "nodes": "2", "runtime": "1", "boot_value": "1",
        "boot_source": "/etc/sysctl.d/60-numa.conf:1"})]


def plant_cpufreq(root: Sysroot, driver: str = "acpi-cpufreq", epp: bool = False
                  ) -> list[Finding]:
    """16 cpufreq policies: 0-7 on powersave, 8-15 on ondemand."""
    groups: dict[str, list[int]] = {"powersave": list(range(8)), "ondemand": list(range(8, 16))}
    for governor, cpus in groups.items():
        for cpu in cpus:
            policy = f"{CPUFREQ}/policy{cpu}"
            root.write(f"{policy}/scaling_governor", f"{governor}\n")
            root.write(f"{policy}/scaling_driver", f"{driver}\n")
            root.write(f"{policy}/scaling_available_governors", GOVERNORS + "\n")
            root.write(f"{policy}/affected_cpus", f"{cpu}\n")
            root.write(f"{policy}/related_cpus", f"{cpu}\n")
            root.write(f"{policy}/cpuinfo_max_freq", "3800000\n")
            root.write(f"{policy}/scaling_max_freq", "3800000\n")
            root.write(f"{policy}/scaling_min_freq", "1500000\n")
            if epp:
                root.write(f"{policy}/energy_performance_preference", "balance_power\n")
            root.symlink(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq", f"../cpufreq/policy{cpu}")
    return [
        finding("cpu.governor", "0-7" if g == "powersave" else "8-15", {
            "driver": driver, "governor": g, **({"epp": "balance_power"} if epp else {}),
            "policies": " ".join(f"policy{c}" for c in cpus),
            "available_governors": GOVERNORS}, observed=g, expected="performance")
        for g, cpus in groups.items()
    ]


STATES = (("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170))


def plant_cstates(root: Sysroot, driver: str = "intel_idle") -> list[Finding]:
    """intel_idle with C1, C1E and C6 enabled on every CPU."""
    root.write("/sys/devices/system/cpu/cpuidle/current_driver", f"{driver}\n")
    for cpu in range(16):
        for index, (name, latency) in enumerate(STATES):
            base = f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}"
            root.write(f"{base}/name", f"{name}\n")
            root.write(f"{base}/desc", f"{name} idle state\n")
            root.write(f"{base}/latency", f"{latency}\n")
            root.write(f"{base}/residency", f"{latency * 3}\n")
            root.write(f"{base}/disable", "0\n")
    return [finding("cpu.cstates", "C6", {
        "state": "state3", "cpus": "0-15", "latency_us": "170", "driver": driver,
        "limit_us": "10"})]


def setpci(root: Sysroot, *args: str) -> str:
    return subprocess.run(
        ["setpci", "-A", "linux-sysfs", "-O", f"sysfs.path={root.root}/sys/bus/pci", *args],
        capture_output=True, text=True, check=True).stdout.strip()


def mrrs(root: Sysroot, address: str = GPU) -> int:
    """Return MaxReadReq in bytes, as real setpci reads it from the sysroot."""
    return 128 << ((int(setpci(root, "-s", address, "CAP_EXP+08.w"), 16) >> 12) & 7)


def plant_mrrs(root: Sysroot) -> list[Finding]:
    """The H200's MaxReadReq lowered to 512 with real setpci (MaxPayload untouched)."""
    setpci(root, "-s", GPU, "CAP_EXP+08.w=2000:7000")
    return [finding("pcie.mrrs", GPU, {
        "class": "0x030200", "mrrs": "512", "mps": "256", "cap_offset": "0x60",
        "link_speed": "32.0 GT/s PCIe", "link_width": "16", "max_link_speed": "32.0 GT/s PCIe",
        "max_link_width": "16", "driver": "nvidia"}, observed="512", expected="4096")]


LXC_CONFIG = """\
arch: amd64
cores: 8
hostname: infer-01
memory: 65536
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
rootfs: local-lvm:vm-101-disk-0,size=64G

[before-upgrade]
arch: amd64
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:* rwm
snaptime: 1730000000
"""


def plant_lxc(root: Sysroot, path: str = "/etc/pve/lxc/101.conf", container: str = "101"
              ) -> list[Finding]:
    """A Proxmox container allowing nvidia-uvm by a stale major (509; it is 238 now)."""
    root.write(path, LXC_CONFIG)
    return [finding("lxc.device_majors", container, {
        "config": path, "flavour": "proxmox", "device": "/dev/nvidia-uvm",
        "driver_name": "nvidia-uvm", "allowed_major": "509", "current_major": "238",
        "rule": "lxc.cgroup2.devices.allow: c 509:* rwm"})]


def plant_old_kernel(root: Sysroot) -> list[Finding]:
    """A Proxmox VE 6.8 kernel, older than the policy's minimum for the Proxmox line."""
    root.write("/proc/sys/kernel/osrelease", "6.8.12-4-pve\n")
    root.write("/proc/version", "Linux version 6.8.12-4-pve (build@proxmox) (gcc 12.2.0)"
               " #1 SMP PREEMPT_DYNAMIC PMX 6.8.12-4 (2024-11-06T15:04Z)\n")
    return [finding("kernel.version", "kernel", {
        "running": "6.8.12-4-pve", "minimum": "6.14", "distro": "debian", "line": "pve"},
        observed="6.8.12-4-pve", expected=">= 6.14")]


GRUB = """\
# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=9"
GRUB_CMDLINE_LINUX=""
"""


def plant_grub(root: Sysroot) -> None:
    root.write("/etc/default/grub", GRUB)


def grub_line(root: Path) -> str:
    """Return the GRUB_CMDLINE_LINUX_DEFAULT line of a sysroot's /etc/default/grub."""
    lines = (root / "etc/default/grub").read_text().splitlines()
    return next(line for line in lines if line.startswith("GRUB_CMDLINE_LINUX_DEFAULT="))
