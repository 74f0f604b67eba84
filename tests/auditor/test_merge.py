"""``audit merge`` at fleet scale: the same report on any number of processes, one machine
once, each bad input on its own, strict JSON in and out.

The results are the real H200 report kept in tests/fixtures/hosts, varied per host as a
fleet's would be (names, machine ids, a planted failure here and there).
"""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import main
from auditor.merge import CHUNK_FILES, decode, merge, text_view
from auditor.model import FailOn, Report, fingerprint
from auditor.results import load_results

FIXTURE = Path(__file__).parents[1] / "fixtures" / "hosts" / "h200-lent-vm.report.json"
FORMATS = ("text", "json", "html", "prometheus", "line")


def template() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def host_report(index: int, rng: random.Random, **changes: Any) -> dict[str, Any]:
    """Return the fixture's report as fleet host ``index`` would write it."""
    report = copy.deepcopy(template())
    report["host"] = report["target"] = f"gpu-{index:04d}"
    report["facts"]["machine_id"] = f"{index:032x}"
    report["started"] = f"2026-12-03T04:{index // 60 % 60:02d}:{index % 60:02d}+00:00"
    for finding in report["findings"]:
        finding["host"] = report["host"]
        if finding["status"] == "pass" and rng.random() < 0.08:
            finding["status"] = rng.choice(["warn", "fail"])
            finding["observed"] = rng.choice(["1", "powersave", "512"])
    report.update(changes)
    return report


def write(folder: Path, name: str, data: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(data, indent=1))
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """Write 3 chunks' worth of results: several worker processes get work."""
    folder = tmp_path / "results"
    folder.mkdir()
    rng = random.Random(28)
    for index in range(2 * CHUNK_FILES + 17):
        write(folder, f"{index:04d}.json", host_report(index, rng))
    down = host_report(9999, rng, findings=[], checks=[], error="gpu-9999: connection refused")
    write(folder, "down.json", down)
    return folder


def merged_output(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["merge", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("fmt", FORMATS)
def test_any_number_of_processes_gives_the_same_bytes(
    fleet: Path, capsys: pytest.CaptureFixture[str], fmt: str,
) -> None:
    one = merged_output(capsys, str(fleet), "--format", fmt, "--golden", "gpu-0001", "-j", "1")
    three = merged_output(capsys, str(fleet), "--format", fmt, "--golden", "gpu-0001",
                          "-j", "3")
    assert one[0] == three[0] == 3  # one host could not be audited
    assert one[1] == three[1] and one[1]


def test_workers_forked_or_served_give_the_same_bytes(fleet: Path, tmp_path: Path) -> None:
    """A one-thread ``audit merge`` forks its workers; a process with other threads (this
    test's runner may be one) uses a fork server. Both give the single process's bytes."""
    one = tmp_path / "one.json"
    code = main(["merge", str(fleet), "--format", "json", "-j", "1", "-o", str(one)])
    assert code == 3
    done = threading.Event()
    waiter = threading.Thread(target=done.wait)
    waiter.start()  # this process has two threads now: no fork
    try:
        served = merge(sorted(str(p) for p in fleet.iterdir()), "json", jobs=3)
        assert b"".join(served.chunks()) == one.read_bytes()
        served.close()
    finally:
        done.set()
        waiter.join()
    forked = tmp_path / "forked.json"
    run = subprocess.run([sys.executable, "-c", "from auditor.cli import main; raise SystemExit("
                          f"main(['merge', {str(fleet)!r}, '--format', 'json', '-j', '3', "
                          f"'-o', {str(forked)!r}]))"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 3, run.stderr
    assert forked.read_bytes() == one.read_bytes()


def test_text_figures_match_the_reports(fleet: Path) -> None:
    paths = sorted(str(p) for p in fleet.iterdir())
    merged = merge(paths, "text", golden="gpu-0001", jobs=2)
    view = text_view(merged)
    reports = load_results(paths).reports
    assert view.hosts == len(reports) == 2 * CHUNK_FILES + 18
    assert sum(view.host_counts.values()) == view.hosts
    assert view.host_counts["error"] == 1 and view.unreachable == [
        ("gpu-9999", "gpu-9999: connection refused")]
    # The fingerprint groups are the model's fingerprints, counted.
    stamps: dict[str, int] = {}
    for report in reports:
        if not report.error:
            stamps[fingerprint(report)] = stamps.get(fingerprint(report), 0) + 1
    assert view.group_count == len(stamps) > 10
    every = text_view(merged, None)
    assert {stamp: count for stamp, count, _ in every.groups} == stamps
    # The text view holds the largest groups only (what the report lists), the page all.
    assert view.groups == every.groups[:10]
    assert [count for _, count, _ in every.groups] == sorted(stamps.values(), reverse=True)
    # Every host but the golden one and the unreachable one is compared.
    assert view.compared == len(reports) - 2
    assert merged.exit_code == 3


def test_two_machines_with_one_name_stay_two_and_one_machine_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(1)
    first = host_report(1, rng, host="ubuntu", target="10.0.0.1")
    second = host_report(2, rng, host="ubuntu", target="10.0.0.2")
    # The first machine again, reached under another name, an hour later.
    again = copy.deepcopy(first)
    again["target"], again["started"] = "node-a", "2026-12-03T05:00:00+00:00"
    for name, data in (("a.json", first), ("b.json", second), ("c.json", again)):
        write(tmp_path, name, data)
    files = [str(tmp_path / n) for n in ("a.json", "b.json", "c.json")]
    code, out, err = merged_output(capsys, *files, "--format", "json")
    assert code in (0, 1)
    document = json.loads(out)
    assert document["summary"]["hosts"] == 2
    assert sorted(h["facts"]["machine_id"] for h in document["hosts"]) == [
        f"{1:032x}", f"{2:032x}"]
    assert [h["target"] for h in document["hosts"] if h["facts"]["machine_id"]
            == f"{1:032x}"] == ["node-a"]  # the newer report of that machine
    [note] = [line for line in err.splitlines() if "same machine" in line]
    assert "ubuntu (10.0.0.1) and ubuntu (node-a) are the same machine" in note
    _, text, _ = merged_output(capsys, *files)
    assert "host-auditor fleet: 2 hosts" in text
    _, prom, _ = merged_output(capsys, *files, "--format", "prometheus")
    up = [s for family in text_string_to_metric_families(prom)
          if family.name == "host_auditor_up" for s in family.samples]
    assert len(up) == 2 and len({tuple(sorted(s.labels.items())) for s in up}) == 2


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"host": "x", "duration_s": 1' + b"1" * 5000 + b"}", "not valid JSON"),
        (b'{"host": "x\\ud800", "findings": []}', "not valid JSON"),
        (b'{"host": "x", "duration_s": NaN}', "not valid JSON"),
        (b'{"host": "x", "duration_s": -Infinity}', "not valid JSON"),
        (b'{"host": "x", "duration_s": 1e999}', "not valid JSON"),
        (b'{"host": "x", "facts": {"n": ' + b"9" * 5000 + b"}}", "not valid JSON"),
    ],
)
def test_a_bad_input_is_left_out_alone_and_every_number_written_is_finite(
    fleet: Path, capsys: pytest.CaptureFixture[str], content: bytes, reason: str,
) -> None:
    (fleet / "zz-bad.json").write_bytes(content)
    code, out, err = merged_output(capsys, str(fleet), "--format", "json")
    assert code == 2
    [line] = [line for line in err.splitlines() if "zz-bad.json" in line]
    assert reason in line and "left out of the merge" in line
    document = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert document["summary"]["hosts"] == 2 * CHUNK_FILES + 18
    assert all(math.isfinite(h["duration_s"]) for h in document["hosts"])


def test_decode_reads_what_audit_writes_and_what_only_the_model_reads() -> None:
    written = json.dumps(Report.from_dict(template()).to_dict()).encode()
    docs = decode(written)
    assert not isinstance(docs, str), docs
    [doc] = docs
    assert doc.host == "vm" and len(doc.findings) == 24
    # Evidence with a number and a merged fleet file go the model's tolerant way.
    odd = template()
    odd["findings"][0]["evidence"] = {"count": 3}
    docs = decode(json.dumps({"hosts": [odd]}).encode())
    assert not isinstance(docs, str), docs
    [doc] = docs
    assert doc.findings[0].evidence == {"count": "3"}
    refused = decode(b'{"host": "x", "findings": [{"check": "a", "status": "bogus"}]}')
    assert isinstance(refused, str) and refused.startswith("not an audit report")


def test_exit_code_follows_fail_on(tmp_path: Path) -> None:
    rng = random.Random(3)
    report = host_report(1, rng)
    for finding in report["findings"]:
        if finding["status"] in ("fail", "error"):
            finding["status"] = "warn"
    report["findings"][0]["status"] = "warn"
    path = write(tmp_path, "a.json", report)
    down = write(tmp_path, "b.json", host_report(2, rng, findings=[], checks=[],
                                                  error="gpu-0002: timed out"))
    for fmt in FORMATS:  # each format counts the hosts its own way: the same exit code
        assert merge([str(path)], fmt, jobs=1).exit_code == 0, fmt
        assert merge([str(path)], fmt, fail_on=FailOn.WARN, jobs=1).exit_code == 1, fmt
        assert merge([str(path), str(down)], fmt, jobs=1).exit_code == 3, fmt


def odd_fleet(folder: Path) -> list[str]:
    """Write reports that use every field the Prometheus and JSON outputs read: labels to
    escape, waived findings, a key found twice, findings out of check order and of no
    listed check, probe figures, AER counters, phases, aliases, an unreachable host."""
    rng = random.Random(7)
    paths = []
    for index in range(CHUNK_FILES + 9):
        report = host_report(index, rng)
        findings = report["findings"]
        if index % 3 == 0:
            report["host"] = f'node "{index}"\\\nx\u00e9'
            report["name"] = f"alias-{index}"
            report["aliases"] = [f"10.0.0.{index}", "n\nl"]
            report["facts"]["privilege"] = "no root:\tpartial"
            report["timing"] = {"connect_s": 0.123456, "collect": 1.5}
        if index % 4 == 1:
            findings[0] = {**findings[0], "status": "fail", "waived": True,
                           "waiver": "ticket 12 \"until\" Friday"}
            findings.append({**findings[1], "status": "warn", "observed": "again"})
            findings.append({"check": "site.local", "status": "warn", "subject": 'a"b\\c',
                             "aspect": "x\ny", "evidence": {"measured.gbps": "54.6",
                                                             "measured.bad": "nan"}})
            findings.append({"check": "pcie.aer", "status": "pass", "subject": "0000:18:00.0",
                             "evidence": {"aer.RxErr": " 3 ", "aer.TOTAL_ERR_FATAL": "0",
                                          "aer.": "1", "aer.odd": "x"}})
            findings.reverse()
            report["policy"] = {}
            report.pop("tool")
        paths.append(str(write(folder, f"{index:04d}.json", report)))
    down = host_report(999, rng, findings=[], checks=[], error="gpu-0999: timed out")
    paths.append(str(write(folder, "down.json", down)))
    return paths


def test_prometheus_and_json_say_what_the_model_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The merge renders from its typed documents without making reports: byte for byte
    the exposition of the reports, and each host's entry their JSON form."""
    from auditor.prom import render_prometheus

    paths = odd_fleet(tmp_path)
    reports = load_results(paths).reports
    assert len(reports) == len(paths)
    code, prom, _ = merged_output(capsys, *paths, "--format", "prometheus", "-j", "2")
    assert code == 3
    assert prom == render_prometheus(reports)
    assert "host_auditor_measurement{" in prom and "host_auditor_pcie_aer_errors_total{" in prom
    _, out, _ = merged_output(capsys, *paths, "--format", "json", "-j", "2")
    hosts = {(h["host"], h.get("name", "")): h for h in json.loads(out)["hosts"]}
    assert len(hosts) == len(reports)
    for report in reports:
        entry = hosts[(report.host, report.name)]
        assert entry == {**report.to_dict(),
                         "fingerprint": "" if report.error else fingerprint(report)}


@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_a_report_that_only_names_itself_well_decides_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str,
) -> None:
    """The index pass reads a report's names only; a file whose names read but whose
    findings do not is read whole before it can drop another report of its machine, be the
    golden host, or be the last one standing."""
    rng = random.Random(5)
    good = host_report(1, rng, started="2026-12-03T01:00:00+00:00")
    # Newer, so it would be kept over the good one, but a finding's status is no status.
    bad = copy.deepcopy(good)
    bad["started"] = "2026-12-03T09:00:00+00:00"
    bad["findings"][3]["status"] = "bogus"
    other = host_report(2, rng)
    a, b, c = (write(tmp_path, n, d) for n, d in
               (("a.json", good), ("b.json", bad), ("c.json", other)))
    code, out, err = merged_output(capsys, str(a), str(b), str(c), "--format", fmt)
    assert code == 2
    [line] = [line for line in err.splitlines() if "b.json" in line]
    assert "not an audit report" in line and "left out of the merge" in line
    assert "same machine" not in err and "reported by" not in err
    if fmt == "json":
        assert json.loads(out)["summary"]["hosts"] == 2
    # The golden host named by a file that holds no report is not among the results.
    code, _, err = merged_output(capsys, str(b), str(c), "--golden", "gpu-0001")
    assert code == 2 and "golden host 'gpu-0001' is not among the merged results" in err
    assert "b.json" in err and "not an audit report" in err
    # Files whose names read and nothing else: no readable results.
    alone = write(tmp_path, "d.json", {"host": "x", "duration_s": 1, "findings": [
        {"check": "a", "status": "bogus"}]})
    code, _, err = merged_output(capsys, str(alone), "--format", fmt)
    assert code == 2 and "no readable results to merge" in err and "d.json" in err


def test_workers_end_quietly_on_the_parent_s_sigterm(fleet: Path) -> None:
    """``audit merge`` stops its workers with SIGTERM; a forked worker does not keep the
    command's handler (which would print a traceback on stderr as it ended)."""
    program = (
        "import signal, sys\n"
        "from auditor import merge\n"
        "def handler(number, frame): raise SystemExit('handler ran')\n"
        "signal.signal(signal.SIGTERM, handler)\n"
        "pool = merge.Pool(2)\n"
        "got = list(pool.map(signal.getsignal, [signal.SIGTERM, signal.SIGINT] * 4))\n"
        "pool.close()\n"
        "assert got == [signal.SIG_DFL, signal.SIG_IGN] * 4, got\n"
        f"sys.exit(merge.merge(sorted(str(p) for p in __import__('pathlib').Path("
        f"{str(fleet)!r}).iterdir()), 'text', jobs=3).exit_code)\n")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr and "handler ran" not in run.stderr


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_page_is_the_model_s_page_though_each_cell_is_rendered_once(
    fleet: Path, jobs: int,
) -> None:
    """A merge renders each distinct grid cell once per worker and reuses it: the page is
    still the one the model renders host by host (cells differ by planted failures and
    observed values, and by which differ from the golden host)."""
    from auditor.fleet import fleet_view
    from auditor.render import render_merge

    paths = sorted(str(p) for p in fleet.iterdir())
    merged = merge(paths, "html", golden="gpu-0001", jobs=jobs)
    page = b"".join(merged.chunks()).decode()
    merged.close()
    assert page == render_merge(fleet_view(load_results(paths), "gpu-0001"), "html")
    assert page.count("<tr class=\"host-row") == 2 * CHUNK_FILES + 18
