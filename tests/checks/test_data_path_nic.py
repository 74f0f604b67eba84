"""A NIC for MaxReadReq, placement and link power is a data-path NIC (RDMA-capable or high
speed), not every network function: an onboard 1 GbE port, a 10 GbE port, Wi-Fi and a
management port are not judged (issue 27, rule 11), on a DGX-class generated host."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.lib import pci
from auditor.checks.pcie_mrrs import PcieMrrs
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.hostgen.base import pcie_config
from tests.support.hostgen.nvidia import _pci
from tests.support.hostgen.serving import dgx_class
from tests.support.sysroot import Sysroot

#: address -> (vendor, device, class, driver, netdev speed in Mb/s or None)
EXTRA = {
    "0000:c1:00.0": (0x8086, 0x1533, 0x020000, "igb", 1000),          # onboard i210
    "0000:c3:00.0": (0x8086, 0x15C8, 0x020000, "ixgbe", 10000),       # X553 10 GbE
    "0000:c5:00.0": (0x8086, 0x2725, 0x028000, "iwlwifi", None),      # AX210 Wi-Fi
    "0000:c7:00.0": (0x8086, 0x1593, 0x020000, "ice", 100000),        # E810 100 GbE
    "0000:c9:00.0": (0x1D6A, 0x07B1, 0x020000, "atlantic", 25000),    # a 25 GbE by speed
}


def _host(tmp_path: Path) -> Sysroot:
    tree = dgx_class(rdma_nics=1, gpus=1, nvswitches=0)
    for index, (address, (vendor, device, klass, driver, speed)) in enumerate(EXTRA.items()):
        directory = _pci(tree, address, vendor, device, klass, driver, index=index)
        tree.put(f"{directory}/config", pcie_config(vendor, device, klass, mrrs=512))
        if speed is not None:
            tree.put(f"{directory}/net/eth{index}/speed", f"{speed}\n")
    return Sysroot(tree.write_dir(tmp_path / "root"))


def test_data_path_nics_are_told_from_the_rest(tmp_path: Path) -> None:
    root = _host(tmp_path)
    host = DirectoryHost(str(root.root))
    judged = {d.address for d in pci.devices(host) if pci.is_data_path_nic(host, d)}
    assert judged == {"0000:1b:00.0", "0000:c7:00.0", "0000:c9:00.0"}


def test_mrrs_judges_only_gpus_and_data_path_nics(tmp_path: Path) -> None:
    root = _host(tmp_path)
    findings = list(PcieMrrs().evaluate(DirectoryHost(str(root.root))))
    failed = {f.subject for f in findings if f.status is Status.FAIL}
    assert failed == {"0000:c7:00.0", "0000:c9:00.0"}  # the E810 and the 25 GbE at 512 bytes
    subjects = {f.subject for f in findings}
    assert not subjects & {"0000:c1:00.0", "0000:c3:00.0", "0000:c5:00.0"}
