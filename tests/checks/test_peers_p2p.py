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
