"""numa.placement on generated hosts: the nearest GPU of a NIC, node -1, evidence to pin by."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.lib import pci
from auditor.checks.numa_placement import NumaPlacement, nearest_gpus
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from tests.support.hostgen.classes import PCIE_BOX_GPUS, dgx_h100, pcie_box


def evaluate(root: Path) -> dict[str, Finding]:
    return {f.subject: f for f in NumaPlacement().evaluate(DirectoryHost(str(root)))}


def test_a_nic_away_from_its_gpus_and_a_gpu_without_a_node(tmp_path: Path) -> None:
    root = pcie_box().write_dir(tmp_path / "box")
    found = evaluate(root)
    nic = found["0000:c5:00.0"]
    assert nic.status is Status.WARN
    assert "nearest GPU(s) 0000:c3:00.0 0000:c4:00.0 (the same PCIe switch)" in nic.message
    assert "crosses the socket interconnect" in nic.message
    assert found["0000:e4:00.0"].status is Status.WARN and found["0000:e4:00.0"].observed == "-1"
    assert found["0000:45:00.0"].status is Status.PASS
    # Every finding lists each GPU's node and CPUs, to pin a server by.
    for finding in found.values():
        evidence = dict(finding.evidence)
        assert evidence["gpu.0000:43:00.0"] == "node 0, cpus 0-63"
        assert evidence["gpu.0000:e4:00.0"] == "node -1, cpus 0-127"
        assert len([k for k in evidence if k.startswith("gpu.")]) == len(PCIE_BOX_GPUS)
    # The BMC display is neither a GPU nor a NIC.
    assert "0000:01:00.0" not in found


def test_nearest_is_the_same_switch_then_the_same_root_complex(tmp_path: Path) -> None:
    host = DirectoryHost(str(dgx_h100().write_dir(tmp_path / "dgx")))
    devices = pci.by_address(host)
    gpus = [d for d in devices.values() if d.is_gpu]
    near, how = nearest_gpus(devices["0000:18:00.0"], gpus)
    assert (near, how) == (["0000:17:00.0"], "the same PCIe switch")
    assert {f.status for f in evaluate(Path(host.root)).values()} == {Status.PASS}


def test_memory_only_nodes_are_not_placement_targets(tmp_path: Path) -> None:
    root = pcie_box().write_dir(tmp_path / "box")
    for node in range(2):
        (root / f"sys/devices/system/node/node{node + 2}").mkdir()
        (root / f"sys/devices/system/node/node{node + 2}/cpulist").write_text("\n")
    assert "2 NUMA nodes" in evaluate(root)["0000:e4:00.0"].message
    (root / "sys/devices/system/node/node1/cpulist").write_text("\n")
    [skip] = evaluate(root).values()
    assert skip.status is Status.SKIP and "1 NUMA node with CPUs" in skip.message
