"""pcie.aer on generated hosts: what each counter points to, rates over uptime, the raw
counts a metrics exporter reads, and AER owned by firmware."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.pcie_aer import PcieAer
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from tests.support.hostgen.classes import PcieBoxSpec, pcie_box

GPU = "0000:44:00.0"


def evaluate(root: Path, **options: object) -> dict[str, Finding]:
    check = PcieAer.configured(**options) if options else PcieAer()
    return {f.subject: f for f in check.evaluate(DirectoryHost(str(root)))}


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return pcie_box().write_dir(tmp_path / "box")


def test_each_counter_is_named_with_what_it_points_to(box: Path) -> None:
    found = evaluate(box)
    port = found["0000:62:01.0"]
    assert port.status is Status.FAIL
    assert "SDES 1 (Surprise Down" in port.message and "see pcie.aspm" in port.message
    assert dict(port.evidence)["devices_below"] == "0000:64:00.0"
    assert "CmpltTO 2 (Completion Timeout" in found["0000:64:00.0"].message
    gpu = found[GPU]
    assert gpu.status is Status.WARN
    assert "253 correctable" in gpu.message and "signal integrity" in gpu.message
    assert found["0000:43:00.0"].status is Status.PASS


def test_raw_counts_are_in_the_evidence_under_stable_keys(box: Path) -> None:
    evidence = dict(evaluate(box)[GPU].evidence)
    assert evidence["aer.correctable.BadTLP"] == "250"
    assert evidence["aer.correctable.RxErr"] == "3"
    assert evidence["aer.correctable.total"] == "253"
    assert evidence["aer.fatal.SDES"] == "0" and evidence["aer.nonfatal.total"] == "0"
    root = dict(evaluate(box)["0000:60:01.1"].evidence)
    assert root["aer.rootport.fatal"] == "1" and root["aer.rootport.nonfatal"] == "2"
    assert evaluate(box)["0000:60:01.1"].status is Status.PASS  # its own counters are 0


def test_rate_over_uptime_with_a_floor(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(aer=False)).write_dir(tmp_path / "box")
    path = root / f"sys/bus/pci/devices/{GPU}/aer_dev_correctable"
    path.write_text(path.read_text().replace("RxErr 0", "RxErr 30").replace(
        "TOTAL_ERR_COR 0", "TOTAL_ERR_COR 30"))
    (root / "proc/uptime").write_text("3600.00 1.00\n")  # 30 in an hour, counted over four
    assert evaluate(root)[GPU].status is Status.PASS
    assert evaluate(root, rate_floor_hours=1.0)[GPU].status is Status.WARN
    (root / "proc/uptime").write_text("1.00 1.00\n")
    assert evaluate(root, correctable_warn=25)[GPU].status is Status.WARN


def test_no_statistics_and_guests_skip(tmp_path: Path) -> None:
    root = pcie_box(PcieBoxSpec(aer_files=False)).write_dir(tmp_path / "ffs")
    [finding] = evaluate(root).values()
    assert finding.status is Status.SKIP and "keeps no AER statistics" in finding.message
    (root / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                                       "flags\t\t: fpu hypervisor\n")
    [guest] = evaluate(root).values()
    assert guest.status is Status.SKIP and "hypervisor host handles AER" in guest.message


def test_inside_a_container_the_hosts_counters_are_judged(box: Path) -> None:
    (box / "run/systemd").mkdir(parents=True)
    (box / "run/systemd/container").write_text("lxc\n")
    port = evaluate(box)["0000:62:01.0"]
    assert port.status is Status.FAIL
    assert dict(port.evidence)["environment"] == "container (lxc): the host's counters"


def test_the_prometheus_output_exports_each_counter_once(box: Path) -> None:
    from auditor.policy import load_policy
    from auditor.prom import render_prometheus
    from auditor.runner import audit

    report = audit(DirectoryHost(str(box)), [PcieAer], load_policy([PcieAer]))
    lines = [line for line in render_prometheus([report]).splitlines()
             if line.startswith("host_auditor_pcie_aer_errors_total{")]
    port = [line for line in lines if 'subject="0000:62:01.0"' in line]
    # SDES is counted in both the fatal and the non-fatal file: two series, not one.
    assert any('kind="fatal.SDES"} 1' in line for line in port)
    assert any('kind="nonfatal.SDES"} 0' in line for line in port)
    assert any('kind="fatal.total"} 1' in line for line in port)
    assert len(lines) == len({line.rpartition(" ")[0] for line in lines})
