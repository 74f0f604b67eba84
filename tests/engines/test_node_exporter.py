"""The Prometheus textfile output read by Debian's real node_exporter on a loopback port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor import prom
from auditor.cli import main
from tests.engines.conftest import NodeExporter

#: The HELP text node_exporter has seen from every version so far: a file written by an
#: older version beside a newer one must agree, or the whole scrape fails.
PUBLISHED_HELP = {
    "host_auditor_finding":
        "One series per check and subject; the status label holds the verdict.",
    "host_auditor_check_status":
        "Worst status of each check (0 pass, 1 skip, 2 warn, 3 fail, 4 error).",
    "host_auditor_findings": "Number of findings of each status.",
    "host_auditor_up": "1 if the host could be audited, 0 if not.",
    "host_auditor_last_run_timestamp_seconds": "When the audit started (Unix time).",
    "host_auditor_duration_seconds": "How long the audit took.",
    "host_auditor_tuning_info": "Fingerprint of the host's tuned state (audit fingerprint).",
    # Added with audit probe; a new metric is an addition, a published text never changes.
    "host_auditor_measurement":
        "A figure a probe measured (audit probe): the metric label names it and its unit.",
}


def audit(*args: str) -> int:
    return main(list(args))


def test_scrape_shows_the_audit_and_no_error(node_exporter: NodeExporter, failing_host: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    target = node_exporter.textfiles / "host_auditor.prom"
    assert audit("local", "--root", str(failing_host), "--format", "prometheus",
                 "-o", str(target)) == 1
    assert sorted(p.name for p in node_exporter.textfiles.iterdir()) == ["host_auditor.prom"]
    text = node_exporter.scrape()
    assert node_exporter.value(text, "node_textfile_scrape_error") == 0
    assert node_exporter.value(text, "node_textfile_mtime_seconds", file=str(target)) \
        == pytest.approx(target.stat().st_mtime, abs=1)
    assert node_exporter.value(text, "host_auditor_check_status", host="pve-gpu-01",
                               check="pcie.mrrs") == 3
    assert node_exporter.value(text, "host_auditor_up", host="pve-gpu-01") == 1
    assert node_exporter.value(text, "host_auditor_finding", host="pve-gpu-01",
                               check="pcie.mrrs", subject="0000:18:00.0", status="fail") == 1
    # The alert rule of the README: a failing check is >= 3.
    failing = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "host_auditor_check_status" and s.value >= 3]
    assert {s.labels["check"] for s in failing} >= {"pcie.mrrs", "cpu.governor"}
    capsys.readouterr()


def test_a_second_audit_replaces_the_file(node_exporter: NodeExporter, failing_host: Path,
                                          clean_host: Path) -> None:
    target = node_exporter.textfiles / "host_auditor.prom"
    audit("local", "--root", str(failing_host), "--format", "prometheus", "-o", str(target))
    audit("local", "--root", str(clean_host), "--format", "prometheus", "-o", str(target))
    text = node_exporter.scrape()
    assert node_exporter.value(text, "node_textfile_scrape_error") == 0
    assert node_exporter.value(text, "host_auditor_check_status", host="pve-gpu-01",
                               check="pcie.mrrs") == 0
    assert sorted(p.name for p in node_exporter.textfiles.iterdir()) == ["host_auditor.prom"]


def test_help_text_differing_between_files_fails_the_scrape(
    node_exporter: NodeExporter, failing_host: Path
) -> None:
    """Why the HELP text is fixed: node_exporter rejects two files that disagree.

    Since prometheus/node_exporter#2962 the collector sets ``node_textfile_scrape_error 1``;
    before it (Debian 12's 1.5.0) the gather drops the later series and logs an error.
    """
    audit("local", "--root", str(failing_host), "--format", "prometheus",
          "-o", str(node_exporter.textfiles / "host_auditor.prom"))
    (node_exporter.textfiles / "other.prom").write_text(
        "# HELP host_auditor_up Another text.\n# TYPE host_auditor_up gauge\n"
        'host_auditor_up{host="elsewhere"} 1\n')
    text = node_exporter.scrape()
    assert node_exporter.value(text, "node_textfile_scrape_error") == 1 \
        or node_exporter.value(text, "host_auditor_up", host="elsewhere") is None
    assert node_exporter.value(text, "host_auditor_up", host="pve-gpu-01") == 1


def test_help_text_is_what_was_published() -> None:
    assert prom.HELP == PUBLISHED_HELP


def test_no_sample_has_a_timestamp(failing_host: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    audit("local", "--root", str(failing_host), "--format", "prometheus")
    text = capsys.readouterr().out
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert samples and all(s.timestamp is None for s in samples)
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(families) == len(set(families))  # one HELP per metric in the one file


def test_aer_counters_reach_node_exporter_as_counters(
    node_exporter: NodeExporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A check's raw counts in its evidence (``aer.<counter>``) become counter samples."""
    report = {
        "host": "gpu-07", "target": "local", "started": "2026-12-03T03:44:22+00:00",
        "duration_s": 0.1, "facts": {},
        "checks": [{"check": "pcie.aer", "status": "warn", "duration_s": 0.01}],
        "findings": [
            {"check": "pcie.aer", "host": "gpu-07", "status": "warn", "severity": "medium",
             "subject": "0000:41:00.0", "observed": "", "expected": "", "message": "RxErr",
             "fix": "", "evidence": {"aer.RxErr": "7", "aer.TOTAL_ERR_COR": "7",
                                     "aer.Bad\"Name\n": "1", "aer.BadTLP": "n/a",
                                     "driver": "nvidia"}},
        ],
    }
    saved = tmp_path / "gpu-07.json"
    saved.write_text(json.dumps(report))
    target = node_exporter.textfiles / "host_auditor.prom"
    audit("merge", str(saved), "--format", "prometheus", "-o", str(target))
    capsys.readouterr()
    assert "# TYPE host_auditor_pcie_aer_errors_total counter" in target.read_text()
    text = node_exporter.scrape()
    assert node_exporter.value(text, "node_textfile_scrape_error") == 0
    metric = "host_auditor_pcie_aer_errors_total"
    assert node_exporter.value(text, metric, host="gpu-07", subject="0000:41:00.0",
                               kind="RxErr") == 7
    assert node_exporter.value(text, metric, kind='Bad"Name\n') == 1
    assert node_exporter.value(text, metric, kind="BadTLP") is None  # not a count

