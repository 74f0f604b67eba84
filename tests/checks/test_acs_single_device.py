"""A port with a single peer device below it, and none beside it below the port above, is no
ACS finding (issue 27, rule 9): that device's peer traffic crosses the ports above either
way. Two GPUs under one switch still are. On a generated EPYC host with three root ports."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.pcie_acs import PcieAcs
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.hostgen.pcie import single_peer_ports


def test_single_peer_ports_pass_and_shared_switches_fail(tmp_path: Path) -> None:
    root = single_peer_ports().write_dir(tmp_path / "root")
    status = {f.subject: f.status for f in PcieAcs().evaluate(DirectoryHost(str(root)))}
    assert status["0000:00:01.1"] is Status.PASS      # a root port above one GPU
    assert status["0000:82:00.0"] is Status.PASS      # the only GPU of its switch
    assert status["0000:80:01.1"] is Status.PASS
    assert status["0000:42:00.0"] is Status.FAIL      # two GPUs under one switch
    assert status["0000:42:01.0"] is Status.FAIL
    assert status["0000:40:01.1"] is Status.FAIL
