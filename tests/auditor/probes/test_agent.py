"""The probe program: the CUDA binding against a stand-in driver, the deadline, cleanup,
skips, and the wake-up probe for real."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from auditor.probes import judge
from auditor.shipped import probe_agent as agent
from tests.auditor.probes.conftest import RunAgent


def _alive(pid: int) -> bool:
    """Return whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_copies_measure_through_the_binding_and_free_everything(run_agent: RunAgent,
                                                                 tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    document = run_agent("--probe", "copy", "--bytes", str(1 << 20),
                         env={"FAKE_CUDA_GBPS": "44", "FAKE_CUDA_LEDGER": str(ledger)})
    answer = document["answer"]
    assert answer["status"] == "ok", answer
    gpu = answer["data"]["gpus"][0]
    assert gpu["gpu"]["bdf"] == "0000:41:00.0"
    assert gpu["h2d"]["gbps"] == pytest.approx(44, rel=1e-3)
    assert gpu["d2h"]["gbps"] == pytest.approx(44, rel=1e-3)
    assert gpu["h2d"]["copies"] == agent.COPIES and len(gpu["h2d"]["trials"]) == agent.TRIALS
    assert gpu["gpu_mem_used_bytes"] == 1 << 20
    assert gpu["gpu_mem_left_bytes"] == 0
    assert ledger.read_text() == "host=0 device=0\n"
    assert not _alive(answer["child_pid"])


def test_a_failing_copy_still_frees_every_buffer(run_agent: RunAgent, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    document = run_agent("--probe", "copy", "--bytes", str(1 << 20),
                         env={"FAKE_CUDA_FAIL": "copy", "FAKE_CUDA_LEDGER": str(ledger)})
    gpu = document["answer"]["data"]["gpus"][0]
    assert "cuMemcpyHtoDAsync_v2 returned CUDA_ERROR_LAUNCH_FAILED (719)" in gpu["error"]
    assert ledger.read_text() == "host=0 device=0\n"


def test_a_probe_made_to_hang_is_stopped_and_reaped(run_agent: RunAgent,
                                                    tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    document = run_agent("--probe", "copy", "--timeout", "1.5",
                         env={"FAKE_CUDA_HANG": "init", "FAKE_CUDA_PIDFILE": str(pidfile)})
    elapsed = time.monotonic() - started
    answer = document["answer"]
    assert answer["status"] == "timeout"
    assert "1.5 s" in answer["reason"]
    assert 1.5 <= answer["wall_s"] < 10 and elapsed < 20
    hung = int(pidfile.read_text())
    assert hung == answer["child_pid"]
    assert not _alive(hung)  # killed and reaped, not left as a zombie
    finding = judge.not_run("h2d", answer)
    assert finding.status.value == "error" and "did not finish" in finding.message


def test_run_bounded_stops_a_python_probe_at_its_deadline(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    def forever(options: agent.JSONDict) -> agent.JSONDict:
        while True:
            time.sleep(1)

    monkeypatch.setitem(agent.RUNNERS, "wakeup", forever)
    answer = agent.run_bounded("wakeup", {}, 0.5)
    assert answer["status"] == "timeout"
    assert not _alive(answer["child_pid"])


def test_a_probe_that_dies_is_an_error_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(options: agent.JSONDict) -> agent.JSONDict:
        os._exit(3)

    monkeypatch.setitem(agent.RUNNERS, "wakeup", dies)
    answer = agent.run_bounded("wakeup", {}, 10)
    assert answer["status"] == "error"
    assert "without an answer" in answer["reason"]


def test_the_memory_limit_holds_a_probe_that_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    def grows(options: agent.JSONDict) -> agent.JSONDict:
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))

    monkeypatch.setitem(agent.RUNNERS, "wakeup", grows)
    answer = agent.run_bounded("wakeup", {}, 30)
    assert answer["status"] == "error"
    assert "memory" in answer["reason"]


@pytest.mark.parametrize(("code", "name"), [("100", "CUDA_ERROR_NO_DEVICE"),
                                            ("999", "CUDA_ERROR_UNKNOWN")])
def test_a_driver_without_a_device_skips_with_the_reason(run_agent: RunAgent, code: str,
                                                         name: str) -> None:
    # A VM without the GPU passed through has the library and no device.
    answer = run_agent("--probe", "copy", env={"FAKE_CUDA_INIT": code})["answer"]
    assert answer["status"] == "skip"
    assert name in answer["reason"] and "no usable GPU" in answer["reason"]


def test_p2p_with_one_gpu_skips_and_measures_pairs_with_two(run_agent: RunAgent,
                                                            tmp_path: Path) -> None:
    answer = run_agent("--probe", "p2p")["answer"]
    assert answer == {**answer, "status": "skip",
                      "reason": "one GPU: peer-to-peer needs two or more"}
    ledger = tmp_path / "ledger"
    answer = run_agent("--probe", "p2p", "--bytes", str(1 << 20),
                       env={"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_LEDGER": str(ledger)})["answer"]
    assert answer["status"] == "ok", answer
    pairs = answer["data"]["pairs"]
    assert [(p["src_index"], p["dst_index"]) for p in pairs] == [(0, 1), (1, 0)]
    assert all(p["on"]["gbps"] > 0 and p["off"]["gbps"] > 0 for p in pairs)
    assert ledger.read_text() == "host=0 device=0\n"


def test_without_any_driver_every_gpu_probe_skips(tmp_path: Path) -> None:
    # This machine has no GPU driver (the fake is not on the library path here).
    if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
        pytest.skip("this machine has a GPU driver")
    for probe in ("copy", "p2p"):
        answer = agent.run_bounded(probe, {}, 30)
        assert answer["status"] == "skip"
        assert answer["reason"].startswith("no GPU driver: libcuda.so.1 not found")


def test_numa_on_one_node_skips() -> None:
    if len(agent.numa_nodes()) > 1:
        pytest.skip("this machine has several NUMA nodes")
    answer = agent.run_bounded("numa", {}, 30)
    assert answer == {**answer, "status": "skip", "reason": "one NUMA node: nothing is remote"}


def test_wakeup_really_runs_here() -> None:
    answer = agent.run_bounded("wakeup", {"wakeups": 200}, 30)
    assert answer["status"] == "ok", answer
    data = answer["data"]
    assert data["groups"], data
    group = data["groups"][0]
    figures = group["as_is"]
    assert figures["wakes"] == 200
    assert 0 <= figures["p50_us"] <= figures["p99_us"] <= figures["max_us"]
    assert group["policy"] in ("fifo", "other")
    assert isinstance(data["hypervisor"], bool)
    findings = judge.judge_wakeup(data)
    assert findings and all(f.check == "probe.wakeup" for f in findings)


def test_link_is_read_from_sysfs_during_the_copy(run_agent: RunAgent, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    port = sysfs / "devices" / "pci0000:40" / "0000:40:01.1"
    gpu = port / "0000:41:00.0"
    gpu.mkdir(parents=True)
    for directory, values in ((port, {"max_link_speed": "32.0 GT/s PCIe",
                                      "max_link_width": "16"}),
                              (gpu, {"max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16",
                                     "current_link_speed": "32.0 GT/s PCIe",
                                     "current_link_width": "16", "numa_node": "-1"})):
        for name, value in values.items():
            (directory / name).write_text(value + "\n")
    devices = sysfs / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / "0000:41:00.0").symlink_to(gpu)
    (devices / "0000:40:01.1").symlink_to(port)
    document = run_agent("--probe", "copy", "--bytes", str(1 << 20), "--sys", str(sysfs),
                         env={"FAKE_CUDA_GBPS": "55.3"})
    data = document["answer"]["data"]
    item = data["gpus"][0]
    assert item["link"]["port"] == "0000:40:01.1"
    assert item["h2d"]["link_during"] == {"speed": "32.0 GT/s PCIe", "width": "16"}
    h2d, d2h = judge.judge_copy(data, ("h2d", "d2h"))
    assert h2d.status.value == "pass" and d2h.status.value == "pass"
    assert "88% of the Gen5 x16 payload limit (63.0 GB/s)" in h2d.message
    assert dict(h2d.evidence)["link_during"] == "Gen5 x16 (32 GT/s x16)"


def test_a_busy_gpu_is_refused_unless_forced(run_agent: RunAgent, fake_nvml: Path,
                                             tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    busy = {"FAKE_NVML_PROCS": "2", "FAKE_CUDA_LEDGER": str(ledger)}
    item = run_agent("--probe", "copy", "--bytes", str(1 << 20), env=busy,
                     libraries=[fake_nvml])["answer"]["data"]["gpus"][0]
    assert item["refused"] == "2 compute process(es) running"
    assert "h2d" not in item and not ledger.exists()  # nothing was allocated
    (finding,) = judge.judge_copy({"gpus": [item]}, ("h2d",))
    assert finding.status.value == "skip" and "--force" in finding.message
    item = run_agent("--probe", "copy", "--bytes", str(1 << 20), "--force", env=busy,
                     libraries=[fake_nvml])["answer"]["data"]["gpus"][0]
    assert item["h2d"]["gbps"] > 0 and item["busy"]["processes"] == 2
    assert ledger.read_text() == "host=0 device=0\n"
    item = run_agent("--probe", "copy", "--bytes", str(1 << 20), env={"FAKE_NVML_UTIL": "37"},
                     libraries=[fake_nvml])["answer"]["data"]["gpus"][0]
    assert item["refused"] == "37% utilisation"


def test_nvml_gives_the_link_where_sysfs_has_none(run_agent: RunAgent, fake_nvml: Path) -> None:
    data = run_agent("--probe", "copy", "--bytes", str(1 << 20), "--sys", "/nonexistent",
                     env={"FAKE_CUDA_GBPS": "27.0", "FAKE_NVML_GEN": "4"},
                     libraries=[fake_nvml])["answer"]["data"]
    assert data["gpus"][0]["h2d"]["link_during"]["nvml"] == {"current_gen": 4,
                                                             "current_width": 16}
    (h2d,) = judge.judge_copy(data, ("h2d",))
    assert h2d.status.value == "pass"
    assert "86% of the Gen4 x16 payload limit (31.5 GB/s)" in h2d.message


def test_amd_gpus_are_measured_through_hip(fake_hip: Path, tmp_path: Path) -> None:
    # No libcuda.so.1 on the path: the HIP runtime is the one found.
    import ctypes.util
    import json
    import subprocess
    import sys

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver, which the probe would take first")
    ledger = tmp_path / "ledger"
    environment = {**os.environ, "LD_LIBRARY_PATH": str(fake_hip), "FAKE_HIP_GBPS": "48",
                   "FAKE_CUDA_LEDGER": str(ledger)}
    done = subprocess.run([sys.executable, "-I", agent.__file__, "--probe", "copy", "--bytes",
                           str(1 << 20)], env=environment, capture_output=True, text=True,
                          timeout=60, check=True)
    line = [x for x in done.stdout.splitlines() if x.startswith(agent.MARK)][-1]
    data = json.loads(line[len(agent.MARK):])["answer"]["data"]
    assert data["driver"] == "hip"
    item = data["gpus"][0]
    assert item["gpu"] == {"index": 0, "name": "Fake MI300X", "bdf": "0000:05:00.0",
                           "memory_bytes": 1 << 30}
    assert item["h2d"]["gbps"] == pytest.approx(48, rel=1e-3)
    assert item["d2h"]["gbps"] == pytest.approx(48, rel=1e-3)
    assert item["busy"] == {"known": False, "reason": "no busy check for HIP GPUs"}
    assert ledger.read_text() == "host=0 device=0\n"
