"""numa.placement: where GPUs and NICs sit among the NUMA nodes, for pinning and GPUDirect.

On a host with several NUMA nodes with CPUs, each PCIe device hangs off one socket's root
complex. Firmware tells the kernel which (ACPI _PXM): ``numa_node`` and
``local_cpulist`` in sysfs. ``-1`` means firmware did not say: the kernel cannot place
DMA buffers or interrupts near the device and ``nvidia-smi topo`` shows no affinity. An
RDMA NIC whose nearest GPU (same PCIe switch, else same root complex) sits on another node
sends GPUDirect RDMA traffic across the socket interconnect. Every finding lists each
GPU's node and CPU list, so an inference server can be pinned (``numactl
--cpunodebind``). Nodes without CPUs (CXL memory, HBM, Grace's GPU memory) are not
placement targets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from auditor import environment
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import pci
from auditor.checks.lib.gpupath import NODE_READS, numa_nodes, short_list
from auditor.hosts.base import Host
from auditor.model import Finding, Severity

_MAX_LISTED = 32


def _root_complex(device: pci.PciDevice) -> str:
    """Return the host bridge a device hangs off (``pci0000:40``), or ""."""
    parts = device.path.split("/")
    return parts[3] if len(parts) > 3 and parts[3].startswith("pci") else ""


def _distance(nic: pci.PciDevice, gpu: pci.PciDevice) -> int | None:
    """Return how far up from the NIC the GPU's path joins it (None: not below one port)."""
    above = gpu.ancestors()
    for index, bridge in enumerate(nic.ancestors()):
        if bridge in above:
            return index
    return None


def nearest_gpus(nic: pci.PciDevice, gpus: Sequence[pci.PciDevice]) -> tuple[list[str], str]:
    """Return the GPUs nearest an RDMA NIC and how they are near (switch, root port, complex)."""
    joined = [(d, g) for g in gpus if (d := _distance(nic, g)) is not None]
    if joined:
        best = min(d for d, _ in joined)
        top = len(nic.ancestors()) - 1
        how = "the same root port" if best == top else "the same PCIe switch"
        return [g.address for d, g in joined if d == best], how
    complex_ = _root_complex(nic)
    same = [g.address for g in gpus if complex_ and _root_complex(g) == complex_]
    return same, "the same root complex" if same else ""


class NumaPlacement(Check[CheckOptions]):
    """GPUs and NICs should have a NUMA node, and RDMA NICs should share their GPU's."""

    id: ClassVar[str] = "numa.placement"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *pci.DEVICE_READS,
        *pci.NET_SPEED_READS,
        *pci.NUMA_READS,
        *NODE_READS,
        *environment.READS,
    )
    rationale: ClassVar[str] = (
        "An inference server is pinned per GPU to the CPUs and memory of the GPU's socket. A "
        "device whose numa_node is -1 gives no placement to pin to, and the kernel places its "
        "DMA buffers and interrupts anywhere; an RDMA NIC on another socket than its GPU sends "
        "every GPUDirect RDMA transfer across the socket interconnect."
    )
    remedy: ClassVar[str] = (
        "numa_node -1 is a firmware defect: update the BIOS, or enable its ACPI SRAT/_PXM "
        "(NUMA per socket) option. A NIC on the wrong socket needs another slot, or the GPU "
        "and NIC pairing chosen by socket (NCCL_IB_HCA, the server's GPU list). Pin servers "
        "with numactl --cpunodebind using the node each GPU lists."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        nodes = numa_nodes(host)
        if len(nodes.cpus) <= 1:
            where = f" ({env.describe()} without a virtual NUMA topology)" if env.vm else ""
            yield self.skipped("numa", f"{len(nodes.cpus) or 1} NUMA node with CPUs{where}: "
                               "nothing to place", evidence={"nodes": str(len(nodes.cpus))})
            return
        devices = [d for d in pci.devices(host) if not d.virtual_function
                   and (d.is_gpu or pci.is_data_path_nic(host, d))]
        if not devices:
            yield self.skipped("numa", "no GPU or data-path NIC (RDMA-capable, or "
                               "25 Gb/s and faster)")
            return
        placement: dict[str, tuple[int | None, str]] = {
            d.address: (pci.numa_node(host, d.address), pci.local_cpulist(host, d.address) or "")
            for d in devices}
        gpus = [d for d in devices if d.is_gpu]
        base: dict[str, str] = {"nodes_with_cpus": " ".join(f"{n}:{c}" for n, c in
                                                           sorted(nodes.cpus.items()))[:400]}
        if env.in_container:
            base["environment"] = f"{env.describe()}: the host's placement"
        for gpu in gpus[:_MAX_LISTED]:
            node, cpus = placement[gpu.address]
            base[f"gpu.{gpu.address}"] = f"node {node if node is not None else '?'}, cpus {cpus}"
        for device in devices:
            node, cpus = placement[device.address]
            kind = "GPU" if device.is_gpu else "RDMA NIC" if device.is_rdma_nic else "NIC"
            what = f"{pci.vendor_name(device.vendor)} {kind}"
            ev = {**base, "numa_node": str(node if node is not None else ""),
                  "local_cpulist": cpus}
            if node is None:
                yield self.skipped(device.address, f"{what}: numa_node is unreadable",
                                   evidence=ev)
                continue
            if node < 0 and env.vm:
                yield self.skipped(
                    device.address,
                    f"{what}: numa_node is -1 in a {env.describe()}: the hypervisor's "
                    "configuration maps no guest node to it (QEMU: a pxb-pcie bus with "
                    "numa_node=)", evidence=ev)
                continue
            if node < 0:
                yield self.warned(
                    device.address,
                    f"{what}: numa_node is -1 on a host with {len(nodes.cpus)} NUMA nodes: "
                    "firmware did not describe its locality, so nothing can be pinned near it",
                    observed="-1", expected="the node of its socket",
                    evidence={**ev, "problem": "no-node"})
                continue
            if device.is_rdma_nic and gpus:
                near, how = nearest_gpus(device, gpus)
                nodes_of = {n for a in near if (n := placement[a][0]) is not None and n >= 0}
                if near and nodes_of and node not in nodes_of and len(nodes_of) == len(
                        {placement[a][0] for a in near}):
                    yield self.warned(
                        device.address,
                        f"{what} on node {node}, but its nearest GPU(s) {short_list(near, 4)} "
                        f"({how}) are on node(s) {' '.join(str(n) for n in sorted(nodes_of))}: "
                        "GPUDirect RDMA crosses the socket interconnect",
                        observed=f"node {node}", expected=f"node {min(nodes_of)}",
                        evidence={**ev, "nearest_gpus": short_list(near), "nearest_by": how,
                                  "problem": "cross-node"})
                    continue
                if near:
                    ev.update(nearest_gpus=short_list(near), nearest_by=how)
            yield self.passed(device.address, f"{what} on node {node} (CPUs {cpus or '?'})",
                              observed=f"node {node}", evidence=ev)
