"""Verdicts on what the probe program measured."""

from __future__ import annotations

from typing import Any

import pytest

from auditor.model import Finding, Severity, Status
from auditor.probes import judge

GEN5 = {"max_speed": "32.0 GT/s PCIe", "max_width": "16", "current_speed": "2.5 GT/s PCIe",
        "current_width": "16", "port": "0000:40:01.1", "port_max_speed": "32.0 GT/s PCIe",
        "port_max_width": "16"}


def copy_answer(*gbps: float, link: dict[str, Any] | None = None,
                during: str = "32.0 GT/s PCIe", name: str = "NVIDIA H200") -> dict[str, Any]:
    return {"gpus": [
        {"gpu": {"index": i, "name": name, "bdf": f"0000:{0x41 + i:02x}:00.0"},
         "link": link or GEN5, "gpu_mem_used_bytes": 1 << 27, "gpu_mem_left_bytes": 0,
         **{d: {"gbps": g, "bytes": 64 << 20, "copies": 10,
                "link_during": {"speed": during, "width": "16"}} for d in ("h2d", "d2h")}}
        for i, g in enumerate(gbps)]}


def test_a_healthy_gen5_gpu_passes_and_idle_downtrain_is_no_finding() -> None:
    # Idle at 2.5 GT/s (current_speed), Gen5 during the copy: the idle state is evidence.
    h2d, d2h = judge.judge_copy(copy_answer(55.3), ("h2d", "d2h"))
    assert (h2d.check, h2d.status, h2d.subject) == ("probe.h2d", Status.PASS, "0000:41:00.0")
    assert d2h.check == "probe.d2h"
    evidence = dict(h2d.evidence)
    assert evidence["link_idle"] == "Gen1 x16 (2.5 GT/s x16)"
    assert evidence["link_during"] == "Gen5 x16 (32 GT/s x16)"
    assert judge.measurements(h2d) == pytest.approx(
        {"gbps": 55.3, "limit_gbps": 63.01538, "fraction": 0.87756, "gpu_mem_used_bytes": 1 << 27,
         "gpu_mem_left_bytes": 0}, rel=1e-5)
    assert h2d.observed == "55.3 GB/s (88%)"
    assert h2d.expected == ">= 50.4 GB/s (80% of 63.0)"


@pytest.mark.parametrize(("gbps", "status"), [(50.5, Status.PASS), (50.3, Status.WARN),
                                              (31.6, Status.WARN), (31.4, Status.FAIL)])
def test_thresholds_against_gen5_x16(gbps: float, status: Status) -> None:
    (h2d,) = judge.judge_copy(copy_answer(gbps), ("h2d",))
    assert h2d.status is status


def test_a_gpu_trained_at_gen4_under_load_fails_and_says_so() -> None:
    (h2d,) = judge.judge_copy(copy_answer(27.0, during="16.0 GT/s PCIe"), ("h2d",))
    assert h2d.status is Status.FAIL
    assert "link during the copy Gen4 x16 (trained below Gen5 x16 under load)" in h2d.message


def test_a_port_that_allows_less_sets_the_limit() -> None:
    link = {**GEN5, "port_max_speed": "16.0 GT/s PCIe"}
    (h2d,) = judge.judge_copy(copy_answer(27.0, link=link, during="16.0 GT/s PCIe"), ("h2d",))
    assert h2d.status is Status.PASS
    assert "Gen4 x16 payload limit (31.5 GB/s)" in h2d.message


def test_a_virtual_port_that_advertises_less_than_measured_is_not_the_limit() -> None:
    link = {**GEN5, "port_max_speed": "2.5 GT/s PCIe", "port_max_width": "1"}
    (h2d,) = judge.judge_copy(copy_answer(55.0, link=link), ("h2d",))
    assert h2d.status is Status.PASS
    assert "the port above advertises Gen1 x1" in h2d.message


def test_without_a_link_in_sysfs_the_figure_is_kept_and_not_judged() -> None:
    (h2d,) = judge.judge_copy(copy_answer(55.0, link={"max_speed": None}), ("h2d",))
    assert h2d.status is Status.SKIP
    assert judge.measurements(h2d)["gbps"] == 55.0


def test_a_gpu_well_below_its_siblings_warns() -> None:
    # 51 GB/s is 81% of Gen5 x16 (a pass alone) but 12% below its sibling.
    findings = judge.judge_copy(copy_answer(58.0, 57.0, 51.0), ("h2d",))
    assert [f.status for f in findings] == [Status.PASS, Status.PASS, Status.WARN]
    assert "12% below the best NVIDIA H200 of this host (58.0 GB/s)" in findings[2].message


def test_a_busy_gpu_is_skipped_with_the_reason() -> None:
    data = {"gpus": [{"gpu": {"bdf": "0000:41:00.0"}, "refused": "2 compute process(es) "
                      "running", "link": GEN5}]}
    (h2d,) = judge.judge_copy(data, ("h2d",))
    assert h2d.status is Status.SKIP and "busy (2 compute process(es) running)" in h2d.message
    assert "--force" in h2d.message


@pytest.mark.parametrize("data", [{}, {"gpus": "x"}, {"gpus": [{"gpu": {}, "h2d": {
    "gbps": "fast"}}]}, {"gpus": [{"h2d": {"gbps": float("nan")}}]},
    {"gpus": [{"h2d": {"gbps": 1e12}}]}])
def test_a_malformed_answer_is_an_error_never_a_pass(data: dict[str, Any]) -> None:
    findings = judge.judge_copy(data, ("h2d",))
    assert findings and all(f.status is Status.ERROR for f in findings)


def _pair(on: float, off: float, latency: float) -> dict[str, Any]:
    return {"src": "0000:41:00.0", "dst": "0000:42:00.0", "can_access": True,
            "on": {"gbps": on, "latency_us": latency}, "off": {"gbps": off, "latency_us": 14}}


P2P_LINKS = {"0000:41:00.0": GEN5, "0000:42:00.0": GEN5}


def test_a_healthy_peer_path_passes() -> None:
    (finding,) = judge.judge_p2p({"pairs": [_pair(54.0, 21.0, 1.6)], "links": P2P_LINKS})
    assert finding.status is Status.PASS
    assert finding.subject == "0000:41:00.0->0000:42:00.0"
    assert judge.measurements(finding)["on_gbps"] == 54.0


def test_the_redirect_signature_fails_and_names_the_acs_findings() -> None:
    acs = Finding(check="pcie.acs", status=Status.FAIL, severity=Severity.HIGH,
                  subject="0000:40:01.1", message="ACS redirect on")
    unrelated = Finding(check="pcie.acs", status=Status.PASS, severity=Severity.HIGH,
                        subject="0000:80:01.1", message="")
    (finding,) = judge.judge_p2p({"pairs": [_pair(11.0, 21.0, 12.0)], "links": P2P_LINKS},
                                 related=[acs, unrelated])
    assert finding.status is Status.FAIL
    assert "peer access on is slower (11.0 GB/s) than off (21.0 GB/s)" in finding.message
    assert "12.0 us" in finding.message
    assert "corroborates pcie.acs fail on 0000:40:01.1" in finding.message
    assert "80:01.1" not in finding.message


def test_without_acs_findings_the_checks_to_run_are_named() -> None:
    (finding,) = judge.judge_p2p({"pairs": [_pair(11.0, 21.0, 0.9)], "links": P2P_LINKS})
    assert finding.status is Status.FAIL
    assert "--check pcie.acs --check iommu.mode" in finding.message


@pytest.mark.parametrize(("latency", "status"), [(4.9, Status.PASS), (7.0, Status.WARN),
                                                 (10.5, Status.FAIL)])
def test_peer_latency(latency: float, status: Status) -> None:
    (finding,) = judge.judge_p2p({"pairs": [_pair(54.0, 21.0, latency)], "links": P2P_LINKS})
    assert finding.status is status


def test_nvlink_speeds_are_not_held_to_the_pcie_limit() -> None:
    (finding,) = judge.judge_p2p({"pairs": [_pair(370.0, 37.0, 1.0)], "links": P2P_LINKS})
    assert finding.status is Status.PASS


def test_gpus_that_cannot_reach_each_other_warn() -> None:
    pair = {"src": "a", "dst": "b", "can_access": False, "off": {"gbps": 20.0}}
    (finding,) = judge.judge_p2p({"pairs": [pair]})
    assert finding.status is Status.WARN and "cuDeviceCanAccessPeer = 0" in finding.message


def _wakeup(p99: float, *, guest: bool = False, exit_us: int = 2) -> dict[str, Any]:
    return {"hypervisor": guest, "timer_slack_1ns": True, "cpuidle_driver": "intel_idle",
            "groups": [{"node": 0, "cpu": 1, "policy": "fifo",
                        "as_is": {"p50_us": 4.0, "p99_us": p99, "max_us": 120.0},
                        "cstate": {"state": "C6", "latency_us": exit_us}}]}


@pytest.mark.parametrize(("p99", "exit_us", "status"), [
    (20.0, 2, Status.PASS), (30.0, 2, Status.WARN), (30.0, 133, Status.PASS),
    (101.0, 2, Status.FAIL), (101.0, 170, Status.FAIL)])
def test_wakeup_thresholds(p99: float, exit_us: int, status: Status) -> None:
    (finding,) = judge.judge_wakeup(_wakeup(p99, exit_us=exit_us))
    assert finding.status is status
    assert finding.subject == "node0 cpu1"


def test_a_vm_guest_wakeup_is_reported_not_judged() -> None:
    (finding,) = judge.judge_wakeup(_wakeup(400.0, guest=True))
    assert finding.status is Status.PASS and "not judged: a VM guest" in finding.message
    assert judge.measurements(finding)["p99_us"] == 400.0


def test_numa_remote_faster_than_local_warns() -> None:
    data = {"results": [{"node": 0, "remote_node": 1, "gpus": ["0000:41:00.0"],
                         "local_gbps": 9.0, "remote_gbps": 12.0}]}
    (finding,) = judge.judge_numa(data)
    assert finding.status is Status.WARN and "not where they sit" in finding.message
    data["results"][0].update(local_gbps=12.0, remote_gbps=8.0)
    (finding,) = judge.judge_numa(data)
    assert finding.status is Status.PASS
    assert judge.measurements(finding)["remote_ratio"] == pytest.approx(8 / 12)


def test_without_pci_sysfs_the_link_comes_from_nvml() -> None:
    # A sandbox that shows no PCI sysfs: NVML's generation and width stand in.
    link = {"max_speed": None, "nvml": {"max_gen": 5, "max_width": 16, "current_gen": 1,
                                        "current_width": 16}}
    data = copy_answer(55.4, link=link)
    data["gpus"][0]["h2d"]["link_during"] = {"speed": None, "width": None,
                                             "nvml": {"current_gen": 5, "current_width": 16}}
    (h2d,) = judge.judge_copy(data, ("h2d",))
    assert h2d.status is Status.PASS
    assert "88% of the Gen5 x16 payload limit (63.0 GB/s); link during the copy Gen5 x16" in \
        h2d.message
    assert dict(h2d.evidence)["link_idle"] == "Gen1 x16 (2.5 GT/s x16)"
