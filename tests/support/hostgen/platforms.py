"""Bare-metal CPU platforms whose idle states need judging by what they are: an AMD EPYC
host (acpi_idle's C2 is CC6 whatever latency the BIOS declares) and an arm64 host in the
manner of NVIDIA Grace (ACPI LPI states, where processor.max_cstate does nothing).

The layout follows the kernel: cpuidle states per CPU under cpuN/cpuidle/stateM with
the names the drivers give them (acpi_idle: ``C%d`` from _CST, ``LPI-%d`` from _LPI;
drivers/acpi/processor_idle.c), /proc/cpuinfo as each architecture prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.hostgen.base import Tree

CPU = "/sys/devices/system/cpu"

#: (name, desc, exit latency us, residency us) of acpi_idle's states on AMD EPYC (Zen 4):
#: C1 through MWAIT, C2 through the FCH's I/O port, which the core turns into CC6.
EPYC_STATES = (("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("C1", "ACPI FFH MWAIT 0x0", 1, 2),
               ("C2", "ACPI IOPORT 0x814", 18, 36))
#: Grace-like ACPI LPI states: WFI, then a core power-down.
GRACE_STATES = (("LPI-0", "WFI", 1, 1), ("LPI-1", "CPU power down", 150, 1500))


def cpu_tree(tree: Tree, cpus: int, driver: str,
             states: tuple[tuple[str, str, int, int], ...],
             disabled: frozenset[str] = frozenset()) -> None:
    """Write the CPU list and each CPU's cpuidle states."""
    tree.put(f"{CPU}/online", f"0-{cpus - 1}\n")
    tree.put(f"{CPU}/possible", f"0-{cpus - 1}\n")
    tree.put(f"{CPU}/present", f"0-{cpus - 1}\n")
    tree.put(f"{CPU}/offline", "\n")
    tree.put(f"{CPU}/cpuidle/current_driver", f"{driver}\n")
    tree.put(f"{CPU}/cpuidle/current_governor", "menu\n")
    for n in range(cpus):
        for index, (name, desc, latency, residency) in enumerate(states):
            base = f"{CPU}/cpu{n}/cpuidle/state{index}"
            for key, value in {"name": name, "desc": desc, "latency": str(latency),
                               "residency": str(residency),
                               "disable": "1" if name in disabled else "0",
                               "default_status": "enabled"}.items():
                tree.put(f"{base}/{key}", value + "\n")


def cpufreq_tree(tree: Tree, cpus: int, driver: str, governor: str, epp: str | None,
                 governors: str = "performance powersave") -> None:
    """Write one cpufreq policy per CPU, linked from each CPU's directory."""
    for n in range(cpus):
        policy = f"{CPU}/cpufreq/policy{n}"
        tree.links[f"{CPU}/cpu{n}/cpufreq"] = f"../cpufreq/policy{n}"
        values = {"scaling_driver": driver, "scaling_governor": governor,
                  "scaling_available_governors": governors, "affected_cpus": str(n),
                  "related_cpus": str(n), "cpuinfo_max_freq": "3700000",
                  "scaling_max_freq": "3700000", "scaling_min_freq": "1500000"}
        if epp is not None:
            values["energy_performance_preference"] = epp
            values["energy_performance_available_preferences"] = (
                "default performance balance_performance balance_power power")
        for key, value in values.items():
            tree.put(f"{policy}/{key}", value + "\n")


def numa_tree(tree: Tree, cpus: int, nodes: int, balancing: str) -> None:
    """Write the NUMA nodes and the balancing knob."""
    per_node = cpus // nodes
    for node in range(nodes):
        low = node * per_node
        tree.put(f"/sys/devices/system/node/node{node}/cpulist",
                 f"{low}-{low + per_node - 1}\n")
    tree.put("/sys/devices/system/node/online", f"0-{nodes - 1}\n")
    tree.put("/proc/sys/kernel/numa_balancing", balancing + "\n")


def epyc_cpuinfo(cpus: int) -> str:
    """Return /proc/cpuinfo of an AMD EPYC 9004 (Zen 4, family 25) host."""
    return "".join(
        f"processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu vme de pse tsc msr "
        "pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall "
        "nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid "
        "extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 sse4_2 "
        "x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic "
        "cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext "
        "perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd "
        "mba ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a "
        "avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni\n\n"
        for n in range(cpus))


def _common(tree: Tree, hostname: str, os_release: str, release: str, cmdline: str) -> None:
    tree.put("/etc/hostname", hostname + "\n")
    tree.put("/proc/sys/kernel/hostname", hostname + "\n")
    tree.put("/etc/machine-id", "0f3c9a4e2b7d4e1f8a6c5b4d3e2f1a0b\n")
    tree.put("/etc/os-release", os_release)
    tree.put("/proc/sys/kernel/osrelease", release + "\n")
    tree.put("/proc/cmdline", cmdline + "\n")
    tree.put("/proc/1/cgroup", "0::/init.scope\n")
    tree.put("/proc/1/uid_map", "         0          0 4294967295\n")
    tree.put("/usr/lib/systemd/system/systemd-sysctl.service", "[Unit]\n")


UBUNTU = ('PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
          'VERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n')


@dataclass
class EpycSpec:
    """An AMD EPYC inference host (8 GPUs' worth of CPU); flags plant problems."""

    cpus: int = 32
    #: acpi_idle's C2 (CC6) enabled; its BIOS declares only 18 us.
    cc6: bool = True
    #: tuned's latency-performance profile is active: its force_latency keeps C2 unused.
    tuned_latency: bool = False


def build_epyc(spec: EpycSpec | None = None) -> Tree:
    """Build a bare-metal AMD EPYC host with acpi_idle (C1, C2 = CC6) and two NUMA nodes."""
    spec = spec or EpycSpec()
    tree = Tree()
    _common(tree, "epyc-mi300x", UBUNTU, "6.8.0-60-generic",
            "BOOT_IMAGE=/boot/vmlinuz-6.8.0-60-generic root=/dev/mapper/vg-root ro quiet")
    tree.put("/proc/cpuinfo", epyc_cpuinfo(spec.cpus))
    tree.put("/sys/class/dmi/id/sys_vendor", "Supermicro\n")
    tree.put("/sys/class/dmi/id/product_name", "AS -8125GS-TNMR2\n")
    cpu_tree(tree, spec.cpus, "acpi_idle", EPYC_STATES,
             frozenset() if spec.cc6 else frozenset({"C2"}))
    tree.put("/sys/module/processor/parameters/max_cstate", "8\n")
    cpufreq_tree(tree, spec.cpus, "amd-pstate-epp", "performance", "performance")
    tree.put(f"{CPU}/amd_pstate/status", "active\n")
    tree.put(f"{CPU}/cpufreq/boost", "1\n")
    numa_tree(tree, spec.cpus, 2, "0")
    tree.put("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")
    tree.put("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
             'GRUB_CMDLINE_LINUX=""\n')
    if spec.tuned_latency:
        tree.put("/etc/tuned/active_profile", "latency-performance\n")
        tree.put("/etc/tuned/profile_mode", "manual\n")
        tree.links["/etc/systemd/system/multi-user.target.wants/tuned.service"] = (
            "/usr/lib/systemd/system/tuned.service")
        tree.put("/usr/lib/systemd/system/tuned.service", "[Unit]\nDescription=Dynamic "
                 "System Tuning Daemon\n")
        tree.put("/usr/lib/tuned/latency-performance/tuned.conf", (
            "#\n# tuned configuration\n#\n\n[main]\nsummary=Optimize for deterministic "
            "performance at the cost of increased power consumption\n\n[cpu]\n"
            "force_latency=cstate.id_no_zero:1|3\ngovernor=performance\n"
            "energy_perf_bias=performance\nmin_perf_pct=100\n\n[sysctl]\n"
            "kernel.sched_min_granularity_ns=3000000\nvm.swappiness=10\n"))
    return tree


@dataclass
class GraceSpec:
    """An arm64 host in the manner of NVIDIA Grace: ACPI LPI states; flags plant problems."""

    cpus: int = 16
    #: LPI-1 (the core power-down, 150 us) enabled.
    deep_lpi: bool = True


def build_grace(spec: GraceSpec | None = None) -> Tree:
    """Build an arm64 Grace-like host: acpi_idle over _LPI, cppc_cpufreq, one NUMA node."""
    spec = spec or GraceSpec()
    tree = Tree()
    _common(tree, "gh200-01", UBUNTU, "6.8.0-1021-nvidia-64k",
            "BOOT_IMAGE=/boot/vmlinuz-6.8.0-1021-nvidia-64k root=/dev/nvme0n1p2 ro")
    tree.put("/proc/cpuinfo", "".join(
        f"processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull "
        "sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 "
        "sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 "
        "sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh "
        "bti\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: "
        "0xd4f\nCPU revision\t: 0\n\n" for n in range(spec.cpus)))
    tree.put("/sys/class/dmi/id/sys_vendor", "NVIDIA\n")
    tree.put("/sys/class/dmi/id/product_name", "P3880\n")
    cpu_tree(tree, spec.cpus, "acpi_idle", GRACE_STATES,
             frozenset() if spec.deep_lpi else frozenset({"LPI-1"}))
    tree.put("/sys/module/processor/parameters/max_cstate", "8\n")
    cpufreq_tree(tree, spec.cpus, "cppc_cpufreq", "performance", None,
                 "conservative ondemand userspace powersave performance schedutil")
    numa_tree(tree, spec.cpus, 1, "1")
    tree.put("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT=""\n'
             'GRUB_CMDLINE_LINUX=""\n')
    return tree


# -- the next boot: a PCIe GPU box whose configured line is not the booted one ---------------

#: What the box was booted with (its IOMMU translating: amd_iommu=pt does nothing).
BOOTED_TOKENS = ("quiet", "amd_iommu=pt", "numa_balancing=disable")
#: What its loader is configured to pass at the next boot, on top of "quiet": passthrough,
#: ACS redirect off on the AMD root ports and Broadcom switch ports, acpi_idle capped at C1,
#: CPU0 isolated; numa_balancing=disable is dropped.
PENDING_TOKENS = ("iommu=pt", "pci=disable_acs_redir=pci:1022:14ab;pci:1000:c030",
                  "processor.max_cstate=1", "isolcpus=0-3")
RHEL = ('NAME="Rocky Linux"\nVERSION_ID="9.6"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
        'PRETTY_NAME="Rocky Linux 9.6 (Blue Onyx)"\n')
PVE = ('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\n'
       'VERSION_ID="13"\nID=debian\n')


@dataclass
class NextBootSpec:
    """Where the box keeps its command line; the pending tokens go there, not booted."""

    #: ``grub`` (a grub.d drop-in extends the line), ``bls`` (Rocky 9: a newer kernel's
    #: entry carries them, /etc/default/grub is stale) or ``systemd-boot``
    #: (proxmox-boot-tool's /etc/kernel/cmdline; /etc/default/grub is left from before).
    boot: str = "grub"
    pending: tuple[str, ...] = PENDING_TOKENS
    #: Runtime kernel.numa_balancing.
    balancing: str = "0"
    #: sysctl.d files, path -> content (systemd-sysctl order decides).
    sysctl: dict[str, str] | None = None


def build_next_boot(spec: NextBootSpec | None = None) -> Tree:
    """Build the 8-GPU PCIe box (classes.pcie_box) with EPYC idle states, two NUMA nodes and a
    boot loader configured with tokens the running kernel was not booted with."""
    from tests.support.hostgen.classes import pcie_box

    spec = spec or NextBootSpec()
    tree = pcie_box()
    for path in [p for p in tree.files if p.startswith("/etc/default/grub")]:
        del tree.files[path]
    cpu_tree(tree, 128, "acpi_idle", EPYC_STATES)
    tree.put("/sys/module/processor/parameters/max_cstate", "8\n")
    tree.put("/proc/sys/kernel/numa_balancing", spec.balancing + "\n")
    tree.put("/usr/lib/systemd/system/systemd-sysctl.service", "[Unit]\n")
    for path, text in (spec.sysctl or {}).items():
        tree.put(path, text)
    running = "6.8.0-60-generic"
    booted = " ".join(BOOTED_TOKENS)
    configured = ["quiet", *spec.pending]
    root = "root=/dev/mapper/vg-root ro"
    stale_grub = ('GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n'
                  f'GRUB_CMDLINE_LINUX_DEFAULT="{booted}"\nGRUB_CMDLINE_LINUX=""\n')
    if spec.boot == "grub":
        tree.put("/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{running} {root} {booted}\n")
        # grub-mkconfig sources the drop-in after /etc/default/grub: it extends the line.
        first, rest = configured[:2], configured[2:]
        tree.put("/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n'
                 f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(first)}"\nGRUB_CMDLINE_LINUX=""\n')
        escaped = " ".join(t.replace(";", "\\;") for t in rest)
        tree.put("/etc/default/grub.d/60-gpu.cfg",
                 f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {escaped}"\n')
    elif spec.boot == "bls":
        running = "5.14.0-503.40.1.el9_5.x86_64"
        newer = "5.14.0-570.23.1.el9_6.x86_64"
        tree.put("/etc/os-release", RHEL)
        tree.put("/proc/sys/kernel/osrelease", running + "\n")
        tree.put("/proc/version", f"Linux version {running} (mockbuild@rocky) #1 SMP\n")
        tree.put("/proc/cmdline", f"BOOT_IMAGE=(hd0,gpt2)/vmlinuz-{running} {root} {booted}\n")
        del tree.files["/boot/vmlinuz-6.8.0-60-generic"]
        tree.files.pop("/lib/modules/6.8.0-60-generic/modules.dep", None)
        tree.put("/etc/default/grub", stale_grub)
        machine = "0f3c9a4e2b7d4e1f8a6c5b4d3e2f1a0b"
        for release, options in ((running, booted), (newer, " ".join(configured))):
            tree.put(f"/boot/vmlinuz-{release}", b"\x7fELF")
            tree.put(f"/lib/modules/{release}/modules.dep", "")
            # BLS: options may be given on several lines, combined in order.
            tree.put(f"/boot/loader/entries/{machine}-{release}.conf",
                     f"title Rocky Linux ({release}) 9\nversion {release}\n"
                     f"linux /vmlinuz-{release}\ninitrd /initramfs-{release}.img\n"
                     f"options {root}\noptions {options}\n")
        tree.put("/boot/grub2/grubenv", f"saved_entry={machine}-{newer}\n")
    elif spec.boot == "systemd-boot":
        running = "6.14.8-2-pve"
        tree.put("/etc/os-release", PVE)
        tree.put("/proc/sys/kernel/osrelease", running + "\n")
        tree.put("/proc/version", f"Linux version {running} (build@proxmox) #1 SMP\n")
        # systemd-boot passes no BOOT_IMAGE=: the line is /etc/kernel/cmdline as written.
        tree.put("/proc/cmdline", f"initrd=\\EFI\\proxmox\\{running}\\initrd.img-{running} "
                 f"{root} {booted}\n")
        del tree.files["/boot/vmlinuz-6.8.0-60-generic"]
        tree.files.pop("/lib/modules/6.8.0-60-generic/modules.dep", None)
        tree.put(f"/boot/vmlinuz-{running}", b"\x7fELF")
        tree.put(f"/lib/modules/{running}/modules.dep", "")
        tree.put("/etc/default/grub", stale_grub)
        tree.put("/etc/kernel/proxmox-boot-uuids", "1A2B-3C4D\n")
        tree.put("/etc/kernel/cmdline", f"{root} {' '.join(configured)}\n")
    else:
        raise ValueError(f"unknown boot loader {spec.boot!r}")
    return tree
