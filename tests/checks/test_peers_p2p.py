"""Peers are the devices that can talk peer to peer (issue 27, rule 9): GeForce boards (the
driver refuses them P2P and GPUDirect RDMA) and GPUs whose peer traffic goes over an NVLink
or xGMI fabric, with no RDMA NIC beside them, make neither ACS redirect nor IOMMU translation
a P2P finding. On the generated 8-GPU PCIe box (every problem of the path planted) and a
DGX-class node."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.iommu_mode import IommuMode
from auditor.checks.lib.gpupath import peers
from auditor.checks.pcie_acs import PcieAcs
from auditor.hosts import DirectoryHost
from auditor.model import Status
from auditor.remedy import FixContext
from tests.support.hostgen.base import Tree
from tests.support.hostgen.classes import pcie_box
from tests.support.hostgen.serving import dgx_class


def _geforce(tree: Tree) -> Tree:
    for path, data in list(tree.files.items()):
        if path.startswith("/proc/driver/nvidia/gpus/") and path.endswith("/information"):
            text = data.decode()
            model = text.split("Model:", 1)[1].split("\n", 1)[0].strip()
            tree.put(path, text.replace(model, "NVIDIA GeForce RTX 5090"))
    return tree


def _statuses(check: type, root: Path) -> set[Status]:
    return {f.status for f in check().evaluate(DirectoryHost(str(root)))}


def test_the_box_with_p2p_gpus_fails_acs(tmp_path: Path) -> None:
    root = pcie_box().write_dir(tmp_path / "box")
    assert peers(DirectoryHost(str(root))).traffic
    assert Status.FAIL in _statuses(PcieAcs, root)


def test_geforce_boards_make_no_p2p_finding(tmp_path: Path) -> None:
    root = _geforce(pcie_box()).write_dir(tmp_path / "geforce")
    found = peers(DirectoryHost(str(root)))
    assert len(found.refused) == len(found.gpus) == 8
    assert not found.traffic  # no GPU that can do P2P, so no GPU-NIC pair either
    assert "GeForce" in found.describe()
    assert _statuses(PcieAcs, root) <= {Status.SKIP, Status.PASS, Status.WARN}
    assert Status.FAIL not in _statuses(IommuMode, root)


def test_nvlink_fabric_without_rdma_nics_is_no_pcie_peer_traffic(tmp_path: Path) -> None:
    root = dgx_class(rdma_nics=0).write_dir(tmp_path / "dgx")
    found = peers(DirectoryHost(str(root)))
    assert found.fabric.startswith("NVLink") and not found.traffic
    with_nics = dgx_class().write_dir(tmp_path / "dgx-ib")
    assert peers(DirectoryHost(str(with_nics))).traffic  # GPUDirect RDMA is PCIe traffic


def _geforce_at(tree: Tree, addresses: tuple[str, ...]) -> Tree:
    for address in addresses:
        path = f"/proc/driver/nvidia/gpus/{address}/information"
        text = tree.files[path].decode()
        model = text.split("Model:", 1)[1].split("\n", 1)[0].strip()
        tree.put(path, text.replace(model, "NVIDIA GeForce RTX 4090"))
    return tree


def test_geforce_boards_beside_p2p_gpus_are_no_finding_of_their_own(tmp_path: Path) -> None:
    """Two GeForce boards under root port 60:01.1 (no NIC there) beside six P2P GPUs and two
    RDMA NICs: their IOMMU groups and the ports above them are judged by nobody's peer
    traffic, and no advice names them."""
    geforce = ("0000:63:00.0", "0000:64:00.0")
    root = _geforce_at(pcie_box(), geforce).write_dir(tmp_path / "mixed")
    host = DirectoryHost(str(root))
    found = peers(host)
    assert {d.address for d in found.refused} == set(geforce) and found.traffic
    iommu = {f.subject: f for f in IommuMode().evaluate(host)}
    for address in geforce:
        assert iommu[address].status is Status.PASS
        assert "refuses peer-to-peer and GPUDirect RDMA" in iommu[address].message
    assert iommu["0000:43:00.0"].status is Status.WARN  # a P2P GPU still is
    acs = {f.subject: f for f in PcieAcs().evaluate(host)}
    # The root port and switch ports above the GeForce boards only: not judged.
    for port in ("0000:60:01.1", "0000:62:00.0", "0000:62:01.0"):
        assert port not in acs
    assert acs["0000:42:00.0"].status is Status.FAIL
    problems = [f for f in acs.values() if f.status in (Status.WARN, Status.FAIL)]
    planned = PcieAcs().remediate(host, problems, FixContext(sysroot=True))
    words = " ".join(str(r) for r in planned)
    assert "0000:60:01.1" not in words and "0000:62:00.0" not in words
    iommu_problems = [f for f in iommu.values() if f.status is Status.WARN]
    [remedy] = IommuMode().remediate(host, iommu_problems, FixContext(sysroot=True))
    assert not any(address in str(remedy) for address in geforce)


def test_gpus_without_an_rdma_nic_make_no_gpudirect_advice(tmp_path: Path) -> None:
    """GPU-NIC pairs need an RDMA NIC: on the 8-GPU box with its two NICs gone, no finding or
    advice speaks of GPUDirect RDMA, and the box's GeForce twin has no finding at all."""
    tree = pcie_box()
    for path in [p for p in tree.files if "/0000:45:00.0" in p or "/0000:c5:00.0" in p]:
        del tree.files[path]
    for path in [p for p in tree.links if "0000:45:00.0" in p or "0000:c5:00.0" in p]:
        del tree.links[path]
    root = tree.write_dir(tmp_path / "no-nic")
    host = DirectoryHost(str(root))
    found = peers(host)
    assert not found.rdma and found.traffic  # eight P2P GPUs still talk over PCIe
    findings = [*PcieAcs().evaluate(host), *IommuMode().evaluate(host)]
    assert not any("GPUDirect RDMA" in f.message for f in findings)
    assert any(f.status is Status.FAIL for f in findings)
    geforce = _geforce(tree).write_dir(tmp_path / "no-nic-geforce")
    statuses = _statuses(PcieAcs, geforce) | _statuses(IommuMode, geforce)
    assert statuses <= {Status.SKIP, Status.PASS, Status.WARN}
    messages = [f.message for f in PcieAcs().evaluate(DirectoryHost(str(geforce)))]
    assert not any("peer traffic goes" in m or "GPUDirect" in m for m in messages)
