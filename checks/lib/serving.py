"""Where GPUs are used and what serves on them: the GPUs this audit's environment holds, and
the systemd units of inference servers and batch daemons.

Shared by ``ipc.shm``, ``rdma.memlock`` and ``nccl.env``. Inside a container only the GPUs
passed into it count (their ``/dev/nvidiaN`` nodes: ``docker run --gpus`` and the NVIDIA
device plugin pass nodes, while ``/sys/bus/pci`` still shows every GPU of the host); outside,
the GPUs on the PCI bus that a host driver holds (one bound to ``vfio-pci`` serves a VM).
"""

from __future__ import annotations

from typing import NamedTuple

from auditor import environment as where
from auditor.checks.lib import nvidia, pci
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

NVIDIA_NODES = "/dev/nvidia[0-9]*"
#: AMD's compute node: a container given AMD GPUs has it, with their render nodes.
KFD = "/dev/kfd"
RENDER_NODES = "/dev/dri/renderD*"
READS: tuple[str, ...] = (NVIDIA_NODES, KFD, RENDER_NODES, *pci.DEVICE_READS, *where.READS)
_NVIDIA_NODE = lazy_re(r"/dev/nvidia[0-9]{1,4}")

#: Unit directories searched for serving units, highest priority first (systemd.unit(5)).
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system")
#: Name prefixes of the units that run inference servers and the jobs of batch schedulers.
SERVING_PREFIXES = ("vllm", "sglang", "tritonserver", "triton", "tgi", "text-generation",
                    "trtllm", "tensorrt-llm", "lmdeploy", "ray", "slurmd", "nim", "dynamo",
                    "llm", "inference")
UNIT_READS: tuple[str, ...] = tuple(f"{d}/{p}*.service" for d in UNIT_DIRS
                                    for p in SERVING_PREFIXES)
_MAX_UNITS = 64


class GpusHere(NamedTuple):
    """The GPUs work started here would use."""

    number: int
    #: How they were counted, in words.
    how: str


def gpus_here(host: Host) -> GpusHere:
    """Return the GPUs this environment holds (a container's own nodes, else the bus's)."""
    env = where.environment(host)
    if env.in_container:
        nodes = [p for p in host.glob(NVIDIA_NODES)[:1024] if _NVIDIA_NODE.fullmatch(p)]
        if nodes:
            return GpusHere(len(nodes), f"{len(nodes)} /dev/nvidiaN node(s) in the container")
        if host.exists(KFD):
            renders = len(host.glob(RENDER_NODES)[:1024])
            return GpusHere(renders, f"/dev/kfd and {renders} render node(s) in the container")
        return GpusHere(0, "no GPU device node in the container")
    gpus = [d for d in pci.devices(host) if d.is_gpu and not d.virtual_function
            and d.driver not in nvidia.PASSTHROUGH_DRIVERS and d.driver not in
            ("vfio-pci", "vfio_pci")]
    return GpusHere(len(gpus), f"{len(gpus)} GPU(s) on the PCI bus with a host driver")


def serving_units(host: Host) -> list[str]:
    """Return the paths of installed serving units, one per unit name (the first found)."""
    found: dict[str, str] = {}
    for pattern in UNIT_READS:
        for path in host.glob(pattern)[:_MAX_UNITS]:
            found.setdefault(path.rsplit("/", 1)[1], path)
        if len(found) >= _MAX_UNITS:
            break
    return [found[n] for n in sorted(found)]
