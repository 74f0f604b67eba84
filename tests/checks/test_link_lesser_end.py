"""A link is judged against the link: the lesser of both ends' capabilities (issue 27, rule
10). A x16 GPU in a bifurcated x8/x8 slot under a x8 root port, or a Gen5 NIC under a Gen4
port, is not a "reseat" finding; a x16 GPU trained x8 under a x16 port still is. On a
DGX-class generated host whose GPUs and NIC sit behind root ports of their own."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.pcie_mrrs import PcieMrrs
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.hostgen.base import pcie_config
from tests.support.hostgen.serving import dgx_class
from tests.support.sysroot import Sysroot

PORT = (0x8086, 0x352A, 0x060400)


def _host(tmp_path: Path) -> Sysroot:
    tree = dgx_class(gpus=2, nvswitches=0, rdma_nics=1)
    gpu0, gpu1, nic = "0000:19:00.0", "0000:29:00.0", "0000:1b:00.0"
    ports = {gpu0: "0000:18:01.0", gpu1: "0000:28:01.0", nic: "0000:1a:01.0"}
    def directory(address: str) -> str:
        bus = ports[address][5:7]
        return f"/sys/devices/pci0000:{bus}/{ports[address]}"
    # GPU 0: bifurcated slot, the root port is x8; the GPU (x16 capable) trained x8.
    tree.put(f"{directory(gpu0)}/config", pcie_config(*PORT, port_type=4, width=8))
    tree.put(f"{directory(gpu0)}/{gpu0}/config",
             pcie_config(0x10DE, 0x2330, 0x030200, width=16, current_width=8))
    # GPU 1: a x16 port, and the GPU trained x8: a real downtraining.
    tree.put(f"{directory(gpu1)}/{gpu1}/config",
             pcie_config(0x10DE, 0x2330, 0x030200, width=16, current_width=8))
    # The NIC: Gen5 capable, under a Gen4 root port, running Gen4.
    tree.put(f"{directory(nic)}/config", pcie_config(*PORT, port_type=4, speed=4))
    tree.put(f"{directory(nic)}/{nic}/config",
             pcie_config(0x15B3, 0x1021, 0x020700, speed=5, current_speed=4))
    return Sysroot(tree.write_dir(tmp_path / "root"))


def test_links_are_judged_against_the_lesser_end(tmp_path: Path) -> None:
    root = _host(tmp_path)
    findings = list(PcieMrrs().evaluate(DirectoryHost(str(root.root))))
    links = {f.subject: f for f in findings if f.aspect == "link"}
    assert set(links) == {"0000:29:00.0"}
    assert links["0000:29:00.0"].status is Status.WARN
    assert links["0000:29:00.0"].expected.endswith("x16")
    assert all(f.status is Status.PASS for f in findings if f.subject == "0000:19:00.0")
    assert all(f.status is Status.PASS for f in findings if f.subject == "0000:1b:00.0")
