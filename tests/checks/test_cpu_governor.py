"""cpu.governor against the real captures, with cpufreq policies planted in copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from auditor.checks.cpu_governor import CpuGovernor
from auditor.checks.lib.cpufreq import parse_cpu_numbers, parse_khz
from auditor.cli import main
from auditor.hosts import DirectoryHost, LocalHost
from auditor.hosts.archive import ArchiveHost
from auditor.model import Finding, Status
from auditor.parsing import format_cpulist
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import Sysroot

CPUFREQ = "/sys/devices/system/cpu/cpufreq"
ACPI_GOVERNORS = "conservative ondemand userspace powersave performance schedutil"


def plant_policies(
    root: Sysroot,
    cpus: Iterable[int],
    *,
    driver: str = "acpi-cpufreq",
    governor: str = "ondemand",
    available: str = ACPI_GOVERNORS,
    epp: str | None = None,
    max_freq: int = 3_700_000,
    hw_max: int = 3_700_000,
    per_policy: int = 1,
) -> None:
    """Write one cpufreq policy per ``per_policy`` CPUs, as the kernel lays them out."""
    ordered = sorted(cpus)
    for start in range(0, len(ordered), per_policy):
        members = ordered[start : start + per_policy]
        base = f"{CPUFREQ}/policy{members[0]}"
        listed = " ".join(str(c) for c in members) + "\n"
        root.write(f"{base}/scaling_driver", f"{driver}\n")
        root.write(f"{base}/scaling_governor", f"{governor}\n")
        root.write(f"{base}/scaling_available_governors", f"{available}\n")
        root.write(f"{base}/affected_cpus", listed)
        root.write(f"{base}/related_cpus", listed)
        root.write(f"{base}/scaling_max_freq", f"{max_freq}\n")
        root.write(f"{base}/scaling_min_freq", "1500000\n")
        root.write(f"{base}/cpuinfo_max_freq", f"{hw_max}\n")
        if epp is not None:
            root.write(f"{base}/energy_performance_preference", f"{epp}\n")
            root.write(
                f"{base}/energy_performance_available_preferences",
                "default performance balance_performance balance_power power \n",
            )


def findings(root: Sysroot, **options: Any) -> list[Finding]:
    return list(CpuGovernor.configured(**options).evaluate(DirectoryHost(str(root.root))))


def by_status(found: list[Finding], status: Status) -> list[Finding]:
    return [f for f in found if f.status is status]


class ProcessHost(DirectoryHost):
    """A sysroot whose running processes are given (the live host reports them)."""

    def __init__(self, root: str, running: Iterable[str]) -> None:
        super().__init__(root)
        self.running = frozenset(running)

    def processes(self) -> frozenset[str] | None:
        return self.running


# -- the real captures ---------------------------------------------------------------


@pytest.mark.parametrize("capture", ["h200", "virtio"])
def test_vm_captures_without_cpufreq_skip(make_sysroot: Any, capture: str) -> None:
    [finding] = findings(make_sysroot(capture))
    assert finding.status is Status.SKIP
    assert "no cpufreq policies" in finding.message
    assert "VM" in finding.message


def test_empty_cpufreq_directory_skips(h200: Sysroot) -> None:
    h200.path(CPUFREQ).mkdir(parents=True)
    [finding] = findings(h200)
    assert finding.status is Status.SKIP


# -- acpi-cpufreq --------------------------------------------------------------------


def test_acpi_cpufreq_ondemand_fails_naming_every_cpu(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="ondemand")
    h200.write(f"{CPUFREQ}/boost", "1\n")
    [fail] = findings(h200)
    assert fail.status is Status.FAIL
    assert fail.subject == "0-15"
    assert fail.observed == "ondemand"
    assert fail.expected == "performance"
    assert fail.fix == "cpupower -c 0-15 frequency-set -g performance"
    evidence = dict(fail.evidence)
    assert evidence["driver"] == "acpi-cpufreq"
    assert evidence["governor"] == "ondemand"
    assert evidence["policies"] == " ".join(f"policy{i}" for i in range(16))
    assert evidence["available_governors"] == ACPI_GOVERNORS
    assert "epp" not in evidence


def test_acpi_cpufreq_performance_passes(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="performance")
    h200.write(f"{CPUFREQ}/boost", "1\n")
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert finding.subject == "0-15"


def test_groups_split_by_governor_with_compact_cpu_lists(h200: Sysroot) -> None:
    plant_policies(h200, [*range(64), *range(96, 128)], governor="schedutil")
    plant_policies(h200, range(64, 96), governor="performance")
    found = findings(h200)
    [fail] = by_status(found, Status.FAIL)
    [ok] = by_status(found, Status.PASS)
    assert fail.subject == "0-63,96-127"
    assert ok.subject == "64-95"
    assert dict(fail.evidence)["policies"].split()[:2] == ["policy0", "policy1"]
    assert len(dict(fail.evidence)["policies"].split()) == 96


def test_shared_policies_name_their_affected_cpus(h200: Sysroot) -> None:
    plant_policies(h200, range(8), governor="conservative", per_policy=4)
    plant_policies(h200, range(8, 16), governor="performance", per_policy=4)
    found = findings(h200)
    [fail] = by_status(found, Status.FAIL)
    assert fail.subject == "0-7"
    assert dict(fail.evidence)["policies"] == "policy0 policy4"


def test_one_policy_per_present_cpu_reads_no_affected_cpus(h200: Sysroot) -> None:
    h200.write("/sys/devices/system/cpu/present", "0-15\n")
    plant_policies(h200, range(8), governor="conservative")
    plant_policies(h200, range(8, 16), governor="performance")
    host = RecordingHost(str(h200.root))
    found = list(CpuGovernor.configured().evaluate(host))
    [fail] = by_status(found, Status.FAIL)
    assert fail.subject == "0-7"
    assert not [p for p in host.reads if p.endswith("/affected_cpus")]
    assert host.reads.count(f"{CPUFREQ}/policy3/scaling_governor") == 1


@pytest.mark.parametrize(("present", "per_policy"), [("0-15", 4), ("0-31", 1)])
def test_fewer_policies_than_present_cpus_read_affected_cpus(
        h200: Sysroot, present: str, per_policy: int) -> None:
    # Shared policies, or CPUs without a policy: which CPUs a policy holds is read.
    h200.write("/sys/devices/system/cpu/present", f"{present}\n")
    plant_policies(h200, range(16), governor="conservative", per_policy=per_policy)
    h200.write(f"{CPUFREQ}/policy4/affected_cpus" if per_policy == 4 else
               f"{CPUFREQ}/policy5/affected_cpus", "4 5 6 7\n")
    host = RecordingHost(str(h200.root))
    found = list(CpuGovernor.configured().evaluate(host))
    [fail] = by_status(found, Status.FAIL)
    assert fail.subject == "0-15"
    assert len([p for p in host.reads if p.endswith("/affected_cpus")]) == 16 // per_policy


def test_missing_performance_governor_says_so(h200: Sysroot) -> None:
    plant_policies(h200, range(4), governor="schedutil", available="schedutil")
    [fail] = findings(h200)
    assert "not among the available governors (schedutil)" in fail.message
    assert fail.fix == (
        "modprobe cpufreq_performance && cpupower -c 0-3 frequency-set -g performance"
    )


def test_governor_option_changes_what_passes(h200: Sysroot) -> None:
    plant_policies(h200, range(4), governor="schedutil")
    assert [f.status for f in findings(h200, governor="schedutil")] == [Status.PASS]
    assert [f.status for f in findings(h200)] == [Status.FAIL]


# -- EPP drivers -----------------------------------------------------------------------


def test_amd_pstate_epp_powersave_with_performance_epp_passes(h200: Sysroot) -> None:
    plant_policies(
        h200, range(16), driver="amd-pstate-epp", governor="powersave",
        available="performance powersave", epp="performance",
    )
    h200.write("/sys/devices/system/cpu/amd_pstate/status", "active\n")
    h200.write(f"{CPUFREQ}/boost", "1\n")
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert finding.subject == "0-15"
    assert dict(finding.evidence)["mode"] == "active"
    assert dict(finding.evidence)["epp"] == "performance"


def test_amd_pstate_epp_balance_power_fails_only_there(h200: Sysroot) -> None:
    common: dict[str, Any] = {
        "driver": "amd-pstate-epp", "governor": "powersave", "available": "performance powersave",
    }
    plant_policies(h200, [*range(4), *range(8, 16)], epp="performance", **common)
    plant_policies(h200, range(4, 8), epp="balance_power", **common)
    h200.write("/sys/devices/system/cpu/amd_pstate/status", "active\n")
    found = findings(h200)
    [fail] = by_status(found, Status.FAIL)
    [ok] = by_status(found, Status.PASS)
    assert (fail.subject, ok.subject) == ("4-7", "0-3,8-15")
    evidence = dict(fail.evidence)
    assert evidence["epp"] == "balance_power"
    assert evidence["governor"] == "powersave"
    assert evidence["policies"] == "policy4 policy5 policy6 policy7"
    assert fail.observed == "powersave with EPP balance_power"
    assert "energy_performance_preference=performance" in fail.message
    assert "balance_power power" in fail.message  # the offered preferences


def test_amd_pstate_guided_needs_the_performance_governor(h200: Sysroot) -> None:
    plant_policies(
        h200, range(8), driver="amd-pstate", governor="schedutil",
        available="performance powersave schedutil",
    )
    h200.write("/sys/devices/system/cpu/amd_pstate/status", "guided\n")
    [fail] = findings(h200)
    assert fail.status is Status.FAIL
    assert dict(fail.evidence)["mode"] == "guided"
    assert "amd-pstate (guided mode)" in fail.message


def test_intel_pstate_active_balance_performance_fails_and_no_turbo_warns(
    h200: Sysroot,
) -> None:
    plant_policies(
        h200, range(16), driver="intel_pstate", governor="powersave",
        available="performance powersave", epp="balance_performance",
    )
    h200.write("/sys/devices/system/cpu/intel_pstate/status", "active\n")
    h200.write("/sys/devices/system/cpu/intel_pstate/no_turbo", "1\n")
    found = findings(h200)
    [fail] = by_status(found, Status.FAIL)
    [boost] = by_status(found, Status.WARN)
    assert fail.subject == "0-15"
    assert dict(fail.evidence)["epp"] == "balance_performance"
    assert boost.subject == "boost"
    assert boost.fix == "echo 0 > /sys/devices/system/cpu/intel_pstate/no_turbo"
    assert boost.observed == "no_turbo=1"


def test_intel_pstate_powersave_with_epp_performance_passes(h200: Sysroot) -> None:
    plant_policies(
        h200, range(16), driver="intel_pstate", governor="powersave",
        available="performance powersave", epp="performance",
    )
    h200.write("/sys/devices/system/cpu/intel_pstate/no_turbo", "0\n")
    assert [f.status for f in findings(h200)] == [Status.PASS]


def test_intel_passive_powersave_fails_whatever_the_epp(h200: Sysroot) -> None:
    # intel_cpufreq is intel_pstate in passive mode: powersave there pins the minimum.
    plant_policies(
        h200, range(16), driver="intel_cpufreq", governor="powersave",
        available="performance powersave schedutil", epp="performance",
    )
    h200.write("/sys/devices/system/cpu/intel_pstate/status", "passive\n")
    [fail] = findings(h200)
    assert fail.status is Status.FAIL
    assert dict(fail.evidence)["mode"] == "passive"


# -- boost and caps ----------------------------------------------------------------------


def test_boost_off_warns_unless_not_required(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="performance")
    h200.write(f"{CPUFREQ}/boost", "0\n")
    found = findings(h200)
    [warn] = by_status(found, Status.WARN)
    assert warn.subject == "boost"
    assert warn.fix == f"echo 1 > {CPUFREQ}/boost"
    assert [f.status for f in findings(h200, require_boost=False)] == [Status.PASS]


def test_max_freq_cap_warns_on_the_capped_cpus(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="performance", hw_max=3_700_000)
    for cpu in (0, 1, 2, 3, 9):
        h200.write(f"{CPUFREQ}/policy{cpu}/scaling_max_freq", "2000000\n")
    h200.write(f"{CPUFREQ}/boost", "1\n")
    found = findings(h200)
    [warn] = by_status(found, Status.WARN)
    assert warn.subject == "max-freq:0-3,9"
    assert warn.fix == "cpupower -c 0-3,9 frequency-set -u 3700000"
    assert "2000 MHz" in warn.message and "3700 MHz" in warn.message
    assert dict(warn.evidence)["scaling_min_freq"] == "1500000"
    assert dict(warn.evidence)["policies"] == "policy0 policy1 policy2 policy3 policy9"
    [ok] = by_status(found, Status.PASS)
    assert ok.subject == "0-15"  # the governor itself is right


def test_cap_with_boost_off_names_the_cause(h200: Sysroot) -> None:
    plant_policies(
        h200, range(4), driver="amd-pstate-epp", governor="performance",
        available="performance powersave", epp="performance",
        max_freq=2_400_000, hw_max=3_700_000,
    )
    h200.write(f"{CPUFREQ}/boost", "0\n")
    warns = by_status(findings(h200), Status.WARN)
    assert sorted(w.subject for w in warns) == ["boost", "max-freq:0-3"]
    cap = next(w for w in warns if w.subject.startswith("max-freq"))
    assert "boost is off" in cap.message


# -- daemons that would revert a fix ------------------------------------------------------


def test_reverting_daemons_warn_on_the_live_host_only(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="ondemand")
    host = ProcessHost(str(h200.root), {"tuned", "thermald", "power-profiles-", "bash"})
    found = list(CpuGovernor().evaluate(host))
    warns = by_status(found, Status.WARN)
    assert sorted(w.subject for w in warns) == ["power-profiles-daemon", "tuned"]
    tuned = next(w for w in warns if w.subject == "tuned")
    assert tuned.fix == "tuned-adm profile latency-performance"
    # A sysroot cannot show processes: no daemon finding at all.
    assert by_status(findings(h200), Status.WARN) == []


def test_daemon_keeping_a_good_setting_is_named_not_warned(h200: Sysroot) -> None:
    plant_policies(h200, range(16), governor="performance")
    host = ProcessHost(str(h200.root), {"tuned"})
    [ok] = list(CpuGovernor().evaluate(host))
    assert ok.status is Status.PASS
    assert "managed by tuned" in ok.message
    assert dict(ok.evidence)["managed_by"] == "tuned"


@pytest.fixture
def tuned_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a real process whose name is ``tuned`` (a copy of sleep)."""
    sleep = shutil.which("sleep")
    if sleep is None:
        pytest.skip("no sleep binary")
    binary = tmp_path / "bin" / "tuned"
    binary.parent.mkdir()
    shutil.copy(sleep, binary)
    proc = subprocess.Popen([str(binary), "30"])
    try:
        deadline = time.monotonic() + 5
        while "tuned" not in (LocalHost().processes() or ()) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_real_running_tuned_is_seen_through_psutil(
    h200: Sysroot, tuned_process: subprocess.Popen[bytes]
) -> None:
    class LiveProcesses(DirectoryHost):
        def processes(self) -> frozenset[str] | None:
            return LocalHost().processes()

    plant_policies(h200, range(16), governor="powersave")
    found = list(CpuGovernor().evaluate(LiveProcesses(str(h200.root))))
    assert "tuned" in [f.subject for f in by_status(found, Status.WARN)]


# -- untrusted input -------------------------------------------------------------------------


def test_garbage_never_crashes(h200: Sysroot) -> None:
    plant_policies(h200, range(4), governor="ondemand")
    h200.write(f"{CPUFREQ}/policy0/scaling_governor", b"\xff\xfe$(reboot)\n")
    h200.write(f"{CPUFREQ}/policy1/affected_cpus", "0-99999999999\n")
    h200.write(f"{CPUFREQ}/policy1/related_cpus", "banana\n")
    h200.write(f"{CPUFREQ}/policy2/scaling_max_freq", "fast\n")
    h200.write(f"{CPUFREQ}/policy3/cpuinfo_max_freq", "\u00b2\n")
    h200.remove(f"{CPUFREQ}/policy3/scaling_governor")  # every CPU of it offline
    h200.write(f"{CPUFREQ}/policy_bogus/scaling_governor", "ondemand\n")
    found = findings(h200)
    fails = by_status(found, Status.FAIL)
    assert sorted(f.subject for f in fails) == ["0", "1-2"]
    odd = next(f for f in fails if f.subject == "0")
    # The garbled governor is reported, but the fix holds only the CPU list we built.
    assert odd.fix == "cpupower -c 0 frequency-set -g performance"
    assert by_status(found, Status.WARN) == []


def test_every_policy_unreadable_skips(h200: Sysroot) -> None:
    plant_policies(h200, range(2), governor="ondemand")
    for cpu in range(2):
        h200.remove(f"{CPUFREQ}/policy{cpu}/scaling_governor")
    [finding] = findings(h200)
    assert finding.status is Status.SKIP
    assert "no readable scaling_governor" in finding.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 1 2 3", [0, 1, 2, 3]),
        ("5\n", [5]),
        ("0-3,8", [0, 1, 2, 3, 8]),
        ("", []),
        ("banana", []),
        ("0-99999999", []),
        ("1-", []),
    ],
)
def test_parse_cpu_numbers(text: str, expected: list[int]) -> None:
    assert parse_cpu_numbers(text) == expected


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 2, 4], "0,2,4"),
        ([*range(64), *range(96, 128)], "0-63,96-127"),
        ([7, 1, 0, 2, 2, 12, 13, 14, 15], "0-2,7,12-15"),
    ],
)
def test_format_cpulist(cpus: list[int], expected: str) -> None:
    assert format_cpulist(cpus) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3700000", 3_700_000), (None, None), ("", None), ("-1", None), ("\u00b2", None)],
)
def test_parse_khz(text: str | None, expected: int | None) -> None:
    assert parse_khz(text) == expected


# -- the seam contract and the other ways in -------------------------------------------------


def test_reads_declares_every_path_the_check_touches(h200: Sysroot) -> None:
    plant_policies(
        h200, range(8), driver="amd-pstate-epp", governor="powersave",
        available="performance powersave", epp="power", max_freq=2_000_000,
    )
    h200.write("/sys/devices/system/cpu/amd_pstate/status", "active\n")
    h200.write(f"{CPUFREQ}/boost", "0\n")
    h200.remove(f"{CPUFREQ}/policy1/affected_cpus")
    host = RecordingHost(str(h200.root))
    list(CpuGovernor().evaluate(host))
    assert undeclared(host.asked, CpuGovernor.reads) == []
    assert f"{CPUFREQ}/policy1/related_cpus" in host.reads
    # Each file at most once, and one directory listing for any number of policies.
    assert len(host.reads) == len(set(host.reads))
    assert host.listings == [CPUFREQ]


def test_capture_archive_gives_the_same_findings(h200: Sysroot, tmp_path: Path) -> None:
    plant_policies(h200, range(16), governor="ondemand", max_freq=3_000_000)
    h200.write(f"{CPUFREQ}/boost", "0\n")
    from_dir = [(f.status, f.subject, f.message) for f in findings(h200)]
    archive = ArchiveHost.from_path(str(h200.tarball(tmp_path / "capture.tar.gz")))
    from_archive = [(f.status, f.subject, f.message) for f in CpuGovernor().evaluate(archive)]
    assert from_archive == from_dir
    assert [s for s, _, _ in from_dir] == [Status.FAIL, Status.WARN, Status.WARN]


def test_cli_json_for_a_failing_capture(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_policies(h200, range(16), governor="ondemand")
    capture = h200.tarball(tmp_path / "capture.tar.gz")
    code = main(["local", "--root", str(capture), "--format", "json", "--check", "cpu.governor"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [c["check"] for c in report["checks"]] == ["cpu.governor"]
    [finding] = report["findings"]
    assert finding["status"] == "fail"
    assert finding["subject"] == "0-15"
    assert finding["severity"] == "high"
    assert finding["evidence"]["driver"] == "acpi-cpufreq"


def test_live_host_audit_does_not_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "local", "--format", "json",
         "--check", "cpu.governor", "--check", "cpu.cstates"],
        capture_output=True, text=True, timeout=60, check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    report = json.loads(proc.stdout)
    assert proc.returncode in (0, 1), proc.stderr
    statuses = {f["check"]: f["status"] for f in report["findings"]}
    assert set(statuses) == {"cpu.governor", "cpu.cstates"}
    assert "error" not in statuses.values()


def test_cpufreq_in_each_cpu_directory_without_policies_is_judged(h200: Sysroot) -> None:
    """Old kernels and hand-built trees keep cpufreq in cpuN/cpufreq: each CPU is a policy."""
    for cpu in range(4):
        base = f"/sys/devices/system/cpu/cpu{cpu}/cpufreq"
        h200.write(f"{base}/scaling_driver", "acpi-cpufreq\n")
        h200.write(f"{base}/scaling_governor", "ondemand\n" if cpu < 2 else "performance\n")
        h200.write(f"{base}/scaling_available_governors", ACPI_GOVERNORS + "\n")
    findings = list(CpuGovernor().evaluate(DirectoryHost(str(h200.root))))
    by_status = {f.status: f for f in findings}
    assert set(by_status) == {Status.FAIL, Status.PASS}
    assert by_status[Status.FAIL].subject == "0-1"
    assert dict(by_status[Status.FAIL].evidence)["policies"] == "cpu0 cpu1"
    assert by_status[Status.PASS].subject == "2-3"


# -- where the audit runs --------------------------------------------------------------------


def test_vm_guest_without_cpufreq_points_at_the_hypervisor_host(tmp_path: Path) -> None:
    from tests.support.hostgen.guests import KvmGuestSpec, build_kvm_guest

    root = build_kvm_guest(KvmGuestSpec()).write_dir(tmp_path / "kvm")
    [finding] = CpuGovernor().evaluate(DirectoryHost(str(root)))
    assert finding.status is Status.SKIP
    assert "a VM guest (kvm) does not control the CPU frequency" in finding.message
    assert "hypervisor host's governor" in finding.message


def test_container_judges_the_hosts_cpufreq_and_fixes_nothing_there(tmp_path: Path) -> None:
    from tests.support.fixkit import plan_for
    from tests.support.hostgen.guests import ContainerAuditSpec, build_container_audit

    root = build_container_audit(ContainerAuditSpec(host_powersave=True)).write_dir(
        tmp_path / "ct")
    [finding] = CpuGovernor().evaluate(DirectoryHost(str(root)))
    assert finding.status is Status.FAIL
    assert "this is the host's cpufreq" in finding.message
    assert finding.fix.startswith("on the host: cpupower")
    assert dict(finding.evidence)["environment"] == "unprivileged container (lxc)"
    plan = plan_for(Sysroot(root))
    sections = [s for s in plan.sections if s.remedy.check == "cpu.governor"]
    assert sections and not [a for s in sections for a in s.actions]
    assert not [p for s in plan.sections for p in s.remedy.boot_params]
