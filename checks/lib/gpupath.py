"""What the checks of the GPU-to-GPU path share: who talks peer to peer, the bridges above
them, the host's architecture and NUMA nodes, and the kernel command line.

Read through the Host seam and cached per host (``host.fact``). Peer traffic is what
makes the path matter: two GPUs (tensor parallelism over NCCL), or a GPU and an RDMA NIC
(GPUDirect RDMA). Virtual functions are left out (they share their physical function's
path and settings), and so are NVSwitches (NVLink, not PCIe, carries their traffic).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from auditor.checks.lib import pci
from auditor.hosts.base import Host
from auditor.parsing import lazy_re, version_tuple

CMDLINE = "/proc/cmdline"
CPUINFO = "/proc/cpuinfo"
OSRELEASE = "/proc/sys/kernel/osrelease"
NODES = "/sys/devices/system/node"
#: What :func:`numa_nodes` reads.
NODE_READS = (f"{NODES}/node*", f"{NODES}/node*/cpulist")
#: The command line is a page at most (COMMAND_LINE_SIZE is 2048 to 4096 on every arch).
_CMDLINE_LIMIT = 8192
_MAX_TOKENS = 1024
VFIO_DRIVERS = frozenset({"vfio-pci", "vfio_pci"})


def cmdline_tokens(host: Host) -> list[str]:
    """Return the running kernel's command line split into tokens (bounded)."""
    def read(h: Host) -> list[str]:
        return (pci.read_file(h, CMDLINE, _CMDLINE_LIMIT) or "").split()[:_MAX_TOKENS]

    return list(host.fact("gpupath.cmdline", read))


def params(tokens: Iterable[str], key: str) -> list[str]:
    """Return the values of every ``key=value`` token, in command-line order."""
    found = []
    for token in tokens:
        name, sep, value = token.partition("=")
        if name == key and sep:
            found.append(value)
    return found


def architecture(host: Host) -> str:
    """Return ``x86_64``, ``aarch64`` or "" from /proc/cpuinfo (x86 names a vendor_id)."""
    def read(h: Host) -> str:
        text = pci.read_file(h, CPUINFO, 1 << 16) or ""
        keys = {line.partition(":")[0].strip() for line in text.splitlines()[:64]}
        if "vendor_id" in keys:
            return "x86_64"
        if "CPU implementer" in keys or "Features" in keys:
            return "aarch64"
        return ""

    return str(host.fact("gpupath.arch", read))


def cpu_part(host: Host) -> str:
    """Return the first ``CPU part`` of an arm64 host's /proc/cpuinfo (``0xd4f``), or ""."""
    def read(h: Host) -> str:
        text = pci.read_file(h, CPUINFO, 1 << 16) or ""
        for line in text.splitlines()[:64]:
            key, _, value = line.partition(":")
            if key.strip() == "CPU part":
                part = value.strip().lower()
                return part if len(part) <= 8 and part.isprintable() else ""
        return ""

    return str(host.fact("gpupath.cpu_part", read))


def kernel_release(host: Host) -> str:
    """Return the running kernel's release (``6.8.0-45-generic``), or ""."""
    release = (pci.read_file(host, OSRELEASE, 256) or "").strip()
    return release if release.isprintable() and len(release) <= 128 else ""


def kernel_before(host: Host, version: tuple[int, ...]) -> bool | None:
    """Return whether the running kernel is older than ``version`` (None if unknown)."""
    numbers = version_tuple(kernel_release(host))
    return numbers < version if len(numbers) >= 2 else None


_NODE = lazy_re(r"node([0-9]{1,4})")


class NumaNodes(NamedTuple):
    """The host's NUMA nodes: those with CPUs (their CPU lists) and those without."""

    cpus: dict[int, str]
    memory_only: tuple[int, ...]


def numa_nodes(host: Host) -> NumaNodes:
    """Return the online NUMA nodes, split by whether they have CPUs."""
    def read(h: Host) -> NumaNodes:
        cpus: dict[int, str] = {}
        memory_only: list[int] = []
        for path in h.glob(f"{NODES}/node*")[:4096]:
            match = _NODE.fullmatch(path.rsplit("/", 1)[-1])
            if not match:
                continue
            cpulist = (pci.read_file(h, f"{path}/cpulist") or "").strip()
            if cpulist:
                cpus[int(match.group(1))] = cpulist if cpulist.isprintable() else "?"
            else:
                memory_only.append(int(match.group(1)))
        return NumaNodes(cpus, tuple(sorted(memory_only)))

    return host.fact("gpupath.nodes", read)


#: What :func:`peers` reads beyond the PCI inventory: the GPU's model (the driver refuses
#: GeForce boards P2P) and AMD's xGMI hive membership.
PEER_READS: tuple[str, ...] = ("/proc/driver/nvidia/gpus/*/information",
                               f"{pci.PCI_DEVICES}/*/xgmi_hive_info/xgmi_hive_id")
#: Model names of boards the NVIDIA driver gives no peer-to-peer (nor GPUDirect RDMA).
_NO_P2P_MODELS = ("GeForce", "TITAN")
_MODEL = lazy_re(r"Model:\s{0,32}(.{1,128})")


class Peers(NamedTuple):
    """The functions that move data peer to peer: GPUs and RDMA-capable NICs."""

    gpus: tuple[pci.PciDevice, ...]
    rdma: tuple[pci.PciDevice, ...]
    #: GPUs the driver refuses peer-to-peer (GeForce boards): never a P2P finding.
    refused: tuple[pci.PciDevice, ...] = ()
    #: The fabric that carries GPU-to-GPU traffic instead of PCIe ("" for none).
    fabric: str = ""

    @property
    def capable(self) -> tuple[pci.PciDevice, ...]:
        """Return the GPUs that can do peer-to-peer."""
        refused = {d.address for d in self.refused}
        return tuple(d for d in self.gpus if d.address not in refused)

    @property
    def traffic(self) -> bool:
        """Return whether there is peer DMA over PCIe: two GPUs that can do P2P and no fabric
        carrying it instead, or such a GPU and an RDMA NIC."""
        capable = self.capable
        return (len(capable) >= 2 and not self.fabric) or (bool(capable) and bool(self.rdma))

    @property
    def devices(self) -> tuple[pci.PciDevice, ...]:
        return (*self.gpus, *self.rdma)

    @property
    def p2p_devices(self) -> tuple[pci.PciDevice, ...]:
        """Return the GPUs that can do P2P and the RDMA NICs."""
        return (*self.capable, *self.rdma)

    def describe(self) -> str:
        """Return the counts in words (``8 GPUs and 8 RDMA NICs``)."""
        gpus = f"{len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''}"
        nics = f"{len(self.rdma)} RDMA NIC{'s' if len(self.rdma) != 1 else ''}"
        notes = []
        if self.refused:
            notes.append(f"{len(self.refused)} GeForce: the driver refuses them P2P")
        if self.fabric and len(self.capable) >= 2:
            notes.append(f"GPU-to-GPU over {self.fabric}")
        return f"{gpus} and {nics}" + (f" ({'; '.join(notes)})" if notes else "")


def _refuses_p2p(host: Host, device: pci.PciDevice) -> bool:
    if not device.is_nvidia_gpu:
        return False
    text = pci.read_file(host, f"/proc/driver/nvidia/gpus/{device.address}/information") or ""
    match = _MODEL.search(text[:4096])
    return match is not None and any(word in match.group(1) for word in _NO_P2P_MODELS)


def _fabric(host: Host, gpus: Sequence[pci.PciDevice]) -> str:
    switches = sum(1 for d in pci.devices(host) if d.is_nvswitch)
    if switches and gpus and all(d.is_nvidia_gpu for d in gpus):
        return f"NVLink ({switches} NVSwitches)"
    hives = {(pci.read_file(host, f"{pci.device_path(d.address)}/xgmi_hive_info/"
                                  "xgmi_hive_id") or "").strip() for d in gpus
             if d.vendor == pci.AMD_GPU}
    if len(gpus) >= 2 and all(d.vendor == pci.AMD_GPU for d in gpus) and len(hives) == 1 \
            and "" not in hives and "0" not in hives:
        return "xGMI (one hive)"
    return ""


def peers(host: Host, *, exclude_vfio: bool = False) -> Peers:
    """Return the host's GPUs and RDMA NICs (physical functions only), which GPUs the driver
    refuses P2P, and the fabric that carries their traffic instead of PCIe."""
    found = [d for d in pci.devices(host) if not d.virtual_function
             and not (exclude_vfio and d.driver in VFIO_DRIVERS)]
    gpus = tuple(d for d in found if d.is_gpu)
    refused = tuple(d for d in gpus if _refuses_p2p(host, d))
    capable = [d for d in gpus if d not in refused]
    return Peers(gpus, tuple(d for d in found if d.is_rdma_nic), refused,
                 _fabric(host, capable))


def below(bridge: str, targets: Sequence[pci.PciDevice]) -> list[str]:
    """Return the addresses of the targets that sit below ``bridge``."""
    return [d.address for d in targets if bridge in d.ancestors()]


def bridges_above(targets: Sequence[pci.PciDevice]) -> dict[str, list[str]]:
    """Return each bridge above the targets with the targets below it, nearest first."""
    found: dict[str, list[str]] = {}
    for device in targets:
        for bridge in device.ancestors():
            found.setdefault(bridge, []).append(device.address)
    return found


#: NVIDIA GPUs of Grace superchips (GH200), whose host traffic runs over NVLink-C2C
#: (pci.ids: 2342 "GH100 [GH200 120GB / 480GB]", 2348 "GH100 [GH200 144G HBM3e]").
GRACE_GPU_DEVICE_IDS = frozenset({0x2342, 0x2348})
#: Grace's cores are Arm Neoverse V2 (MIDR part 0xd4f).
NEOVERSE_V2 = "0xd4f"


def nvlink_c2c(host: Host, device: pci.PciDevice) -> bool:
    """Return whether an NVIDIA GPU reaches host memory over NVLink-C2C (a Grace superchip).

    Told by the GPU's device id, or on a Neoverse V2 (Grace) host by the coherent GPU
    memory the driver onlines as NUMA nodes without CPUs: its PCIe link then carries no
    host traffic.
    """
    if not device.is_nvidia_gpu or architecture(host) != "aarch64":
        return False
    if device.device in GRACE_GPU_DEVICE_IDS:
        return True
    return cpu_part(host) == NEOVERSE_V2 and bool(numa_nodes(host).memory_only)


def short_list(items: Sequence[str], limit: int = 16) -> str:
    """Return items joined by spaces, cut to ``limit`` with a count of the rest."""
    shown = " ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")
