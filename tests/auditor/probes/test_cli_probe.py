"""``audit probe`` end to end: progress on stderr, the report in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import main


def test_probe_on_this_machine_skips_gpu_probes_and_measures_wakeup(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    code = main(["probe", "--probe", "h2d,wakeup", "--wakeups", "100", "-f", "json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    statuses = {f["check"]: f["status"] for f in report["findings"]}
    assert statuses["probe.wakeup"] in ("pass", "warn", "fail")
    assert code == (1 if statuses["probe.wakeup"] == "fail" else 0)
    assert [c["check"] for c in report["checks"]] == ["probe.h2d", "probe.wakeup"]
    assert "probe h2d: running (deadline 60 s)" in err
    assert "probe wakeup: running" in err
    assert float(report["facts"]["probe_wall_s"]) > 0


def test_fake_gpu_copies_are_findings_in_json_prometheus_and_line(
        fake_cuda: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda))
    monkeypatch.setenv("FAKE_CUDA_GBPS", "40")
    assert main(["probe", "--probe", "h2d,d2h,p2p", "-f", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    h2d = next(f for f in report["findings"] if f["check"] == "probe.h2d")
    assert h2d["subject"] == "0000:41:00.0"
    assert float(h2d["evidence"]["measured.gbps"]) == pytest.approx(40)
    p2p = next(f for f in report["findings"] if f["check"] == "probe.p2p")
    assert p2p["status"] == "skip" and "one GPU" in p2p["message"]
    assert report["facts"]["probe_gpu_memory_peak_bytes"] == str(64 << 20)

    assert main(["probe", "--probe", "h2d", "-f", "prometheus"]) == 0
    families = {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}
    samples = {(s.labels["check"], s.labels["metric"]): s.value
               for s in families["host_auditor_measurement"].samples}
    assert samples[("probe.h2d", "gbps")] == pytest.approx(40)

    assert main(["probe", "--probe", "d2h", "-f", "line"]) == 0
    assert capsys.readouterr().out.startswith("OK ")


def test_a_hung_driver_is_stopped_by_the_deadline(fake_cuda: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda))
    monkeypatch.setenv("FAKE_CUDA_HANG", "init")
    monkeypatch.setenv("FAKE_CUDA_PIDFILE", str(tmp_path / "pid"))
    assert main(["probe", "--probe", "h2d", "--probe-timeout", "1", "-f", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = report["findings"]
    assert finding["status"] == "error"
    assert "did not finish: stopped after 1 s" in finding["message"]
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize("args", [["--probe", "h2d,bogus"], ["--gpus", "x"],
                                  ["--warn-below", "0.4", "--fail-below", "0.5"]])
def test_bad_options_are_usage_errors(args: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("audit: error: ") and err.count("\n") == 1


def test_a_redirected_peer_path_fails_and_points_at_acs_and_iommu(
        fake_cuda: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda))
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "2")
    monkeypatch.setenv("FAKE_CUDA_GBPS", "21")
    monkeypatch.setenv("FAKE_CUDA_PEER_ON_GBPS", "10")
    assert main(["probe", "--probe", "p2p", "-f", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    pairs = {f["subject"]: f for f in report["findings"]}
    assert set(pairs) == {"0000:41:00.0->0000:42:00.0", "0000:42:00.0->0000:41:00.0"}
    for finding in pairs.values():
        assert finding["status"] == "fail"
        assert "peer access on is slower (10.0 GB/s) than off (21.0 GB/s)" in finding["message"]
        # This machine's own pcie.acs and iommu.mode findings were gathered: named where they
        # warn or fail, else the checks to run are.
        assert "corroborates pcie.acs" in finding["message"] or (
            "--check pcie.acs --check iommu.mode" in finding["message"]
            or "corroborates iommu.mode" in finding["message"])


def test_the_acs_findings_of_the_host_are_the_ones_named(
        fake_cuda: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.cli import probe
    from auditor.model import Finding, Severity, Status

    asked: list[str] = []

    def acs(host: object, request: object) -> list[Finding]:
        asked.append(type(host).__name__)
        return [Finding(check="pcie.acs", status=Status.FAIL, severity=Severity.HIGH,
                        subject="0000:40:01.1", message="ACS redirect")]

    monkeypatch.setattr(probe, "related_findings", acs)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda))
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "2")
    monkeypatch.setenv("FAKE_CUDA_PEER_ON_GBPS", "10")
    assert main(["probe", "--probe", "p2p", "-f", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert asked == ["LocalHost"]  # gathered once, from this machine
    assert all("corroborates pcie.acs fail on 0000:40:01.1" in f["message"] for f in findings)


def test_nfd_labels_carry_the_worst_figure_of_each_probe(
        fake_cuda: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda))
    monkeypatch.setenv("FAKE_CUDA_GBPS", "40")
    assert main(["probe", "--probe", "h2d,wakeup", "--wakeups", "50", "-f", "nfd"]) in (0, 1)
    labels = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines()
                  if not line.startswith("#"))
    prefix = "host-auditor.feature.node.kubernetes.io/"
    assert labels[prefix + "probe.h2d"] == "skip"  # no link in sysfs here: not judged
    assert labels[prefix + "probe.h2d.gbps"] == "40.0"
    assert float(labels[prefix + "probe.wakeup.p99_us"]) >= 0
