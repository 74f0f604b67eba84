"""A capture of a real GPU machine (one H200 in a VM) against what ran there.

``tests/fixtures/hosts/h200-lent-vm.*``: the ``audit snapshot local`` capture, the JSON
report ``audit local`` printed on the machine itself, and ``nvidia-smi -q`` / ``topo -m``
output taken in the same session. The replay must reach the verdicts the live audit
reached, and what the checks conclude from files must agree with what the driver says.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from auditor.checks.lib import nvidia, pci, pciconfig
from auditor.environment import environment
from auditor.hosts.archive import ArchiveHost
from tests.support.sysroot import FIXTURES

AUDIT = str(Path(sys.executable).with_name("audit"))
CAPTURE = FIXTURES / "h200-lent-vm.tar.gz"
LIVE = FIXTURES / "h200-lent-vm.report.json"
SMI_Q = (FIXTURES / "h200-lent-vm.nvidia-smi-q.txt").read_text()
SMI_TOPO = (FIXTURES / "h200-lent-vm.nvidia-smi-topo-m.txt").read_text()


def _smi(label: str, text: str = SMI_Q, after: str = "") -> str:
    """Return the value of the first ``label : value`` line (after the line ``after``)."""
    start = text.index(after) if after else 0
    match = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.*?)\s*$", text[start:], re.MULTILINE)
    assert match is not None, label
    return match.group(1)


@pytest.fixture(scope="module")
def host() -> ArchiveHost:
    return ArchiveHost.from_path(str(CAPTURE))


def _verdicts(report: dict[str, Any], checks: set[str]) -> list[tuple[str, str, str]]:
    return [(f["check"], f["subject"], f["status"]) for f in report["findings"]
            if f["check"] in checks]


def test_the_replay_reaches_the_verdicts_of_the_live_audit() -> None:
    """Compared on what the capture covers: the checks the live audit ran.

    The capture predates capture manifests, so a check added since is judged on it as on
    any tree (what it lacks is absent) and is left out here: adding a check never needs
    the GPU machine again to re-record this fixture.
    """
    proc = subprocess.run([AUDIT, "local", "--root", str(CAPTURE), "--format", "json"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    replay = json.loads(proc.stdout)
    live = json.loads(LIVE.read_text())
    covered = {c["check"] for c in live["checks"]}
    assert len(covered) == 20
    assert _verdicts(replay, covered) == _verdicts(live, covered)
    assert replay["facts"] == live["facts"]
    assert live["facts"]["environment"] == "VM (kvm)"


def test_the_driver_and_the_files_see_the_same_gpu(host: ArchiveHost) -> None:
    gpus = nvidia.gpus(host)
    topo_gpus = re.findall(r"^GPU\d+\s", SMI_TOPO, re.MULTILINE)
    assert len(gpus) == len(topo_gpus) == int(_smi("Attached GPUs"))
    # nvidia-smi writes the domain with 8 digits, sysfs with 4
    bus_id = _smi("Bus Id").lower()
    assert gpus[0].address == bus_id[4:]
    assert gpus[0].device == int(_smi("Device Id"), 16) >> 16
    driver = nvidia.loaded_driver(host)
    assert driver is not None and driver.version == _smi("Driver Version")


def test_the_link_read_from_config_space_is_the_one_the_driver_reports(
        host: ArchiveHost) -> None:
    address = nvidia.gpus(host)[0].address
    config = pci.read_config(host, address)
    assert config is not None
    cap = pciconfig.decode_pcie_capability(config)
    assert cap is not None
    generation = {1: "1", 2: "2", 3: "3", 4: "4", 5: "5"}
    after = "GPU Link Info"
    assert generation[cap.max_link_speed] == _smi("Max", after=after)
    assert generation[cap.link_speed] == _smi("Current", after=after)
    width = SMI_Q[SMI_Q.index("Link Width"):]
    assert f"{cap.max_link_width}x" == _smi("Max", width)
    assert f"{cap.link_width}x" == _smi("Current", width)


def test_bar1_in_sysfs_is_the_aperture_the_driver_reports(host: ArchiveHost) -> None:
    address = nvidia.gpus(host)[0].address
    lines = pci.resources(host, address)
    assert lines is not None
    # BAR0 is 64-bit (two slots): the aperture nvidia-smi calls BAR1 is resource line 2
    total = _smi("Total", after="BAR1 Memory Usage")
    assert total.endswith(" MiB")
    assert lines[2].size == int(total.removesuffix(" MiB")) << 20


def test_one_numa_node_and_a_vm_as_the_driver_sees_them(host: ArchiveHost) -> None:
    env = environment(host)
    assert env.vm and not env.in_container
    affinity = re.search(r"^GPU0\s+X\s+(\S+)\s+(\S+)", SMI_TOPO, re.MULTILINE)
    assert affinity is not None and affinity.group(2) == "0"
    node = (host.read_optional(f"/sys/bus/pci/devices/{nvidia.gpus(host)[0].address}"
                               "/numa_node") or "").strip()
    assert node in ("-1", "0")  # a guest without a virtual NUMA topology reports -1
    assert host.glob("/sys/devices/system/node/node[0-9]*") in (
        [], ["/sys/devices/system/node/node0"])
