"""Profiles, policy files and waivers: unit tests of the loader, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from auditor.check import Check, CheckClass, CheckOptions, option
from auditor.cli import main
from auditor.errors import PolicyError
from auditor.hosts.base import Host
from auditor.model import Finding, Severity, Status
from auditor.policy import DEFAULT_PROFILE, PROFILES, Policy, Waiver, load_policy
from auditor.registry import load_checks
from tests.support.factories import make_finding
from tests.support.sysroot import Sysroot


class ThresholdOptions(CheckOptions):
    """One option of each type a policy file can set."""

    limit_us: int = option(10, minimum=0, maximum=1000)
    ratio: float = option(0.5)
    name: str = option("performance", choices=("performance", "powersave"))
    strict: bool = option(True)
    allowed: tuple[str, ...] = option(("performance",))


class Thresholds(Check[ThresholdOptions]):
    """A check with one option of each type a policy file can set."""

    id: ClassVar[str] = "test.thresholds"
    severity: ClassVar[Severity] = Severity.LOW
    reads: ClassVar[tuple[str, ...]] = ("/proc/version",)
    rationale: ClassVar[str] = "unit tests"
    remedy: ClassVar[str] = "none"
    options_type: ClassVar[type[CheckOptions]] = ThresholdOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {"latency": {"limit_us": 2}}

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self.passed("kernel", "ok")


CHECKS: list[CheckClass] = [Thresholds, *load_checks()]


def write_policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


# -- profiles --------------------------------------------------------------------------


def test_default_profile_is_gpu_inference() -> None:
    assert load_policy(CHECKS).profile == DEFAULT_PROFILE == "gpu-inference"


def test_a_profile_lays_its_values_over_the_defaults() -> None:
    assert load_policy(CHECKS).options_for(Thresholds) == ThresholdOptions()
    latency = load_policy(CHECKS, profile="latency").options_for(Thresholds)
    assert latency == ThresholdOptions(limit_us=2)
    assert load_policy(CHECKS, profile="throughput").options_for(Thresholds) == (
        ThresholdOptions())


def test_cstate_profiles_differ_where_they_say_they_do() -> None:
    cstates = next(c for c in load_checks() if c.id == "cpu.cstates")

    def limit(profile: str) -> int:
        options = load_policy([cstates], profile=profile).options_for(cstates)
        return int(options.to_dict()["max_exit_latency_us"])

    assert limit("latency") < limit("gpu-inference") < limit("throughput")


@pytest.mark.parametrize("check", load_checks(), ids=lambda c: c.id)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_loads_for_every_check(check: CheckClass, profile: str) -> None:
    options = load_policy([check], profile=profile).options_for(check)
    assert isinstance(options, check.options_type)
    assert set(options.to_dict()) == set(check.options_type.specs())


def test_unknown_profile_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="unknown profile 'fast'"):
        load_policy(CHECKS, profile="fast")


def test_file_profile_used_and_command_line_profile_wins(tmp_path: Path) -> None:
    path = write_policy(tmp_path, 'profile = "latency"\n')
    assert load_policy(CHECKS, path).profile == "latency"
    assert load_policy(CHECKS, path, profile="throughput").profile == "throughput"


# -- the options value -----------------------------------------------------------------


def test_options_are_a_frozen_keyword_value() -> None:
    options = ThresholdOptions(limit_us=3)
    assert (options.limit_us, options.ratio, options.allowed) == (3, 0.5, ("performance",))
    assert ThresholdOptions.limit_us == 10  # the class attribute reads as the default
    assert options == ThresholdOptions(limit_us=3) != ThresholdOptions()
    assert hash(options) == hash(ThresholdOptions(limit_us=3))
    assert repr(options) == ("ThresholdOptions(limit_us=3, ratio=0.5, name='performance', "
                             "strict=True, allowed=('performance',))")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.limit_us = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del options.ratio
    with pytest.raises(TypeError, match="unexpected options: limt_us"):
        ThresholdOptions(limt_us=3)  # type: ignore[call-arg]


class _MoreOptions(ThresholdOptions):
    extra: int = option(1, minimum=0)
    shared: ClassVar[str] = "a class variable is no option"


@dataclasses.dataclass(frozen=True)
class _DecoratedOptions(CheckOptions):
    """Declared the older way, as a frozen dataclass: it still works."""

    depth: int = option(4, minimum=1, help="how deep")


def test_a_subclass_adds_options_after_its_bases() -> None:
    assert list(_MoreOptions.specs()) == ["limit_us", "ratio", "name", "strict", "allowed",
                                          "extra"]
    assert _MoreOptions(extra=2) != ThresholdOptions()
    assert ThresholdOptions() != _MoreOptions()  # another class is never equal


def test_an_option_without_a_default_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Bare\.limit: an option needs a default"):
        class Bare(CheckOptions):
            limit: int


def test_options_declared_as_a_dataclass_still_load() -> None:
    spec = _DecoratedOptions.specs()["depth"]
    assert (spec.default, spec.minimum, spec.help) == (4, 1, "how deep")
    assert _DecoratedOptions.build({"depth": 2}, "policy", "x.y").to_dict() == {"depth": 2}
    with pytest.raises(PolicyError, match=r"x\.y\.depth must be an integer of at least 1"):
        _DecoratedOptions.build({"depth": 0}, "policy", "x.y")


# -- per-check overrides ---------------------------------------------------------------


def test_overrides_typed_and_merged_over_defaults(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        '[checks."test.thresholds"]\nlimit_us = 3\nratio = 1\nallowed = "powersave"\n',
    )
    options = load_policy(CHECKS, path).options_for(Thresholds)
    assert options == ThresholdOptions(limit_us=3, ratio=1.0, allowed=("powersave",))
    assert isinstance(options.to_dict()["ratio"], float)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[checks."test.thresholds"]\nlimit_us = "3"\n', "limit_us must be an integer"),
        ('[checks."test.thresholds"]\nlimit_us = true\n', "limit_us must be an integer"),
        ('[checks."test.thresholds"]\nstrict = 1\n', "strict must be a boolean"),
        ('[checks."test.thresholds"]\nallowed = [1, 2]\n', "allowed must be a list"),
        ('[checks."test.thresholds"]\nlimit_us = 3000\n',
         "test.thresholds.limit_us must be an integer from 0 to 1000, got 3000"),
        ('[checks."test.thresholds"]\nname = "turbo"\n',
         "name must be one of performance, powersave, got 'turbo'"),
        ('[checks."test.thresholds"]\nname = ["a"]\n', "name must be one of"),
        ('[checks."test.thresholds"]\nnope = 1\n', "has no option 'nope'"),
        ('[checks."no.such"]\nx = 1\n', "unknown check id 'no.such'"),
        ("[checks.test.thresholds]\nlimit_us = 1\n", 'quote a dotted id'),
        ("checks = 3\n", "[checks] must be a table"),
        ("colour = 1\n", "unknown key(s) colour"),
        ("profile = [1]\n", "unknown profile"),
        ("waivers = 1\n", "waivers must be an array"),
        ("[[waivers]]\ncheck = \"numa.balancing\"\n", "needs a reason"),
        ("[[waivers]]\ncheck = [\"x\"]\nreason = \"r\"\n", "unknown check id"),
        ("[[waivers]]\ncheck = \"numa.balancing\"\nreason = \"r\"\nexpires = \"soon\"\n",
         "not a YYYY-MM-DD date"),
        ("[[waivers]]\ncheck = \"numa.balancing\"\nreason = \"r\"\nexpires = 12:00:00\n",
         "expires must be a date"),
        ("[[waivers]]\ncheck = \"numa.balancing\"\nreason = \"r\"\nhost = 3\n",
         "host must be a non-empty string"),
        ("[[waivers]]\ncheck = \"numa.balancing\"\nreason = \"r\"\nwho = \"me\"\n",
         "unknown key(s) who"),
        ("this is = not toml = at all\n", "not valid TOML"),
    ],
)
def test_bad_policy_files_raise_policy_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(CHECKS, write_policy(tmp_path, body))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unreadable_and_binary_policy_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(CHECKS, str(tmp_path / "missing.toml"))
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(CHECKS, str(binary))


# -- waivers (unit) --------------------------------------------------------------------

TODAY = dt.date(2026, 12, 3)


def waive(finding: Finding, *waivers: Waiver) -> Finding:
    return Policy(waivers=waivers).apply_waivers(finding, TODAY)


def test_live_waiver_keeps_the_real_status_and_marks_the_finding() -> None:
    finding = make_finding(check="pcie.mrrs", subject="0000:41:00.0", host="gpu-07")
    waived = waive(finding, Waiver("pcie.mrrs", "firmware caps it", "gpu-0*", "0000:41:*",
                                   dt.date(2027, 3, 31)))
    assert waived.status is Status.FAIL and waived.waived
    assert waived.counted is Status.PASS  # not a problem in roll-ups and the exit code
    assert waived.waiver == "firmware caps it (until 2027-03-31)"
    assert waived.message == finding.message and waived.evidence == finding.evidence


def test_waiver_holds_through_its_expiry_day_and_lapses_the_day_after() -> None:
    finding = make_finding()
    on_the_day = Waiver("numa.balancing", "r", expires=TODAY)
    assert waive(finding, on_the_day).waived
    lapsed = Waiver("numa.balancing", "batch host", expires=TODAY - dt.timedelta(days=1))
    result = waive(finding, lapsed)
    assert result.status is Status.FAIL and not result.waived
    assert "waiver expired on 2026-12-02: batch host" in result.message
    assert dict(result.evidence)["waiver_expired"] == "2026-12-02"


def test_expired_waiver_does_not_hide_a_later_live_one() -> None:
    lapsed = Waiver("numa.balancing", "old", expires=dt.date(2020, 1, 1))
    live = Waiver("numa.balancing", "new", expires=dt.date(2030, 1, 1))
    assert waive(make_finding(), lapsed, live).waiver == "new (until 2030-01-01)"


@pytest.mark.parametrize(
    ("host", "subject", "applies"),
    [
        ("gpu-0?", "*", True),
        ("GPU-07", "*", True),  # host names have no case
        ("gpu-1*", "*", False),
        ("*", "0000:41:00.0", True),
        ("*", "0000:41:00.[1-7]", False),
        ("*", "0000:41:00.0 ", False),
    ],
)
def test_host_and_subject_globs(host: str, subject: str, applies: bool) -> None:
    finding = make_finding(check="pcie.mrrs", host="gpu-07", subject="0000:41:00.0")
    result = waive(finding, Waiver("pcie.mrrs", "r", host, subject))
    assert result.waived is applies


def test_waivers_leave_pass_skip_error_and_other_checks_alone() -> None:
    waiver = Waiver("numa.balancing", "r")
    for status in (Status.PASS, Status.SKIP, Status.ERROR):
        finding = make_finding(status=status)
        assert waive(finding, waiver) == finding
    other = make_finding(check="pcie.mrrs")
    assert waive(other, waiver) == other
    warned = make_finding(status=Status.WARN)
    assert waive(warned, waiver).waived and waive(warned, waiver).status is Status.WARN


# -- end to end: a real capture with a problem planted, through the CLI ------------------


def plant_numa_failure(root: Sysroot) -> None:
    root.write("/sys/devices/system/node/node1/cpulist", "8-15\n")
    root.write("/proc/sys/kernel/numa_balancing", "1\n")
    root.write("/etc/hostname", "gpu-07\n")


def audit_json(root: Sysroot, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["local", "--root", str(root.root), "--format", "json",
                 "--check", "numa.balancing", *args])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_waiver_applies_end_to_end(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_numa_failure(h200)
    code, report = audit_json(h200, capsys=capsys)
    assert code == 1 and report["findings"][0]["status"] == "fail"
    policy = write_policy(tmp_path, (
        '[[waivers]]\ncheck = "numa.balancing"\nhost = "gpu-0*"\nsubject = "kernel"\n'
        'reason = "benchmark host, balancing studied on purpose"\nexpires = 2999-01-01\n'))
    code, report = audit_json(h200, "--policy", policy, capsys=capsys)
    [finding] = report["findings"]
    assert code == 0
    assert finding["status"] == "fail" and finding["waived"] is True
    assert finding["waiver"] == "benchmark host, balancing studied on purpose (until 2999-01-01)"
    assert report["summary"]["fail"] == 0 and report["summary"]["waived"] == 1
    assert report["checks"] == [{"check": "numa.balancing", "status": "pass",
                                 "duration_s": report["checks"][0]["duration_s"]}]
    assert report["policy"]["file"] == policy and len(report["policy"]["sha256"]) == 64


def test_expired_waiver_stops_waiving_and_says_so_end_to_end(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_numa_failure(h200)
    policy = write_policy(tmp_path, (
        '[[waivers]]\ncheck = "numa.balancing"\nreason = "until the kernel upgrade"\n'
        'expires = 2020-06-30\n'))
    code, report = audit_json(h200, "--policy", policy, capsys=capsys)
    [finding] = report["findings"]
    assert code == 1
    assert finding["status"] == "fail"
    assert "waiver expired on 2020-06-30: until the kernel upgrade" in finding["message"]
    text_code = main(["local", "--root", str(h200.root), "--policy", policy])
    assert text_code == 1
    assert "waiver expired on 2020-06-30" in capsys.readouterr().out


def test_waiver_for_another_host_does_not_apply(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_numa_failure(h200)
    policy = write_policy(tmp_path, (
        '[[waivers]]\ncheck = "numa.balancing"\nhost = "gpu-1*"\nreason = "r"\n'))
    code, report = audit_json(h200, "--policy", policy, capsys=capsys)
    assert code == 1 and report["findings"][0]["status"] == "fail"


@pytest.mark.parametrize(
    "body",
    ["[checks.\"no.such\"]\nx = 1\n", "not = toml = here\n",
     "[[waivers]]\ncheck = \"numa.balancing\"\n"],
)
def test_bad_policy_file_exits_2_with_one_line(tmp_path: Path, body: str) -> None:
    policy = write_policy(tmp_path, body)
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "local", "--policy", policy],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("audit: error: ") and policy in lines[0]


def test_unknown_profile_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "--profile", "fastest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown profile 'fastest'" in err


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[checks."pcie.mrrs"]\nmin_read_request_bytes = 3000\n',
         "pcie.mrrs.min_read_request_bytes must be one of 128, 256, 512, 1024, 2048, 4096, "
         "got 3000"),
        ('[checks."cpu.governor"]\ngovernor = "turbo"\n',
         "cpu.governor.governor must be one of performance, powersave, "),
        ('[checks."cpu.cstates"]\nmax_exit_latency_us = -1\n', "max_exit_latency_us must be"),
        ('[checks."kernel.version"]\nminimum = 6.14\n', "kernel.version.minimum must be a string"),
    ],
)
def test_out_of_range_values_from_the_issue_exit_2_through_the_cli(
    tmp_path: Path, body: str, needle: str
) -> None:
    """One line naming the file, the key and the values allowed; no audit runs."""
    policy = write_policy(tmp_path, body)
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "local", "--policy", policy],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"audit: error: {policy}: ") and needle in line, line


def test_a_waived_finding_gets_no_fix(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Waived keeps the real status, but the fix leaves the accepted finding alone."""
    plant_numa_failure(h200)
    fix = tmp_path / "fix.sh"
    base = ["local", "--root", str(h200.root), "--check", "numa.balancing", "--fix-script",
            str(fix)]
    assert main(base) == 1
    assert ": 2 step(s)" in capsys.readouterr().err and "numa_balancing" in fix.read_text()
    policy = write_policy(tmp_path, '[[waivers]]\ncheck = "numa.balancing"\nreason = "study"\n')
    assert main([*base, "--policy", policy]) == 0
    assert ": 0 step(s)" in capsys.readouterr().err
    assert "numa_balancing" not in fix.read_text()
