"""Fleet commands: merge of per-host results, golden diff, fingerprints, Prometheus output.

The per-host results are real audits of the real captures, with problems planted
in copies and host names changed, written by ``audit local --format json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import main
from auditor.fleet import golden_diff
from auditor.model import Report, fingerprint
from auditor.prom import escape_label
from auditor.results import load_results
from tests.support.sysroot import Sysroot

Results = Callable[..., Path]


def plant_numa_failure(root: Sysroot) -> None:
    root.write("/sys/devices/system/node/node1/cpulist", "8-15\n")
    root.write("/proc/sys/kernel/numa_balancing", "1\n")


@pytest.fixture
def results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Results:
    """Return a factory: audit a sysroot under a host name, write its JSON result file."""
    out_dir = tmp_path / "results"
    out_dir.mkdir()

    def factory(root: Sysroot, host: str, *args: str) -> Path:
        root.write("/etc/hostname", host + "\n")
        path = out_dir / f"{len(list(out_dir.iterdir())):03d}.json"
        main(["local", "--root", str(root.root), "--format", "json", "-o", str(path), *args])
        capsys.readouterr()
        return path

    return factory


def merge(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["merge", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_merge_with_a_truncated_file_names_it_and_merges_the_rest(
    h200: Sysroot, virtio: Sysroot, results: Results, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = results(h200, "gpu-01")
    results(virtio, "cpu-01")
    broken = tmp_path / "results" / "gpu-02.json"
    broken.write_bytes(first.read_bytes()[: len(first.read_bytes()) // 2])
    code, out, err = merge(capsys, "--format", "json", str(tmp_path / "results"))
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith("audit: error: ") and str(broken) in line
    assert "truncated JSON" in line
    fleet = json.loads(out)
    assert sorted(h["host"] for h in fleet["hosts"]) == ["cpu-01", "gpu-01"]
    reason = line.removeprefix(f"audit: error: {broken}: ").removesuffix(
        "; left out of the merge")
    assert fleet["unreadable"] == [{"path": str(broken), "reason": reason}]
    assert fleet["summary"]["hosts"] == 2


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not valid JSON"),
        (b"[1, 2]", "not an audit report"),
        (b'{"findings": []}', "no host name"),
        (b'{"host": "x", "findings": [{"check": "a", "status": "bogus"}]}', "not an audit report"),
        (b"\xff\xfe{", "not UTF-8"),
    ],
)
def test_unusable_inputs_are_left_out_with_a_reason(
    h200: Sysroot, results: Results, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    content: bytes, reason: str,
) -> None:
    good = results(h200, "gpu-01")
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    code, out, err = merge(capsys, str(good), str(bad), str(tmp_path / "missing.json"))
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 2
    assert str(bad) in lines[0] and reason in lines[0]
    assert "missing.json: cannot read" in lines[1]
    assert "host-auditor fleet: 1 hosts, 2 unreadable inputs" in out


def test_merge_exit_codes_follow_audit_when_every_input_reads(
    h200: Sysroot, make_sysroot: Callable[[str], Sysroot], results: Results,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clean = results(h200, "gpu-01")
    bad_host = make_sysroot("h200")
    plant_numa_failure(bad_host)
    failing = results(bad_host, "gpu-02")
    assert merge(capsys, str(clean))[0] == 0
    code, out, _ = merge(capsys, str(clean), str(failing))
    assert code == 1
    assert re.search(r"FAIL\s+numa\.balancing kernel: 1 host: gpu-02", out)
    out_file = clean.parent.parent / "fleet.json"  # -o onto a device is refused (hostile suite)
    assert merge(capsys, "--format", "json", "-o", str(out_file), str(clean))[0] == 0
    assert json.loads(out_file.read_text())["summary"]["hosts"] == 1
    assert merge(capsys)[0] == 2  # no inputs at all is a usage error


def test_no_readable_input_is_a_usage_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text("{")
    code, out, err = merge(capsys, str(tmp_path / "a.json"))
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == "audit: error: no readable results to merge"


def test_golden_diff_names_hosts_and_what_differs(
    make_sysroot: Callable[[str], Sysroot], results: Results,
    capsys: pytest.CaptureFixture[str],
) -> None:
    golden = make_sysroot("h200")
    twin = make_sysroot("h200")
    drifted = make_sysroot("h200")
    plant_numa_failure(drifted)
    files = [str(results(golden, "gpu-01")), str(results(twin, "gpu-02")),
             str(results(drifted, "gpu-03"))]
    code, out, _ = merge(capsys, "--format", "json", "--golden", "gpu-01", *files)
    assert code == 1
    diff = json.loads(out)["golden"]
    assert diff["host"] == "gpu-01"
    assert diff["same"] == ["gpu-02"]
    assert list(diff["differ"]) == ["gpu-03"]
    [numa] = [d for d in diff["differ"]["gpu-03"] if d["check"] == "numa.balancing"]
    assert numa == {"check": "numa.balancing", "subject": "kernel", "aspect": "",
                    "golden": {"status": "pass", "observed": "0"},
                    "host": {"status": "fail", "observed": "1"}}
    _, text, _ = merge(capsys, "--golden", "gpu-01", *files)
    assert "Golden host gpu-01: 1 of 2 other hosts differ" in text
    assert "numa.balancing kernel: status pass -> fail, observed '0' -> '1'" in text
    assert merge(capsys, "--golden", "gpu-99", *files)[0] == 2


def test_golden_diff_reports_subjects_on_one_side_only() -> None:
    def report(host: str, findings: list[dict[str, Any]]) -> Report:
        return Report.from_dict({"host": host, "findings": findings})

    dev = {"check": "pcie.mrrs", "status": "pass", "subject": "0000:41:00.0",
           "observed": "4096"}
    other = {**dev, "subject": "0000:c1:00.0"}
    diffs = golden_diff([report("a", [dev]), report("b", [other])], "a")
    lines = [d.describe() for d in diffs["b"]]
    assert lines == ["pcie.mrrs 0000:41:00.0: missing here (golden: pass, '4096')",
                     "pcie.mrrs 0000:c1:00.0: only here (pass, '4096')"]


def test_duplicate_host_keeps_the_newest_report(
    h200: Sysroot, results: Results, tmp_path: Path,
) -> None:
    older = results(h200, "gpu-01")
    plant_numa_failure(h200)
    newer = results(h200, "gpu-01")
    data = json.loads(older.read_text())
    data["started"] = "2000-01-01T00:00:00+00:00"
    older.write_text(json.dumps(data))
    loaded = load_results([str(newer), str(older)])
    [report] = loaded.reports
    assert loaded.sources["gpu-01"] == str(newer)
    assert [f.status.value for f in report.findings if f.check == "numa.balancing"] == ["fail"]
    assert loaded.notes == [f"gpu-01: reported by {newer} and {older}; keeping {newer} (newer)"]


def test_html_and_text_formats_render_the_merge(
    h200: Sysroot, virtio: Sysroot, results: Results, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = [str(results(h200, "gpu-<b>01</b>")), str(results(virtio, "cpu-01"))]
    code, html, _ = merge(capsys, "--format", "html", *files)
    assert code == 0
    assert "gpu-&lt;b&gt;01&lt;/b&gt;" in html and "<b>01</b>" not in html
    assert html.count('class="host-row') == 2
    assert merge(capsys, "--format", "yaml", *files)[0] == 2


# -- fingerprints -------------------------------------------------------------------------


def fingerprint_of(path: Path) -> str:
    [report] = load_results([str(path)]).reports
    return fingerprint(report)


def test_fingerprint_ignores_host_name_and_time_but_not_tuning(
    make_sysroot: Callable[[str], Sysroot], results: Results, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    one, two, changed = make_sysroot("h200"), make_sysroot("h200"), make_sysroot("h200")
    plant_numa_failure(changed)
    first = results(one, "gpu-01")
    second = results(two, "gpu-02")
    assert json.loads(first.read_text())["host"] != json.loads(second.read_text())["host"]
    assert fingerprint_of(first) == fingerprint_of(second)
    assert re.fullmatch(r"[0-9a-f]{12}", fingerprint_of(first))
    assert fingerprint_of(results(changed, "gpu-03")) != fingerprint_of(first)
    # a waiver changes the verdict, not the host: the fingerprint stays
    policy = tmp_path / "waive.toml"
    policy.write_text('[[waivers]]\ncheck = "numa.balancing"\nreason = "study"\n')
    waived = results(changed, "gpu-03", "--policy", str(policy))
    assert [(f["status"], f["waived"]) for f in json.loads(waived.read_text())["findings"]
            if f["check"] == "numa.balancing"] == [("fail", True)]
    assert fingerprint_of(waived) == fingerprint_of(results(changed, "gpu-04"))


def test_fingerprint_command_text_json_and_saved_report(
    h200: Sysroot, results: Results, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fingerprint", "--root", str(h200.root)]) == 0
    stamp = capsys.readouterr().out
    assert re.fullmatch(r"[0-9a-f]{12}\n", stamp)
    assert main(["fingerprint", "--root", str(h200.root), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["fingerprint"] == stamp.strip()
    assert ["numa.balancing", "kernel", "", "pass", "0"] in document["inputs"]["findings"]
    assert document["inputs"]["version"] == 2
    assert "started" not in json.dumps(document["inputs"])
    saved = results(h200, "gpu-01")
    assert main(["fingerprint", "--report", str(saved)]) == 0
    assert capsys.readouterr().out == stamp
    assert main(["fingerprint", "somewhere"]) == 2


def test_fingerprint_of_the_live_host_is_stable(capsys: pytest.CaptureFixture[str]) -> None:
    stamps = set()
    for _ in range(2):
        assert main(["fingerprint", "local"]) == 0
        stamps.add(capsys.readouterr().out)
    assert len(stamps) == 1


# -- prometheus -----------------------------------------------------------------------------


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge"
        assert family.documentation
        families[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return families


def test_prometheus_output_parses_and_has_a_series_per_finding(
    h200: Sysroot, capsys: pytest.CaptureFixture[str],
) -> None:
    plant_numa_failure(h200)
    h200.write("/etc/hostname", "gpu-07\n")
    code = main(["local", "--root", str(h200.root), "--format", "prometheus"])
    assert code == 1
    text = capsys.readouterr().out
    assert "# TYPE host_auditor_finding gauge" in text
    families = parse(text)
    findings = families["host_auditor_finding"]
    assert ({"host": "gpu-07", "check": "numa.balancing", "subject": "kernel", "aspect": "",
             "status": "fail", "severity": "high", "waived": "false"}, 1.0) in findings
    assert ({"host": "gpu-07", "check": "numa.balancing"}, 3.0) in families[
        "host_auditor_check_status"]
    assert ({"host": "gpu-07", "status": "fail"}, 1.0) in families["host_auditor_findings"]
    assert families["host_auditor_up"] == [({"host": "gpu-07"}, 1.0)]
    [(labels, _)] = families["host_auditor_tuning_info"]
    assert re.fullmatch(r"[0-9a-f]{12}", labels["fingerprint"])


def test_prometheus_escapes_untrusted_label_values(
    h200: Sysroot, capsys: pytest.CaptureFixture[str],
) -> None:
    nasty = 'gpu"07\\x\nup{job="evil"} 1'
    h200.write("/etc/hostname", nasty + "\n")
    main(["local", "--root", str(h200.root), "--format", "prometheus"])
    text = capsys.readouterr().out
    families = parse(text)
    # A host name is one printable token of /etc/hostname: quote and backslash stay, escaped.
    assert families["host_auditor_up"] == [({"host": 'gpu"07\\x'}, 1.0)]
    assert not any(line.startswith("up{") for line in text.splitlines())
    assert escape_label('a\\b"c\nd\udcff') == 'a\\\\b\\"c\\nd\ufffd'


def test_merge_renders_every_host_as_prometheus(
    h200: Sysroot, virtio: Sysroot, results: Results, capsys: pytest.CaptureFixture[str],
) -> None:
    files = [str(results(h200, "gpu-01")), str(results(virtio, "cpu-01"))]
    code, out, _ = merge(capsys, "--format", "prometheus", *files)
    assert code == 0
    hosts = {labels["host"] for labels, _ in parse(out)["host_auditor_up"]}
    assert hosts == {"gpu-01", "cpu-01"}


def test_unreachable_host_is_listed_not_diffed_nor_fingerprinted(
    h200: Sysroot, results: Results, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    good = results(h200, "gpu-01")
    down = tmp_path / "gpu-09.json"
    down.write_text(json.dumps(Report(
        host="gpu-09", target="ssh://gpu-09", started="2026-12-03T04:00:00+00:00",
        duration_s=10.0, results=(), error="gpu-09: connection timed out after 10 s",
    ).to_dict()))
    code, out, _ = merge(capsys, "--format", "json", "--golden", "gpu-01", str(good), str(down))
    assert code == 3
    fleet = json.loads(out)
    assert fleet["summary"]["unreachable"] == 1
    assert fleet["golden"] == {"host": "gpu-01", "same": [], "differ": {}}
    assert {h["host"]: h["fingerprint"] for h in fleet["hosts"]}["gpu-09"] == ""
    assert all("gpu-09" not in hosts for hosts in fleet["fingerprints"].values())
    _, prom, _ = merge(capsys, "--format", "prometheus", str(good), str(down))
    families = parse(prom)
    assert ({"host": "gpu-09"}, 0.0) in families["host_auditor_up"]
    assert [labels["host"] for labels, _ in families["host_auditor_tuning_info"]] == ["gpu-01"]
    code, _, err = merge(capsys, "--golden", "gpu-09", str(good), str(down))
    assert code == 2 and "could not be audited" in err


def test_a_result_file_is_read_whole_to_its_bound_and_never_a_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from auditor import results

    body = b'{"host": "a"}' * 1000
    path = tmp_path / "a.json"
    path.write_bytes(body)
    assert results.read_result(str(path)) == body
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    refused = results.read_result(str(fifo))
    assert isinstance(refused, OSError) and "not a regular file" in str(refused)
    # A file that grew after its size was taken is read on, to the bound and no further.
    real_fstat = os.fstat

    def smaller(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, *st[1:6], 10, *st[7:]))

    monkeypatch.setattr(os, "fstat", smaller)
    assert results.read_result(str(path)) == body
    monkeypatch.setattr(results, "MAX_RESULT", 4096)
    too_big = results.read_result(str(path))
    assert isinstance(too_big, OSError) and "larger than" in str(too_big)
