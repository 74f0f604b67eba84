"""rdma.peermem: GPUs and RDMA NICs on one host, and a path for GPUDirect RDMA between them.

NCCL's network transport moves GPU buffers straight to the NIC only when the NIC can map GPU
memory: through ``nvidia_peermem`` (the peer-memory client for the RDMA core), or through
DMA-BUF, which needs NVIDIA's open kernel module and a kernel of 5.12 or later (NCCL
user guide, "GPU Direct RDMA"; NVIDIA/nccl#489). Without either, every inter-node transfer
is staged through host memory. ``nvidia_peermem`` must be loaded at every boot: the driver
does not load it on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import files, kernels, nvidia, pci
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import version_tuple

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

MODULES_LOAD_DIRS = ("/etc/modules-load.d", "/run/modules-load.d", "/usr/local/lib/modules-load.d",
                     "/usr/lib/modules-load.d", "/lib/modules-load.d")
ETC_MODULES = "/etc/modules"
CONF = "/etc/modules-load.d/nvidia-peermem.conf"
#: The peer-memory modules: NVIDIA's, and Mellanox's older one.
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
DMABUF_KERNEL = (5, 12)


def loaded_at_boot(host: Host, modules: Sequence[str]) -> str:
    """Return the file that loads one of ``modules`` at boot (modules-load.d, /etc/modules)."""
    found = [p for d in MODULES_LOAD_DIRS for p in host.glob(f"{d}/*.conf")[:128]]
    found.append(ETC_MODULES)
    wanted = {m.replace("-", "_") for m in modules}
    for path in found:
        for line in (files.read_optional(host, path) or "").split("\n")[:1024]:
            word = line.split("#", 1)[0].strip().split(" ")[0].replace("-", "_")
            if word in wanted:
                return path
    return ""


class RdmaPeermem(Check[CheckOptions]):
    """GPUs with RDMA NICs need nvidia_peermem or DMA-BUF, or NCCL stages through host memory."""

    id: ClassVar[str] = "rdma.peermem"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *(f"/sys/module/{m}" for m in PEERMEM_MODULES),
        "/sys/module/ib_core",
        *(f"{d}/*.conf" for d in MODULES_LOAD_DIRS),
        ETC_MODULES,
        *nvidia.DRIVER_READS,
        kernels.OSRELEASE,
        kernels.PROC_VERSION,
        *pci.DEVICE_READS,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "Multi-node tensor or pipeline parallelism moves activations between GPUs over RDMA "
        "NICs. NCCL's GPUDirect RDMA needs nvidia_peermem or DMA-BUF (open kernel module, "
        "kernel 5.12+); without either, every transfer is copied through host memory, "
        "costing bandwidth and latency on each step."
    )
    remedy: ClassVar[str] = (
        "Load nvidia_peermem now (modprobe nvidia-peermem) and at every boot "
        "(/etc/modules-load.d/nvidia-peermem.conf), or use the open kernel module on a "
        "5.12+ kernel so NCCL can use DMA-BUF."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.PCI})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self._judge(host)

    def _judge(self, host: Host) -> Finding:
        devices = pci.devices(host)
        nics = [d for d in devices if d.is_rdma_nic]
        gpus = [d for d in devices if d.is_nvidia_gpu and d.driver not in
                nvidia.PASSTHROUGH_DRIVERS]
        ev = {"rdma_nics": " ".join(n.address for n in nics)[:512],
              "gpus": " ".join(g.address for g in gpus)[:512]}
        if not nics:
            return self.skipped("gpudirect", "no RDMA NIC: GPUDirect RDMA does not apply",
                                evidence=ev)
        if not gpus:
            return self.skipped("gpudirect", "no NVIDIA GPU driven on this host", evidence=ev)
        env = environment(host)
        if env.in_container:
            return self.skipped("gpudirect", f"inside a {env.describe()}: kernel modules are "
                                "the host's; audit the host", evidence=ev)
        driver = nvidia.loaded_driver(host)
        release = kernels.running_kernel(host) or ""
        loaded = [m for m in PEERMEM_MODULES if host.exists(f"/sys/module/{m}")]
        at_boot = loaded_at_boot(host, PEERMEM_MODULES)
        dmabuf = (driver is not None and driver.flavour == "open"
                  and version_tuple(release)[:2] >= DMABUF_KERNEL)
        ev.update(peermem=" ".join(loaded), at_boot=at_boot, kernel=release,
                  driver=f"{driver.version} {driver.flavour}" if driver else "",
                  dmabuf="yes" if dmabuf else "no")
        what = f"{len(gpus)} GPU(s) and {len(nics)} RDMA NIC(s)"
        if dmabuf:
            extra = f"; {loaded[0]} is loaded too" if loaded else ""
            return self.passed(
                "gpudirect", f"{what}: the open NVIDIA module {driver.version if driver else ''}"
                f" on kernel {release} gives NCCL its DMA-BUF path to GPUDirect RDMA{extra}",
                evidence=ev)
        why = ("the proprietary kernel module has no DMA-BUF export" if driver and
               driver.flavour == "proprietary" else f"kernel {release} is older than 5.12"
               if driver else "no NVIDIA module is loaded")
        if loaded and at_boot:
            return self.passed("gpudirect", f"{what}: {loaded[0]} is loaded (and at boot by "
                               f"{at_boot})", evidence=ev)
        if loaded:
            return self.warned(
                "gpudirect", f"{what}: {loaded[0]} is loaded now but nothing loads it at boot "
                f"({why}, so there is no DMA-BUF path): after a reboot NCCL stages RDMA "
                "through host memory", observed="not loaded at boot", expected="loaded at boot",
                evidence=ev, fix=f"nvidia-peermem in {CONF}")
        if at_boot:
            return self.warned(
                "gpudirect", f"{what}: {at_boot} loads nvidia-peermem at boot but it is not "
                f"loaded now ({why}): until it is (modprobe nvidia-peermem) or the host "
                "reboots, NCCL stages inter-node traffic through host memory",
                observed="not loaded", expected="nvidia_peermem loaded", evidence=ev,
                fix="modprobe nvidia-peermem")
        ib_core = host.exists("/sys/module/ib_core")
        tail = "" if ib_core else " (ib_core is not loaded either: the RDMA stack comes first)"
        return self.warned(
            "gpudirect", f"{what} but neither nvidia_peermem is loaded nor a DMA-BUF path "
            f"exists ({why}): NCCL stages inter-node traffic through host memory{tail}",
            observed="no GPUDirect RDMA path", expected="nvidia_peermem or DMA-BUF",
            evidence=ev, fix=f"modprobe nvidia-peermem, and nvidia-peermem in {CONF}")

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Load nvidia-peermem at every boot (modules-load.d); say how to load it now."""
        from auditor.remedy import Advice, Remedy, WriteFile
        return [Remedy(
            check=self.id, subject=finding.subject, title="load nvidia-peermem at boot",
            persistent=(WriteFile(CONF, "# Written by host-auditor: GPUDirect RDMA for NCCL.\n"
                                  "nvidia-peermem\n"),),
            advice=(Advice("load it now", ("modprobe", "nvidia-peermem")),),
        ) for finding in findings]
