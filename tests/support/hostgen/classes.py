"""Whole hosts of the classes GPU inference runs on, built from public descriptions.

- :func:`pcie_box`: an 8-GPU PCIe server (dual EPYC, four Broadcom switches, RTX PRO
  6000 class GPUs, two ConnectX-7) with every problem of the GPU-to-GPU path planted by
  default: ACS redirect on, translated IOMMU (with ``amd_iommu=pt``), a 256 MiB BAR1,
  ASPM L1 and suspending ports, AER counts, a NIC on the wrong node and a GPU without
  one, a switch uplink trained at x8;
- :func:`dgx_h100`: 8 H100 SXM and 8 ConnectX-7 InfiniBand behind PCIe switches, four
  NVSwitches, SR-IOV VFs, the IOMMU off;
- :func:`mi300x`: 8 AMD Instinct MI300X on an EPYC host in one xGMI hive, a RoCE NIC per
  GPU, AMD-Vi in passthrough;
- :func:`grace_hopper`: an aarch64 GH200 node (NVLink-C2C GPU, arm-smmu-v3, a 6.8
  kernel, the GPU's memory as a NUMA node without CPUs);
- :func:`kvm_guest`: a KVM guest with two passed-through H100s, two InfiniBand VFs (no
  ``physfn`` inside a guest), virtio and an emulated e1000e.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.hostgen.base import Tree
from tests.support.hostgen.pcie import (
    ACS_KERNEL_ON,
    BRIDGE_CLASS,
    DOWNSTREAM,
    ROOT_PORT,
    Function,
    root_port,
    switch,
    write_topology,
)
from tests.support.sysroot import Sysroot

GIB = 1 << 30
MIB = 1 << 20
GRUB = "/etc/default/grub"
ASPM_POLICY = "/sys/module/pcie_aspm/parameters/policy"
REBAR_SIZES = tuple(1 << n for n in range(6, 18))  # 64 MiB .. 128 GiB


def _cpuinfo(arch: str, cpus: int, hypervisor: bool = False) -> str:
    if arch == "aarch64":
        return "".join(
            f"processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull "
            "sha1 sha2 crc32 atomics sve\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
            "CPU variant\t: 0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n\n" for n in range(cpus))
    vendor = "AuthenticAMD" if arch == "amd" else "GenuineIntel"
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov sse sse2 ht syscall"
    flags += " hypervisor" if hypervisor else ""
    return "".join(f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: 25\nmodel\t\t: 17"
                   f"\nflags\t\t: {flags}\n\n" for n in range(cpus))


@dataclass
class HostFiles:
    """The files around the PCIe tree: identity, CPUs, nodes, boot line, IOMMU units."""

    hostname: str
    arch: str
    cpus: int
    nodes: list[str]
    kernel: str
    cmdline: str
    memory_only_nodes: int = 0
    grub_cmdline: str = ""
    grub: bool = True
    os_release: str = ('PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
                       "ID=ubuntu\nID_LIKE=debian\n")
    dmi: tuple[str, str] = ("Supermicro", "AS -8125GS-TNHR")
    hypervisor: bool = False
    iommu_units: list[str] = field(default_factory=list)
    aspm_policy: str = "default"
    uptime_s: float = 86400.0
    nvidia: dict[str, str] = field(default_factory=dict)
    kernel_config: str = ""

    def write(self, tree: Tree) -> None:
        tree.put("/etc/hostname", self.hostname + "\n")
        tree.put("/proc/sys/kernel/hostname", self.hostname + "\n")
        tree.put("/etc/machine-id", hashlib.sha256(self.hostname.encode()).hexdigest()[:32]
                 + "\n")
        tree.put("/etc/os-release", self.os_release)
        tree.put("/proc/sys/kernel/osrelease", self.kernel + "\n")
        tree.put("/proc/version", f"Linux version {self.kernel} (buildd@lcy02) #1 SMP\n")
        tree.put("/proc/cmdline", self.cmdline + "\n")
        tree.put("/proc/cpuinfo", _cpuinfo(self.arch, self.cpus, self.hypervisor))
        tree.put("/proc/uptime", f"{self.uptime_s:.2f} {self.uptime_s * 10:.2f}\n")
        tree.put("/proc/1/cgroup", "0::/init.scope\n")
        tree.put("/proc/1/uid_map", "         0          0 4294967295\n")
        tree.put("/sys/class/dmi/id/sys_vendor", self.dmi[0] + "\n")
        tree.put("/sys/class/dmi/id/product_name", self.dmi[1] + "\n")
        for index, cpulist in enumerate(self.nodes):
            tree.put(f"/sys/devices/system/node/node{index}/cpulist", cpulist + "\n")
        for extra in range(self.memory_only_nodes):
            tree.put(f"/sys/devices/system/node/node{len(self.nodes) + extra}/cpulist", "\n")
        count = len(self.nodes) + self.memory_only_nodes
        tree.put("/sys/devices/system/node/online", f"0-{count - 1}\n" if count > 1 else "0\n")
        tree.put("/sys/devices/system/node/has_cpu",
                 f"0-{len(self.nodes) - 1}\n" if len(self.nodes) > 1 else "0\n")
        for unit in self.iommu_units:
            tree.put(f"/sys/class/iommu/{unit}/uevent", f"DEVNAME={unit}\n")
        tree.put(ASPM_POLICY, " ".join(f"[{p}]" if p == self.aspm_policy else p for p in
                                       ("default", "performance", "powersave",
                                        "powersupersave")) + "\n")
        if self.grub:
            tree.put(GRUB, "# If you change this file, run 'update-grub' afterwards.\n"
                     "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
                     f'GRUB_CMDLINE_LINUX_DEFAULT="{self.grub_cmdline}"\n'
                     'GRUB_CMDLINE_LINUX=""\n')
        tree.put(f"/boot/vmlinuz-{self.kernel}", b"\x7fELF")
        tree.put(f"/lib/modules/{self.kernel}/modules.dep", "")
        if self.kernel_config:
            tree.put(f"/boot/config-{self.kernel}", self.kernel_config)
        if self.nvidia:
            tree.put("/proc/driver/nvidia/version",
                     "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
                     "Release Build  (dvs-builder@U22)\n")
            tree.put("/proc/driver/nvidia/params",
                     "".join(f"{k}: {v}\n" for k, v in self.nvidia.items()))


def _gpu_info(tree: Tree, address: str, model: str) -> None:
    tree.put(f"/proc/driver/nvidia/gpus/{address}/information",
             f"Model: \t\t {model}\nBus Location: \t {address}\n")


# -- the 8-GPU PCIe box ---------------------------------------------------------------------


@dataclass
class PcieBoxSpec:
    """Which problems of the GPU-to-GPU path to plant (all of them by default)."""

    hostname: str = "pcie-box-01"
    acs: bool = True
    translated: bool = True
    small_bar: bool = True
    aspm: bool = True
    aer: bool = True
    numa: bool = True
    degraded_uplink: bool = True
    #: Write the AER counters to sysfs (False: a kernel without AER statistics).
    aer_files: bool = True
    aspm_policy: str = "default"


PCIE_BOX_GPUS = ("0000:43:00.0", "0000:44:00.0", "0000:63:00.0", "0000:64:00.0",
                 "0000:c3:00.0", "0000:c4:00.0", "0000:e3:00.0", "0000:e4:00.0")
PCIE_BOX_NICS = ("0000:45:00.0", "0000:c5:00.0")
PCIE_BOX_ROOT_PORTS = ("0000:40:01.1", "0000:60:01.1", "0000:c0:01.1", "0000:e0:01.1")
PCIE_BOX_GPU = (0x10DE, 0x2BB5)


def pcie_box_topology(spec: PcieBoxSpec) -> tuple[list[Function], dict[int, str]]:
    """Return the box's root ports (with everything below) and its IOMMU group types."""
    acs = ACS_KERNEL_ON if spec.acs else 0x0011
    kind = "DMA-FQ" if spec.translated else "identity"
    roots: list[Function] = []
    groups: dict[int, str] = {}
    group = 10
    for index, rc in enumerate((0x40, 0x60, 0xC0, 0xE0)):
        node = 0 if rc < 0x80 else 1
        cpus = "0-63" if node == 0 else "64-127"
        rp = root_port(f"0000:{rc:02x}:01.1", acs=acs, numa_node=node, local_cpulist=cpus)
        rp.iommu_group = group
        ports = switch(rp, f"0000:{rc + 1:02x}:00.0",
                       [f"0000:{rc + 2:02x}:{slot:02x}.0" for slot in range(3)], acs=acs,
                       numa_node=node, local_cpulist=cpus)
        upstream = rp.children[0]
        upstream.acs = None
        for fn in (upstream, *ports):
            fn.iommu_group = group
        roots.append(rp)
        groups[group] = kind
        group += 1
        for slot in range(2):
            address = f"0000:{rc + 3 + slot:02x}:00.0"
            gpu = ports[slot].add(Function(
                address, *PCIE_BOX_GPU, 0x030000, driver="nvidia", subsystem=(0x10DE, 0x204E),
                bars={0: 64 * MIB, 1: 256 * MIB if spec.small_bar else 128 * GIB,
                      3: 32 * MIB},
                rebar={1: REBAR_SIZES}, null_ecap=True, numa_node=node, local_cpulist=cpus,
                iommu_group=group, speed=5, current_speed=1 if slot else 5))
            groups[group] = kind
            group += 1
            ports[slot].power = ("auto", "active", 0)
            if spec.aspm:
                gpu.aspm_control = ports[slot].aspm_control = 0x2
                gpu.link = {"l1_aspm": "1", "clkpm": "0"}
                ports[slot].link = {"l1_aspm": "1", "clkpm": "0"}
            else:
                gpu.link = {"l1_aspm": "0", "clkpm": "0"}
                ports[slot].link = {"l1_aspm": "0", "clkpm": "0"}
        if index in (0, 2):
            nic_address = f"0000:{rc + 5:02x}:00.0"
            ports[2].add(Function(
                nic_address, 0x15B3, 0x1021, 0x020700, driver="mlx5_core",
                subsystem=(0x15B3, 0x0041), bars={0: 32 * MIB}, numa_node=node,
                local_cpulist=cpus, iommu_group=group, rdma=f"mlx5_{index // 2}",
                link={"l1_aspm": "0"}))
            groups[group] = kind
            group += 1
        rp.power = ("auto", "active", 0)
        upstream.link = {"l1_aspm": "1" if spec.aspm and index == 0 else "0"}
        if spec.aspm and index == 0:
            upstream.aspm_control = rp.aspm_control = 0x2
        rp.link = dict(upstream.link)
    by_address = {fn.address: fn for root in roots for fn in root.walk()}
    if spec.aspm:
        by_address["0000:60:01.1"].power = ("auto", "suspended", 123456)
        by_address["0000:c2:01.0"].power = ("auto", "active", 4200)
    if spec.aer:
        by_address["0000:44:00.0"].aer_correctable = {"RxErr": 3, "BadTLP": 250}
        by_address["0000:64:00.0"].aer_nonfatal = {"CmpltTO": 2}
        by_address["0000:62:01.0"].aer_fatal = {"SDES": 1}
    if spec.numa:
        by_address["0000:e4:00.0"].numa_node = -1
        by_address["0000:e4:00.0"].local_cpulist = "0-127"
        by_address["0000:c5:00.0"].numa_node = 0
        by_address["0000:c5:00.0"].local_cpulist = "0-63"
    if spec.degraded_uplink:
        by_address["0000:61:00.0"].current_width = 8
    if not spec.aer_files:
        for fn in by_address.values():
            fn.aer_files = False
    # The server's BMC display: VGA class like the GPUs, but not a GPU.
    bmc_port = root_port("0000:00:07.1", numa_node=0, local_cpulist="0-63")
    bmc_port.add(Function("0000:01:00.0", 0x1A03, 0x2000, 0x030000, driver="ast", aer=False,
                          speed=2, width=1, mrrs=512, numa_node=0))
    roots.append(bmc_port)
    return roots, groups


def pcie_box(spec: PcieBoxSpec | None = None) -> Tree:
    """Build the 8-GPU PCIe box, problems as the spec says."""
    spec = spec or PcieBoxSpec()
    tree = Tree()
    release = "6.8.0-60-generic"
    tokens = "quiet splash " + ("amd_iommu=pt" if spec.translated else
                                "iommu=pt pci=realloc,disable_acs_redir=pci:1022:14ab;"
                                "pci:1000:c030")
    grub_tokens = tokens.replace(";", "\\;")
    HostFiles(spec.hostname, "amd", 128, ["0-63", "64-127"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/mapper/vg-root ro {tokens}",
              grub_cmdline=grub_tokens, iommu_units=["ivhd0", "ivhd1", "ivhd2", "ivhd3"],
              aspm_policy=spec.aspm_policy,
              nvidia={"EnableResizableBar": "0", "EnablePCIeGen3": "0"}).write(tree)
    roots, groups = pcie_box_topology(spec)
    write_topology(tree, roots, group_types=groups)
    for address in PCIE_BOX_GPUS:
        _gpu_info(tree, address, "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    return tree


# -- DGX H100 -------------------------------------------------------------------------------


def dgx_h100(*, acs_on: bool = False, hostname: str = "dgx-h100-01") -> Tree:
    """Build a DGX-H100-class node: 8 H100 SXM and 8 CX-7 behind PEX switches, NVSwitches."""
    tree = Tree()
    release = "5.15.0-1042-nvidia"
    HostFiles(hostname, "intel", 224, ["0-55,112-167", "56-111,168-223"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=UUID=5b4c ro quiet",
              grub_cmdline="quiet",
              os_release='PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"'
                         "\nID=ubuntu\nID_LIKE=debian\n",
              dmi=("NVIDIA", "DGXH100"),
              nvidia={"EnableResizableBar": "0"}).write(tree)
    roots: list[Function] = []
    buses = (0x15, 0x29, 0x3B, 0x4D, 0x98, 0xAA, 0xBC, 0xCE)
    for index, bus in enumerate(buses):
        node = 0 if index < 4 else 1
        cpus = "0-55,112-167" if node == 0 else "56-111,168-223"
        rp = root_port(f"0000:{bus - 1:02x}:01.0", vendor=0x8086, device=0x352A,
                       acs=0x0000, numa_node=node, local_cpulist=cpus)
        slots = 3 if index % 2 == 0 else 2
        ports = switch(rp, f"0000:{bus:02x}:00.0",
                       [f"0000:{bus + 1:02x}:{s:02x}.0" for s in range(slots)],
                       acs=ACS_KERNEL_ON if acs_on else 0x0000, numa_node=node,
                       local_cpulist=cpus)
        rp.children[0].acs = None
        gpu = f"0000:{bus + 2:02x}:00.0"
        ports[0].add(Function(gpu, 0x10DE, 0x2330, 0x030200, driver="nvidia",
                              subsystem=(0x10DE, 0x16C1), bars={0: 16 * MIB, 1: 128 * GIB,
                                                                3: 32 * MIB},
                              rebar={1: REBAR_SIZES}, null_ecap=True, numa_node=node,
                              local_cpulist=cpus, current_speed=1, link={"l1_aspm": "0"}))
        _gpu_info(tree, gpu, "NVIDIA H100 80GB HBM3")
        nic = f"0000:{bus + 3:02x}:00.0"
        pf = ports[1].add(Function(nic, 0x15B3, 0x1021, 0x020700, driver="mlx5_core",
                                   subsystem=(0x15B3, 0x0041), bars={0: 32 * MIB},
                                   numa_node=node, local_cpulist=cpus, rdma=f"mlx5_{index}",
                                   link={"l1_aspm": "0"}))
        if index == 0:
            for vf in (1, 2):
                ports[1].add(Function(f"0000:{bus + 3:02x}:00.{vf}", 0x15B3, 0x101E,
                                      0x020700, driver="mlx5_core", physfn=pf.address,
                                      mrrs=128, aer=False, numa_node=node,
                                      rdma=f"mlx5_{8 + vf}"))
        if slots == 3:
            ports[2].add(Function(f"0000:{bus + 4:02x}:00.0", 0x10DE, 0x22A3, 0x068000,
                                  driver="nvidia-nvswitch", bars={0: 32 * MIB},
                                  numa_node=node, local_cpulist=cpus, speed=4, width=2))
        roots.append(rp)
    write_topology(tree, roots)
    return tree


# -- 8x MI300X ----------------------------------------------------------------------------


def mi300x(*, acs_covered: bool = True, hostname: str = "mi300x-01") -> Tree:
    """Build an 8x MI300X EPYC host: a Broadcom switch per GPU and its RoCE NIC, one xGMI
    hive, AMD-Vi in passthrough."""
    tree = Tree()
    release = "6.8.0-45-generic"
    acs_param = " pci=disable_acs_redir=pci:1000:c030;pci:1022:14ab" if acs_covered else ""
    HostFiles(hostname, "amd", 192, ["0-95", "96-191"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=UUID=1f2e ro iommu=pt{acs_param}",
              grub_cmdline=f"iommu=pt{acs_param}".replace(";", "\\;"),
              os_release='PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"'
                         "\nID=ubuntu\nID_LIKE=debian\n",
              dmi=("Dell Inc.", "PowerEdge XE9680"),
              iommu_units=["ivhd0", "ivhd1", "ivhd2", "ivhd3"]).write(tree)
    roots: list[Function] = []
    groups: dict[int, str] = {}
    acs = 0x0011 if acs_covered else ACS_KERNEL_ON
    for index in range(8):
        bus = 0x05 + index * 0x20
        node = 0 if index < 4 else 1
        cpus = "0-95" if node == 0 else "96-191"
        rp = root_port(f"0000:{bus - 1:02x}:01.1", acs=acs, numa_node=node,
                       local_cpulist=cpus, iommu_group=index + 1)
        ports = switch(rp, f"0000:{bus:02x}:00.0",
                       [f"0000:{bus + 1:02x}:{s:02x}.0" for s in range(2)], acs=acs,
                       numa_node=node, local_cpulist=cpus, iommu_group=index + 1)
        rp.children[0].acs = None
        gpu = f"0000:{bus + 2:02x}:00.0"
        ports[0].add(Function(gpu, 0x1002, 0x74A1, 0x120000, driver="amdgpu",
                              subsystem=(0x1002, 0x74A1), bars={0: 256 * GIB, 2: 2 * MIB,
                                                                5: 512 * 1024},
                              rebar={0: tuple(1 << n for n in range(8, 19))},
                              numa_node=node, local_cpulist=cpus, iommu_group=index + 1,
                              link={"l1_aspm": "0"},
                              extra={"xgmi_hive_info/xgmi_hive_id": "0x5f3a2c1b0d4e6a71\n"}))
        ports[1].add(Function(f"0000:{bus + 3:02x}:00.0", 0x14E4, 0x1760, 0x020000,
                              driver="bnxt_en", subsystem=(0x14E4, 0x1760),
                              bars={0: 64 * MIB}, numa_node=node, local_cpulist=cpus,
                              iommu_group=index + 1, rdma=f"bnxt_re{index}",
                              link={"l1_aspm": "0"}))
        groups[index + 1] = "identity"
        roots.append(rp)
    write_topology(tree, roots, group_types=groups)
    return tree


# -- Grace Hopper ---------------------------------------------------------------------------


def grace_hopper(*, hostname: str = "gh200-01") -> Tree:
    """Build a GH200 node: the GPU on NVLink-C2C, a CX-7, arm-smmu-v3 on a 6.8 kernel."""
    tree = Tree()
    release = "6.8.0-1021-nvidia-64k"
    HostFiles(hostname, "aarch64", 72, ["0-71"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=UUID=77aa ro console=ttyAMA0",
              memory_only_nodes=1, grub_cmdline="console=ttyAMA0",
              os_release='PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"'
                         "\nID=ubuntu\nID_LIKE=debian\n",
              dmi=("NVIDIA", "P3880"), nvidia={"EnableResizableBar": "0"},
              iommu_units=["smmu3.0x0000000011000000", "smmu3.0x0000000012000000"]).write(tree)
    gpu_port = Function("0009:00:00.0", 0x10DE, 0x22B2, BRIDGE_CLASS, port_type=ROOT_PORT,
                        driver="pcieport", acs=ACS_KERNEL_ON, numa_node=0, iommu_group=8)
    gpu_port.add(Function("0009:01:00.0", 0x10DE, 0x2342, 0x030200, driver="nvidia",
                          subsystem=(0x10DE, 0x16EB), bars={0: 16 * MIB, 1: 256 * GIB},
                          mrrs=512, numa_node=0, local_cpulist="0-71", iommu_group=9,
                          link={"l1_aspm": "0"}))
    nic_port = Function("0000:00:00.0", 0x10DE, 0x22B8, BRIDGE_CLASS, port_type=ROOT_PORT,
                        driver="pcieport", acs=ACS_KERNEL_ON, numa_node=0, iommu_group=1)
    nic_port.add(Function("0000:01:00.0", 0x15B3, 0x1021, 0x020700, driver="mlx5_core",
                          subsystem=(0x15B3, 0x0041), bars={0: 32 * MIB}, numa_node=0,
                          local_cpulist="0-71", iommu_group=2, rdma="mlx5_0",
                          link={"l1_aspm": "0"}))
    write_topology(tree, [gpu_port, nic_port],
                   group_types={1: "DMA", 2: "DMA", 8: "DMA", 9: "DMA"})
    _gpu_info(tree, "0009:01:00.0", "NVIDIA GH200 480GB")
    return tree


# -- a KVM guest ----------------------------------------------------------------------------


KVM_GPUS = ("0000:01:00.0", "0000:02:00.0")
KVM_VFS = ("0000:03:00.0", "0000:04:00.0")


def kvm_guest(*, hostname: str = "vm-h100-01") -> Tree:
    """Build a KVM guest: passed-through H100s and IB VFs on QEMU root ports, virtio, e1000e."""
    tree = Tree()
    release = "6.8.0-60-generic"
    HostFiles(hostname, "intel", 32, ["0-15", "16-31"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/vda1 ro console=ttyS0",
              grub_cmdline="console=ttyS0", hypervisor=True,
              dmi=("QEMU", "Standard PC (Q35 + ICH9, 2009)"),
              nvidia={"EnableResizableBar": "0"}).write(tree)
    roots: list[Function] = []
    host_bridge = Function("0000:00:00.0", 0x8086, 0x29C0, 0x060000, aer=False,
                           subsystem=(0x1AF4, 0x1100), numa_node=-1)
    roots.append(host_bridge)
    devices = [
        Function(KVM_GPUS[0], 0x10DE, 0x2330, 0x030200, driver="nvidia",
                 subsystem=(0x10DE, 0x16C1), bars={0: 16 * MIB, 1: 128 * GIB}, numa_node=-1,
                 aer=False),
        Function(KVM_GPUS[1], 0x10DE, 0x2330, 0x030200, driver="nvidia",
                 subsystem=(0x10DE, 0x16C1), bars={0: 16 * MIB, 1: 128 * GIB}, numa_node=-1,
                 aer=False),
        # A VF's MaxReadReq field is reserved and reads 128 bytes; no physfn in a guest.
        Function(KVM_VFS[0], 0x15B3, 0x101E, 0x020700, driver="mlx5_core", mrrs=128,
                 mps=128, numa_node=-1, aer=False, rdma="mlx5_0"),
        Function(KVM_VFS[1], 0x15B3, 0x101E, 0x020700, driver="mlx5_core", mrrs=128,
                 mps=128, numa_node=-1, aer=False, rdma="mlx5_1"),
        Function("0000:05:00.0", 0x1AF4, 0x1041, 0x020000, driver="virtio-pci",
                 subsystem=(0x1AF4, 0x1100), numa_node=-1, aer=False, mrrs=512),
        Function("0000:06:00.0", 0x8086, 0x10D3, 0x020000, driver="e1000e",
                 subsystem=(0x1AF4, 0x1100), numa_node=-1, aer=False, mrrs=512, speed=1,
                 width=1),
    ]
    for slot, device in enumerate(devices, start=2):
        # QEMU's pcie-root-port: an emulated link, 2.5GT/s x1 unless configured.
        port = Function(f"0000:00:{slot:02x}.0", 0x1B36, 0x000C, BRIDGE_CLASS,
                        port_type=ROOT_PORT, driver="pcieport", speed=1, width=1, aer=False,
                        subsystem=(0x1AF4, 0x1100), numa_node=-1)
        port.add(device)
        roots.append(port)
    write_topology(tree, roots)
    for address in KVM_GPUS:
        _gpu_info(tree, address, "NVIDIA H100 80GB HBM3")
    return tree


# -- bases for the cases ------------------------------------------------------------------


def base(build: Callable[[], Tree], name: str) -> Callable[[Path], Sysroot]:
    """Return a case base that writes ``build()``'s tree into the case's directory."""
    def make(dest: Path) -> Sysroot:
        return Sysroot(build().write_dir(dest))

    make.__name__ = name
    return make


__all__ = ["DOWNSTREAM", "KVM_GPUS", "KVM_VFS", "PCIE_BOX_GPUS", "PCIE_BOX_NICS",
           "PCIE_BOX_ROOT_PORTS", "PcieBoxSpec", "base", "dgx_h100", "grace_hopper",
           "kvm_guest", "mi300x", "pcie_box", "pcie_box_topology"]
