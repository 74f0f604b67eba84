"""A port with a single peer device below it, and none beside it below the port above, is no
ACS finding (issue 27, rule 9): that device's peer traffic crosses the ports above either
way. Two GPUs under one switch still are. On a generated EPYC host with three root ports."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.pcie_acs import PcieAcs
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.hostgen.base import Tree
from tests.support.hostgen.classes import HostFiles
from tests.support.hostgen.pcie import ACS_KERNEL_ON, Function, root_port, switch, write_topology

H100 = (0x10DE, 0x2330, 0x030200)
NVME = (0x144D, 0xA80A, 0x010802)


def _host() -> Tree:
    tree = Tree()
    release = "6.8.0-60-generic"
    HostFiles("acs-01", "amd", 64, ["0-31", "32-63"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/sda1 ro iommu=pt",
              iommu_units=["ivhd0"]).write(tree)
    alone = root_port("0000:00:01.1", acs=ACS_KERNEL_ON)
    alone.add(Function("0000:01:00.0", *H100, driver="nvidia"))
    paired = root_port("0000:40:01.1", acs=ACS_KERNEL_ON)
    for port, gpu in zip(switch(paired, "0000:41:00.0", ["0000:42:00.0", "0000:42:01.0"],
                                acs=ACS_KERNEL_ON), ("0000:43:00.0", "0000:44:00.0"), strict=True):
        port.add(Function(gpu, *H100, driver="nvidia"))
    mixed = root_port("0000:80:01.1", acs=ACS_KERNEL_ON)
    ports = switch(mixed, "0000:81:00.0", ["0000:82:00.0", "0000:82:01.0"], acs=ACS_KERNEL_ON)
    ports[0].add(Function("0000:83:00.0", *H100, driver="nvidia"))
    ports[1].add(Function("0000:84:00.0", *NVME, driver="nvme"))
    write_topology(tree, [alone, paired, mixed])
    return tree


def test_single_peer_ports_pass_and_shared_switches_fail(tmp_path: Path) -> None:
    root = _host().write_dir(tmp_path / "root")
    status = {f.subject: f.status for f in PcieAcs().evaluate(DirectoryHost(str(root)))}
    assert status["0000:00:01.1"] is Status.PASS      # a root port above one GPU
    assert status["0000:82:00.0"] is Status.PASS      # the only GPU of its switch
    assert status["0000:80:01.1"] is Status.PASS
    assert status["0000:42:00.0"] is Status.FAIL      # two GPUs under one switch
    assert status["0000:42:01.0"] is Status.FAIL
    assert status["0000:40:01.1"] is Status.FAIL
