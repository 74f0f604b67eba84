"""The finding model: roll-ups, waived findings, finding keys, ties between two reports."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.check import Check, CheckOptions
from auditor.cli import main
from auditor.fleet import golden_diff
from auditor.hosts import DirectoryHost
from auditor.hosts.base import Host
from auditor.model import (
    CheckResult,
    FailOn,
    Finding,
    Report,
    Severity,
    Status,
    fingerprint,
    fingerprint_inputs,
    pick_report,
    worst,
)
from auditor.policy import Policy
from auditor.render import render_report
from auditor.results import load_results
from auditor.runner import audit
from tests.support.factories import make_finding, make_report
from tests.support.sysroot import CAPTURES, Sysroot

PASS, SKIP, WARN, FAIL, ERROR = Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR


# -- roll-ups --------------------------------------------------------------------------------


@pytest.mark.parametrize(("statuses", "expected"), [
    ([], PASS),
    ([SKIP], SKIP),
    ([SKIP, SKIP], SKIP),
    ([PASS, SKIP], PASS),
    ([SKIP, PASS, SKIP], PASS),
    ([SKIP, WARN], WARN),
    ([PASS, FAIL, SKIP, WARN], FAIL),
    ([ERROR, SKIP], ERROR),
])
def test_a_skip_never_outranks_a_judged_status(statuses: list[Status], expected: Status) -> None:
    assert worst(statuses) is expected


def test_check_and_host_roll_ups_count_skips_beside() -> None:
    kernel = CheckResult("kernel.version", 0.0, (
        make_finding(check="kernel.version", subject="kernel", status=PASS),
        make_finding(check="kernel.version", subject="nvidia-driver", status=SKIP),
    ))
    idle = CheckResult("cpu.cstates", 0.0, (make_finding(check="cpu.cstates", status=SKIP),))
    report = Report("vm", "local", "", 0.0, (kernel, idle))
    assert (kernel.status, kernel.skipped) == (PASS, 1)
    assert idle.status is SKIP
    assert (report.status, report.skipped) == (PASS, 2)


def test_a_healthy_vm_is_pass_in_every_roll_up(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The virtio VM capture passes what it can judge and skips the rest: no SKIP roll-up."""
    report_file = tmp_path / "vm.json"
    assert main(["local", "--root", str(CAPTURES["virtio"]), "-o", str(report_file)]) == 0
    document = json.loads(report_file.read_text())
    assert document["summary"]["skip"] >= 1 and document["summary"]["pass"] >= 1
    assert main(["merge", str(report_file), "-f", "json"]) == 0
    fleet = json.loads(capsys.readouterr().out)
    assert fleet["summary"]["hosts_by_status"]["pass"] == 1
    assert fleet["summary"]["hosts_by_status"]["skip"] == 0
    assert main(["merge", str(report_file), "-f", "html"]) == 0
    html = capsys.readouterr().out
    assert re.search(r'<tr class="host-row pass" data-host="vm-virtio">', html)
    assert re.search(r'<span class="badge pass">pass</span> <span class="muted count">\d+ skip',
                     html)
    assert main(["merge", str(report_file)]) == 0
    assert "hosts by worst status: 1 pass, 0 warn, 0 fail, 0 error; 1 host with skipped " \
        "checks" in capsys.readouterr().out


# -- waived findings ---------------------------------------------------------------------------


def waived_report() -> Report:
    waived = make_finding(waived=True, waiver="benchmark host (until 2999-01-01)")
    other = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=PASS,
                         message="MaxReadReq 4096")
    return make_report([waived, other], host="gpu-07")


def test_a_waived_finding_keeps_its_status_everywhere_and_is_marked() -> None:
    report = waived_report()
    assert report.exit_code(FailOn.FAIL) == 0 and report.status is PASS
    data = json.loads(render_report(report, "json"))
    [finding] = [f for f in data["findings"] if f["check"] == "numa.balancing"]
    assert (finding["status"], finding["waived"]) == ("fail", True)
    assert finding["waiver"] == "benchmark host (until 2999-01-01)"
    assert data["summary"]["fail"] == 0 and data["summary"]["waived"] == 1
    assert Report.from_dict(data).findings[0] == report.findings[0]
    # Prometheus: the real status, and a waived label
    families = {f.name: f for f in text_string_to_metric_families(render_report(report,
                                                                                "prometheus"))}
    labels = [dict(s.labels) for s in families["host_auditor_finding"].samples]
    assert {"check": "numa.balancing", "status": "fail", "waived": "true"}.items() <= \
        next(x for x in labels if x["check"] == "numa.balancing").items()
    assert next(x for x in labels if x["check"] == "pcie.mrrs")["waived"] == "false"
    # JUnit: skipped, with the reason
    suite = ET.fromstring(render_report(report, "junit").encode()).find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    skipped = suite.find("testcase/skipped")
    assert skipped is not None
    assert skipped.get("message") == "waived (fail): benchmark host (until 2999-01-01)"
    # HTML: a badge; text: listed apart from the problems
    html = render_report(report, "html")
    assert '<span class="badge waived" title="benchmark host (until 2999-01-01)">waived</span>' \
        in html
    text = render_report(report, "text")
    assert "Problems" not in text
    assert "FAIL  numa.balancing  kernel  waived: benchmark host (until 2999-01-01)" in text


# -- finding keys -------------------------------------------------------------------------------


class TwoOnOneSubject(Check[CheckOptions]):
    """Judge two things of one device, naming only one of them."""

    id: ClassVar[str] = "test.two"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/proc/devices",)
    rationale: ClassVar[str] = ""
    remedy: ClassVar[str] = ""

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self.passed("0000:41:00.0", "MaxReadReq 4096", observed="4096")
        yield self.warned("0000:41:00.0", "link x8 of x16", observed="x8", aspect="link")
        yield self.warned("0000:41:00.0", "link again", observed="x4", aspect="link")


def test_keys_stay_unique_and_show_in_the_text_view(h200: Sysroot) -> None:
    report = audit(DirectoryHost(str(h200.root)), [TwoOnOneSubject], Policy())
    assert [f.key for f in report.findings] == [
        ("test.two", "0000:41:00.0", ""), ("test.two", "0000:41:00.0", "link"),
        ("test.two", "0000:41:00.0", "link#2")]
    text = render_report(report, "text")
    assert "WARN  test.two  0000:41:00.0 [link]\n" in text
    assert "WARN  test.two  0000:41:00.0 [link#2]\n" in text


def test_golden_diff_and_fingerprint_tell_two_aspects_of_one_subject_apart() -> None:
    mrrs = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=PASS, observed="4096")
    link = make_finding(check="pcie.mrrs", subject="0000:41:00.0", status=PASS,
                        observed="32GT/s x16", aspect="link")
    narrow = Finding(**{**link.__dict__, "status": WARN, "observed": "32GT/s x8"})
    golden = make_report([mrrs, link], host="gpu-01")
    other = make_report([mrrs, narrow], host="gpu-02")
    [difference] = golden_diff([golden, other], "gpu-01")["gpu-02"]
    assert difference.describe() == ("pcie.mrrs 0000:41:00.0 [link]: status pass -> warn, "
                                     "observed '32GT/s x16' -> '32GT/s x8'")
    assert fingerprint(golden) != fingerprint(other)
    assert ["pcie.mrrs", "0000:41:00.0", "link", "pass", "32GT/s x16"] in \
        fingerprint_inputs(golden)["findings"]
    # a waiver is policy, not tuning: waiving the narrow link leaves the fingerprint alone
    waived = make_report([mrrs, Finding(**{**narrow.__dict__, "waived": True})], host="gpu-02")
    assert fingerprint(waived) == fingerprint(other)


# -- two reports of one host --------------------------------------------------------------------


def timed(started: str, *findings: Finding) -> Report:
    return make_report(findings or [make_finding(status=PASS)], host="gpu-01", started=started)


def test_the_later_start_wins_to_the_microsecond() -> None:
    early = timed("2026-12-03T04:00:00.100000+00:00", make_finding(status=FAIL))
    late = timed("2026-12-03T04:00:00.200000+00:00")
    assert pick_report(early, late) == (late, "newer")
    assert pick_report(late, early) == (late, "newer")
    # other offsets and whole seconds (reports of older versions) compare as times
    assert pick_report(timed("2026-12-03T05:00:00+01:00"), late)[0] is late


def test_a_tie_keeps_the_worse_result_and_says_so() -> None:
    same = "2026-12-03T04:00:00+00:00"
    healthy, failing = timed(same), timed(same, make_finding(status=FAIL))
    for first, second in ((healthy, failing), (failing, healthy)):
        chosen, why = pick_report(first, second)
        assert chosen is failing
        assert why == (f"both started at {same}: keeping the worse result (fail: 1 fail, "
                       "against pass)")


def test_a_tie_of_results_as_bad_never_depends_on_names_or_order(tmp_path: Path) -> None:
    same = "2026-12-03T04:00:00+00:00"
    one = timed(same, make_finding(status=FAIL, observed="1"))
    two = timed(same, make_finding(status=FAIL, observed="2"))
    kept = {pick_report(one, two)[0].findings[0].observed,
            pick_report(two, one)[0].findings[0].observed}
    assert len(kept) == 1
    # through audit merge: whichever file is named a.json or z.json, the same report stays
    chosen = set()
    for names in (("a.json", "z.json"), ("z.json", "a.json")):
        folder = tmp_path / names[0]
        folder.mkdir()
        for name, report in zip(names, (one, two), strict=True):
            (folder / name).write_text(json.dumps(report.to_dict()))
        loaded = load_results(sorted(str(p) for p in folder.iterdir()))
        [report] = loaded.reports
        chosen.add(report.findings[0].observed)
        [note] = loaded.notes
        assert "results as bad (fail: 1 fail): keeping the one whose content digest" in note
    assert chosen == kept


def test_reports_record_what_made_them(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from auditor import __version__

    policy = tmp_path / "site.toml"
    policy.write_text('profile = "latency"\n')
    assert main(["local", "--root", str(CAPTURES["virtio"]), "-f", "json", "--policy",
                 str(policy)]) == 0
    document = json.loads(capsys.readouterr().out)
    import hashlib

    assert document["tool"] == {"name": "host-auditor", "version": __version__}
    assert document["policy"] == {"profile": "latency", "file": str(policy),
                                  "sha256": hashlib.sha256(policy.read_bytes()).hexdigest()}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", document["started"])
    assert main(["local", "--root", str(CAPTURES["virtio"]), "--policy", str(policy)]) == 0
    assert (f"host-auditor {__version__}, profile latency, policy {policy} (sha256 "
            f"{document['policy']['sha256'][:12]})") in capsys.readouterr().out
    assert main(["fingerprint", "--root", str(CAPTURES["virtio"]), "-f", "json"]) == 0
    stamp = json.loads(capsys.readouterr().out)
    assert stamp["policy"] == {"profile": "gpu-inference"} and stamp["tool"]["version"]
