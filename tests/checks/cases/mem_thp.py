"""mem.thp: defrag=always on a DGX-class node and a Hyper-V VM (fixed by the selector step),
the kernel's madvise defaults, the latency profile's 'enabled', explicit huge pages unused or
on one node (Grace-Blackwell, SUSE), inside a container, and a capture without the files."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    grace_blackwell,
    hyperv_vm,
    suse_metal,
)
from tests.support.sysroot import Sysroot

CHECK = "mem.thp"
THP = "/sys/kernel/mm/transparent_hugepage"


def thp(enabled: str, defrag: str):  # type: ignore[no-untyped-def]
    def plant(root: Sysroot) -> None:
        words = ("always", "madvise", "never")
        root.write(f"{THP}/enabled", " ".join(f"[{w}]" if w == enabled else w
                                              for w in words) + "\n")
        root.write(f"{THP}/defrag", " ".join(
            f"[{w}]" if w == defrag else w
            for w in ("always", "defer", "defer+madvise", "madvise", "never")) + "\n")
    return plant


def hugepages(total: int, free: int, nodes: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def plant(root: Sysroot) -> None:
        thp("madvise", "madvise")(root)
        meminfo = root.read("/proc/meminfo").replace(
            "HugePages_Total:       0\nHugePages_Free:        0",
            f"HugePages_Total:    {total}\nHugePages_Free:     {free}")
        root.write("/proc/meminfo", meminfo)
        for node, count in enumerate(nodes):
            base = f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB"
            root.write(f"{base}/nr_hugepages", f"{count}\n")
            root.write(f"{base}/free_hugepages", f"{count * free // max(total, 1)}\n")
    return plant


CASES = [
    Case("kernel defaults: madvise, defrag madvise", Status.PASS, thp("madvise", "madvise"),
         base=base(dgx_class, "dgx")),
    Case("DGX-class: defrag=always", Status.WARN, thp("always", "always"),
         base=base(dgx_class, "dgx"), fixed=True),
    Case("Hyper-V VM: defrag=always", Status.WARN, thp("madvise", "always"),
         base=base(hyperv_vm, "hyperv"), fixed=True),
    Case("latency profile asks for madvise, THP is always", Status.WARN,
         thp("always", "madvise"), base=base(dgx_class, "dgx"),
         options=(("enabled", "madvise"),), fixed=True),
    Case("Grace-Blackwell: 16 GiB of huge pages reserved and unused", Status.WARN,
         hugepages(8192, 8192, (4096, 4096)), base=base(grace_blackwell, "gb200")),
    Case("SUSE: huge pages in use on both nodes", Status.PASS,
         hugepages(8192, 1024, (4096, 4096)), base=base(suse_metal, "sles")),
    Case("huge pages all on node 0 of two", Status.WARN, hugepages(8192, 1024, (8192, 0)),
         base=base(dgx_class, "dgx")),
    Case("inside a Docker container: the host's defrag=always", Status.WARN,
         thp("madvise", "always"), base=base(docker_gpu_container, "docker")),
    Case("the H200 capture: madvise, defrag madvise", Status.PASS, base=capture("h200")),
    Case("THP files not collected", Status.SKIP, base=base(dgx_class, "dgx")),
]
