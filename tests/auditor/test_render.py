"""Reports render to strings in every format, safely for hostile values."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from auditor.model import CheckResult, FailOn, Report, Status
from auditor.render import FORMATS, make_environment, render_report, render_reports, shell_quote
from tests.support.factories import make_finding
from tests.support.sysroot import Sysroot

HOSTILE = "0000:41:00.0\n$(touch /tmp/pwned)</td><script>alert(1)</script>\x01"


def sample_report(host: str = "gpu-01") -> Report:
    findings = (
        make_finding(host=host),
        make_finding(host=host, check="pcie.mrrs", subject=HOSTILE, observed="512",
                     expected="4096", status=Status.FAIL),
        make_finding(host=host, check="pcie.mrrs", subject="0000:42:00.0", status=Status.PASS),
        make_finding(host=host, check="cpu.governor", subject="0-63", status=Status.WARN),
        make_finding(host=host, check="cpu.cstates", subject="cpuidle", status=Status.SKIP,
                     message="no cpuidle driver"),
    )
    results = tuple(
        CheckResult(check=c, duration_s=0.01, findings=tuple(f for f in findings if f.check == c))
        for c in dict.fromkeys(f.check for f in findings)
    )
    return Report(host=host, target="local", started="2026-12-03T00:00:00+00:00",
                  duration_s=0.05, results=results, facts=(("kernel", "6.14.0"),))


def test_json_is_the_documented_contract() -> None:
    data = json.loads(render_report(sample_report(), "json"))
    assert set(data) >= {"host", "started", "duration_s", "summary", "findings"}
    assert data["summary"] == {"pass": 1, "skip": 1, "warn": 1, "fail": 2, "error": 0,
                               "waived": 0}
    finding = data["findings"][1]
    assert set(finding) >= {"check", "status", "severity", "subject", "observed", "expected",
                            "message"}
    assert finding["subject"] == HOSTILE
    assert Report.from_dict(data).to_dict()["findings"] == data["findings"]


def test_fleet_json_lists_hosts() -> None:
    data = json.loads(render_reports([sample_report("a"), sample_report("b")], "json"))
    assert [h["host"] for h in data["hosts"]] == ["a", "b"]
    assert data["summary"]["hosts"] == 2


def test_junit_is_valid_xml_with_one_testcase_per_check_and_subject() -> None:
    text = render_report(sample_report(), "junit")
    root = ET.fromstring(text.encode())
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 5
    assert len(root.findall("./testsuite/testcase/failure")) == 2
    assert len(root.findall("./testsuite/testcase/skipped")) == 1
    hostile = [c for c in cases if "pwned" in c.get("name", "")]
    assert hostile and "<script>" in hostile[0].get("name", "")
    warning = ET.fromstring(render_report(sample_report(), "junit",
                                          fail_on=FailOn.WARN).encode())
    assert len(warning.findall("./testsuite/testcase/failure")) == 3


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for key, value in attrs:
            if key in ("src", "href") and value and not value.startswith("#"):
                self.external.append(value)


def test_html_is_standalone_and_escapes_host_values() -> None:
    text = render_report(sample_report(), "html")
    parser = _Collect()
    parser.feed(text)
    assert text.startswith("<!DOCTYPE html>")
    assert "script" not in parser.tags
    assert parser.external == []
    assert "&lt;script&gt;" in text


def test_text_report_one_line_per_check_and_problem_details() -> None:
    text = render_report(sample_report(), "text")
    assert "\x1b[" not in text
    lines = text.splitlines()
    check_lines = [line for line in lines if line.startswith("  ") and "." in line[:40]]
    assert any(line.split()[:2] == ["FAIL", "pcie.mrrs"] for line in check_lines)
    assert "observed: 512   expected: 4096" in text
    assert "fix: sysctl -w kernel.numa_balancing=0" in text
    assert "\x1b[1;31m" in render_report(sample_report(), "text", colour=True)


def test_markdown_has_a_table_row_per_check() -> None:
    text = render_report(sample_report(), "markdown")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 4


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_an_unreachable_host(fmt: str) -> None:
    down = Report(host="10.0.0.9", target="ssh://10.0.0.9", started="", duration_s=0.0,
                  results=(), error="connection refused")
    # An NFD feature file labels one node: several hosts are refused (tests/engines).
    text = render_reports([down] if fmt == "nfd" else [sample_report(), down], fmt)
    # Prometheus carries no free text: the host shows as down by its label.
    assert ("10.0.0.9" if fmt == "prometheus" else "connection refused") in text


@pytest.mark.parametrize(
    "value", ["plain", "a b", "$(touch x)", "line\nbreak", "it's", "`id`", "", "--flag"]
)
def test_shell_environment_quotes_every_value(value: str, tmp_path: object) -> None:
    import subprocess

    env = make_environment("shell")
    script = env.from_string("printf '%s' {{ value }}").render(value=value)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == value
    assert shell_quote(value) in script


def test_json_report_does_not_import_jinja(h200: Sysroot) -> None:
    """JSON is what pipelines and fleets ask for: it skips the template engine's import."""
    probe = ("import io, sys, contextlib\n"
             "from auditor.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             f"    main(['local', '--root', {str(h200.root)!r}, '--format', 'json'])\n"
             "sys.exit(3 if 'jinja2' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
