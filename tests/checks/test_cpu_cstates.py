"""cpu.cstates against the real captures, with cpuidle states planted in copies."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from auditor import environment as where
from auditor.checks.cpu_cstates import CpuCstates
from auditor.checks.lib import bootloader, tuned
from auditor.cli import main
from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.model import Finding, Status
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import Sysroot

CPU = "/sys/devices/system/cpu"
INTEL = [("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170)]
AMD = [("POLL", 0), ("C1", 1), ("C2", 800)]


def plant_states(
    root: Sysroot,
    cpus: Iterable[int],
    states: list[tuple[str, int]],
    *,
    driver: str = "intel_idle",
    disabled: dict[str, Iterable[int]] | None = None,
) -> None:
    """Write cpuidle states for each CPU as the kernel lays them out."""
    off = {name: set(cpus_off) for name, cpus_off in (disabled or {}).items()}
    root.write(f"{CPU}/cpuidle/current_driver", f"{driver}\n")
    for cpu in cpus:
        for index, (name, latency) in enumerate(states):
            base = f"{CPU}/cpu{cpu}/cpuidle/state{index}"
            root.write(f"{base}/name", f"{name}\n")
            root.write(f"{base}/desc", f"{driver.upper()} {name}\n")
            root.write(f"{base}/latency", f"{latency}\n")
            root.write(f"{base}/residency", f"{latency * 3}\n")
            root.write(f"{base}/disable", "1\n" if cpu in off.get(name, ()) else "0\n")


def findings(root: Sysroot, **options: Any) -> list[Finding]:
    return list(CpuCstates.configured(**options).evaluate(DirectoryHost(str(root.root))))


def fails(found: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in found if f.status is Status.FAIL}


# -- the real captures ---------------------------------------------------------------------


def test_h200_driver_none_skips_with_the_reason(h200: Sysroot) -> None:
    [finding] = findings(h200)
    assert finding.status is Status.SKIP
    assert "'none'" in finding.message
    assert "VM guest (unknown hypervisor) without cpuidle" in finding.message
    assert "the hypervisor host's C-states decide" in finding.message


def test_virtio_haltpoll_passes_as_a_paravirtual_guest_driver(virtio: Sysroot) -> None:
    [finding] = findings(virtio)
    assert finding.status is Status.PASS
    assert "paravirtual guest driver" in finding.message
    assert "haltpoll idle (1 us)" in finding.message
    assert dict(finding.evidence)["driver"] == "haltpoll"


def test_haltpoll_states_are_still_judged(virtio: Sysroot) -> None:
    for cpu in (0, 1):
        virtio.write(f"{CPU}/cpu{cpu}/cpuidle/state1/latency", "50\n")
    virtio.write(f"{CPU}/cpu0/cpuidle/state1/disable", "1\n")
    found = findings(virtio)
    [fail] = found
    assert fail.status is Status.FAIL
    assert fail.subject == "haltpoll idle"
    assert dict(fail.evidence)["cpus"] == "1"
    assert dict(fail.evidence)["desc"] == "default architecture idle"


def test_missing_cpuidle_skips(virtio: Sysroot) -> None:
    virtio.remove(f"{CPU}/cpuidle")
    for cpu in (0, 1):
        virtio.remove(f"{CPU}/cpu{cpu}/cpuidle")
    [finding] = findings(virtio)
    assert finding.status is Status.SKIP
    assert "no cpuidle" in finding.message


def test_driver_without_states_skips(h200: Sysroot) -> None:
    h200.write(f"{CPU}/cpuidle/current_driver", "acpi_idle\n")
    [finding] = findings(h200)
    assert finding.status is Status.SKIP
    assert "acpi_idle is registered but no CPU lists idle states" in finding.message


# -- intel_idle on 32 CPUs ----------------------------------------------------------------


def test_intel_c6_enabled_everywhere_fails_once(h200: Sysroot) -> None:
    plant_states(h200, range(32), INTEL)
    found = findings(h200)
    assert [f.status for f in found] == [Status.FAIL]
    c6 = fails(found)["C6"]
    assert dict(c6.evidence) == {
        "driver": "intel_idle",
        "limit_us": "20",
        "environment": "VM (unknown hypervisor)",
        "state": "state3",
        "cpus": "0-31",
        "latency_us": "170",
        "desc": "INTEL_IDLE C6",
        "residency_us": "510",
    }
    assert c6.observed == "170 us"
    assert c6.expected == "<= 20 us"
    assert c6.fix == "cpupower -c 0-31 idle-set -d 3"
    assert "enabled on CPUs 0-31 (driver intel_idle)" in c6.message


def test_state_disabled_on_some_cpus_names_exactly_the_rest(h200: Sysroot) -> None:
    plant_states(h200, range(32), INTEL, disabled={"C6": range(8, 12)})
    c6 = fails(findings(h200))["C6"]
    assert dict(c6.evidence)["cpus"] == "0-7,12-31"
    assert "(disabled on CPUs 8-11)" in c6.message
    assert c6.fix == "cpupower -c 0-7,12-31 idle-set -d 3"


def test_state_disabled_everywhere_passes(h200: Sysroot) -> None:
    plant_states(h200, range(32), INTEL, disabled={"C6": range(32)})
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert "deepest enabled state is C1E (10 us)" in finding.message


def test_latency_profile_limit_also_fails_c1e(h200: Sysroot) -> None:
    plant_states(h200, range(32), INTEL, disabled={"C1E": [0, 1], "C6": range(16, 32)})
    found = fails(findings(h200, max_exit_latency_us=2))
    assert sorted(found) == ["C1E", "C6"]
    assert dict(found["C1E"].evidence)["cpus"] == "2-31"
    assert dict(found["C1E"].evidence)["limit_us"] == "2"
    assert dict(found["C6"].evidence)["cpus"] == "0-15"


def test_every_state_disabled_passes(h200: Sysroot) -> None:
    plant_states(h200, range(4), INTEL, disabled={n: range(4) for n, _ in INTEL})
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert "every idle state is disabled" in finding.message


def test_offline_cpus_are_left_out(h200: Sysroot) -> None:
    plant_states(h200, range(32), INTEL)
    h200.write(f"{CPU}/offline", "4-7,30\n")
    c6 = fails(findings(h200))["C6"]
    assert dict(c6.evidence)["cpus"] == "0-3,8-29,31"


@pytest.mark.parametrize("offline", ["0-99999999999", "banana", "\u00b2", "5-"])
def test_garbled_offline_list_leaves_every_cpu_in(h200: Sysroot, offline: str) -> None:
    plant_states(h200, range(8), INTEL)
    h200.write(f"{CPU}/offline", f"{offline}\n")
    assert dict(fails(findings(h200))["C6"].evidence)["cpus"] == "0-7"


def test_cpus_with_fewer_states_are_judged_apart(h200: Sysroot) -> None:
    plant_states(h200, range(16), INTEL)
    plant_states(h200, range(16, 32), INTEL[:3])  # these CPUs list no C6
    [c6] = fails(findings(h200)).values()
    assert dict(c6.evidence)["cpus"] == "0-15"


def test_cpus_of_different_drivers_are_judged_by_their_own_table(h200: Sysroot) -> None:
    # Kernels that drive CPUs with several drivers name each CPU's driver.
    big, little = range(0, 4), range(4, 8)
    plant_states(h200, big, [("WFI", 1), ("cpu-sleep", 900)], driver="psci_idle")
    plant_states(h200, little, [("WFI", 1), ("cpu-sleep", 15)], driver="psci_idle")
    for cpu in big:
        h200.write(f"{CPU}/cpu{cpu}/cpuidle/driver/name", "psci_idle_big\n")
    for cpu in little:
        h200.write(f"{CPU}/cpu{cpu}/cpuidle/driver/name", "psci_idle_little\n")
    found = findings(h200)
    [fail] = fails(found).values()
    assert (fail.subject, dict(fail.evidence)["cpus"]) == ("cpu-sleep", "0-3")


# -- AMD EPYC acpi_idle ---------------------------------------------------------------------


def test_amd_c2_fails_on_a_big_host(h200: Sysroot) -> None:
    plant_states(h200, range(128), AMD, driver="acpi_idle", disabled={"C2": range(64, 96)})
    found = findings(h200)
    assert [f.status for f in found] == [Status.FAIL]
    c2 = fails(found)["C2"]
    evidence = dict(c2.evidence)
    assert (evidence["cpus"], evidence["latency_us"], evidence["state"], evidence["driver"]) == (
        "0-63,96-127", "800", "state2", "acpi_idle",
    )


def test_throughput_profile_through_the_cli(
    h200: Sysroot, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_states(h200, range(8), [("POLL", 0), ("C1", 2), ("C1E", 30)])
    args = ["local", "--root", str(h200.root), "--format", "json", "--check", "cpu.cstates"]
    assert main(args) == 1
    capsys.readouterr()
    assert main([*args, "--profile", "throughput"]) == 0
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert finding["status"] == "pass"
    assert "within the 50 us limit" in finding["message"]


# -- the kernel command line ---------------------------------------------------------------


def test_idle_poll_passes_with_a_note(h200: Sysroot) -> None:
    h200.write("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz root=/dev/vda1 ro idle=poll\n")
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert "idle=poll" in finding.message
    assert "power" in finding.message


def test_idle_halt_without_cpuidle_passes(h200: Sysroot) -> None:
    h200.write("/proc/cmdline", "root=/dev/vda1 idle=halt\n")
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert "C1 (HLT)" in finding.message


def test_cmdline_limit_is_named_in_the_message(h200: Sysroot) -> None:
    plant_states(h200, range(16), INTEL[:2])
    h200.write("/proc/cmdline", "root=/dev/vda1 intel_idle.max_cstate=1 idle=nomwait\n")
    [finding] = findings(h200)
    assert finding.status is Status.PASS
    assert "intel_idle.max_cstate=1 on the kernel command line" in finding.message
    assert "idle=nomwait" in finding.message
    assert "processor.max_cstate" not in finding.message  # 8 is the default: no cap


def test_module_parameter_limit_is_named(h200: Sysroot) -> None:
    plant_states(h200, range(16), AMD, driver="acpi_idle")
    h200.write("/sys/module/processor/parameters/max_cstate", "1\n")
    c2 = fails(findings(h200))["C2"]
    assert "processor.max_cstate is 1" in c2.message


# -- untrusted input -------------------------------------------------------------------------


@pytest.mark.parametrize("latency", ["lots", "\u00b2", "-5", "", "9" * 40])
def test_unreadable_latency_skips_that_state(h200: Sysroot, latency: str) -> None:
    plant_states(h200, range(4), INTEL)
    h200.write(f"{CPU}/cpu0/cpuidle/state3/latency", f"{latency}\n")
    # No pass beside the skip: the shallower states pass, but C6 could not be judged.
    [finding] = findings(h200)
    assert (finding.status, finding.subject) == (Status.SKIP, "C6")
    assert dict(finding.evidence)["cpus"] == "0-3"
    assert dict(finding.evidence)["state"] == "state3"


def test_garbage_never_crashes(h200: Sysroot) -> None:
    table = [*INTEL, ("C8", 300)]
    plant_states(h200, range(4), table, disabled={"C6": range(4)})
    h200.write(f"{CPU}/cpu1/cpuidle/state3/disable", "maybe\n")
    h200.write(f"{CPU}/cpu0/cpuidle/state4/name", b"\xffC8$(reboot)\n")
    h200.write(f"{CPU}/cpu2/cpuidle/state4/disable", b"\x00")
    h200.remove(f"{CPU}/cpu3/cpuidle/state4/disable")
    h200.write(f"{CPU}/cpuidle/current_driver", b"\x00\x01")
    h200.write("/proc/cmdline", b"\xff\xfe idle= intel_idle.max_cstate=$(reboot)\n")
    found = findings(h200)
    assert sorted((f.status.value, f.subject) for f in found) == [
        ("fail", "C6"), ("fail", "\ufffdC8$(reboot)"),
    ]
    c6 = next(f for f in found if f.subject == "C6")
    assert dict(c6.evidence)["cpus"] == "1"  # an unreadable disable flag proves nothing
    odd = next(f for f in found if f.subject.endswith("$(reboot)"))
    # cpu3 lists no state4 at all; the fix holds only numbers the check built.
    assert dict(odd.evidence)["cpus"] == "0-2"
    assert odd.fix == "cpupower -c 0-2 idle-set -d 4"


# -- the seam contract, scale and the other ways in -----------------------------------------


def test_reads_declares_every_path_and_each_file_is_read_once(h200: Sysroot) -> None:
    cpus, states = 128, 8
    table = [("POLL", 0), *((f"C{i}", i * 25) for i in range(1, states))]
    plant_states(h200, range(cpus), table, disabled={"C7": range(0, 128, 2)})
    host = RecordingHost(str(h200.root))
    found = list(CpuCstates().evaluate(host))
    assert sorted(fails(found)) == [f"C{i}" for i in range(1, states)]
    assert dict(fails(found)["C7"].evidence)["cpus"] == format_odd(cpus)
    assert undeclared(host.asked, CpuCstates.reads) == []
    assert len(host.reads) == len(set(host.reads))
    # One listing of the CPU directory. Per CPU: the disable flag of each state that can
    # fail (C1-C7); POLL, within the limit, only on the first CPU (enabled there: the
    # deepest enabled state within the limit is known). Once: the per-CPU driver name
    # (absent here, so not read again), the driver's table (name, one probe past the
    # last state, latency), desc and residency per failing state, the driver, the
    # offline list, the command line and two module parameters.
    assert host.listings == [CPU]
    table_reads = (states + 1) + states + 2 * (states - 1)
    # Once each: where the audit runs (the environment's files), tuned's active profile, and
    # the next boot's line every check shares (the command line counted above).
    boot = [p for p in host.reads if p != "/proc/cmdline" and p not in where.READS
            and any(fnmatch.fnmatchcase(p, g) for g in bootloader.NEXT_BOOT_READS)]
    shared = [p for p in host.reads if p in (*where.READS, *tuned.READS)] + boot
    assert len(shared) - len(boot) <= len(where.READS) + 1
    assert len(boot) <= len(bootloader.NEXT_BOOT_READS)
    flags = cpus * (states - 1) + 1
    assert len(host.reads) == flags + 1 + table_reads + 5 + len(shared)


def test_states_within_the_limit_are_read_deepest_first_until_one_is_enabled(
        h200: Sysroot) -> None:
    """The verdict names the deepest enabled state within the limit: C1E is disabled
    everywhere, so C1 is read until a CPU has it enabled (CPU 5), and POLL never."""
    cpus = 16
    plant_states(h200, range(cpus), INTEL,
                 disabled={"C6": range(cpus), "C1E": range(cpus), "C1": range(5)})
    host = RecordingHost(str(h200.root))
    [finding] = CpuCstates().evaluate(host)
    assert finding.status is Status.PASS
    assert "the deepest enabled state is C1 (2 us)" in finding.message
    flags = [p for p in host.reads if p.endswith("/disable")]
    read = {(int(p.split("/cpu")[2].split("/")[0]), p.split("/")[-2]) for p in flags}
    assert read == ({(c, "state3") for c in range(cpus)}  # C6: can fail, every CPU
                    | {(c, "state2") for c in range(cpus)}  # C1E: disabled everywhere
                    | {(c, "state1") for c in range(6)})  # C1 up to CPU 5
    assert len(flags) == len(read)


def format_odd(cpus: int) -> str:
    return ",".join(str(c) for c in range(1, cpus, 2))


def test_capture_archive_gives_the_same_findings(h200: Sysroot, tmp_path: Path) -> None:
    plant_states(h200, range(32), INTEL, disabled={"C6": [3, 4, 5]})
    from_dir = [(f.status, f.subject, f.message, f.evidence) for f in findings(h200)]
    archive = ArchiveHost.from_path(str(h200.tarball(tmp_path / "capture.tar.gz")))
    from_archive = [
        (f.status, f.subject, f.message, f.evidence) for f in CpuCstates().evaluate(archive)
    ]
    assert from_archive == from_dir
    assert dict(from_dir[0][3])["cpus"] == "0-2,6-31"


def test_cli_json(h200: Sysroot, capsys: pytest.CaptureFixture[str]) -> None:
    plant_states(h200, range(32), INTEL, disabled={"C6": range(12, 32)})
    code = main(["local", "--root", str(h200.root), "--format", "json", "--check", "cpu.cstates"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["summary"]["fail"] == 1
    assert report["checks"] == [
        {"check": "cpu.cstates", "status": "fail", "duration_s": report["checks"][0]["duration_s"]}
    ]
    [finding] = report["findings"]
    assert finding["check"] == "cpu.cstates"
    assert finding["host"] == "gpu-h200-vm"
    assert finding["subject"] == "C6"
    assert finding["severity"] == "high"
    assert finding["fix"] == "cpupower -c 0-11 idle-set -d 3"
    assert {k: finding["evidence"][k] for k in ("state", "cpus", "latency_us", "driver",
                                                "limit_us")} == {
        "state": "state3", "cpus": "0-11", "latency_us": "170", "driver": "intel_idle",
        "limit_us": "20",
    }


# -- states by what they are, PM QoS holders, the boot cap per driver ------------------------

from auditor.checks.cpu_cstates import IdleState, force_latency_us, qos_limit  # noqa: E402
from tests.support.hostgen.platforms import (  # noqa: E402
    EPYC_STATES,
    EpycSpec,
    GraceSpec,
    build_epyc,
    build_grace,
)


def tree(build: Any, spec: Any, tmp_path: Path) -> Sysroot:
    return Sysroot(build(spec).write_dir(tmp_path / "tree"))


def test_epyc_c2_is_cc6_whatever_latency_the_bios_declares(tmp_path: Path) -> None:
    root = tree(build_epyc, EpycSpec(), tmp_path)
    for latency in ("18", "30", "400", "800"):
        for cpu in range(32):
            root.write(f"{CPU}/cpu{cpu}/cpuidle/state2/latency", f"{latency}\n")
        [c2] = fails(findings(root, max_exit_latency_us=1000)).values()
        assert "CC6" in c2.message and dict(c2.evidence)["identity"].startswith("CC6")
    # By declared latency alone (the option off), 800 us still fails the default limit.
    assert fails(findings(root, judge_identity=False))
    root.write(f"{CPU}/cpu0/cpuidle/state2/desc", "ACPI FFH MWAIT 0x20\n")
    for cpu in range(32):
        root.write(f"{CPU}/cpu{cpu}/cpuidle/state2/latency", "18\n")
    # Not entered through the I/O port: not the CC6 entry; judged by its latency.
    assert not fails(findings(root))


def test_intel_state_named_c2_is_not_amds_cc6(h200: Sysroot) -> None:
    plant_states(h200, range(4), [("POLL", 0), ("C1", 1), ("C2", 10)], driver="acpi_idle")
    for cpu in range(4):
        h200.write(f"{CPU}/cpu{cpu}/cpuidle/state2/desc", "ACPI IOPORT 0x414\n")
    # The capture is an Intel guest: the identity rule is AMD Zen's.
    assert [f.status for f in findings(h200)] == [Status.PASS]


def test_tuned_force_latency_blocks_the_state_and_is_named(tmp_path: Path) -> None:
    root = tree(build_epyc, EpycSpec(tuned_latency=True), tmp_path)
    [finding] = findings(root)
    assert finding.status is Status.PASS
    assert "C2 (18 us) is enabled but never entered" in finding.message
    assert "tuned's active profile latency-performance" in finding.message
    assert dict(finding.evidence)["qos_us"] == "1"
    # A limit above the state's latency blocks nothing.
    root.write("/usr/lib/tuned/latency-performance/tuned.conf", "[cpu]\nforce_latency=100\n")
    assert [f.status for f in findings(root)] == [Status.FAIL]
    # tuned installed but neither enabled nor running holds nothing.
    root.write("/usr/lib/tuned/latency-performance/tuned.conf", "[cpu]\nforce_latency=1\n")
    root.remove("/etc/systemd/system/multi-user.target.wants/tuned.service")
    assert [f.status for f in findings(root)] == [Status.FAIL]


@pytest.mark.parametrize(("value", "us"), [
    ("1", 1), ("cstate.id:1|3", 1), ("cstate.id_no_zero:0|3", 3), ("cstate.id:0", 0),
    ("cstate.name:C2|5", 18), ("cstate.name:C9|5", 5), ("cstate.id:9", None), ("n/a", None),
    ("", None), ("99999999999", None),
])
def test_force_latency(value: str, us: int | None) -> None:
    states = [IdleState(i, name, str(latency)) for i, (name, _, latency, _) in
              enumerate(EPYC_STATES)]
    assert force_latency_us(value, states) == us


class LiveQos(DirectoryHost):
    """A sysroot standing in for this machine, whose /dev/cpu_dma_latency reads a value."""

    kind = "local"

    def __init__(self, root: str, value: int) -> None:
        super().__init__(root)
        self.value = value

    def lstat(self, path: str) -> Any:
        from auditor.hosts.base import Entry

        if path == "/dev/cpu_dma_latency":
            return Entry("chr", major=10, minor=62)
        return super().lstat(path)

    def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
        if path == "/dev/cpu_dma_latency":
            return self.value.to_bytes(4, "little", signed=True)[:limit]
        return super().read_bytes(path, limit)


def test_cpu_dma_latency_read_on_the_live_host(tmp_path: Path) -> None:
    root = tree(build_epyc, EpycSpec(), tmp_path)
    states = [IdleState(2, "C2", "18")]
    held = qos_limit(LiveQos(str(root.root), 5), states)
    assert held is not None and held.us == 5
    assert "fuser -v /dev/cpu_dma_latency" in held.holder
    assert qos_limit(LiveQos(str(root.root), 2_000_000_000), states) is None
    # A sysroot's /dev is never read: it may hold anything.
    assert qos_limit(DirectoryHost(str(root.root)), states) is None


def test_boot_cap_matches_the_idle_driver(h200: Sysroot, tmp_path: Path) -> None:
    from tests.support.fixkit import plan_for

    def caps(root: Sysroot) -> tuple[list[str], list[str]]:
        plan = plan_for(root)
        params = [p for s in plan.sections for p in s.remedy.boot_params]
        units = [a.step.content for s in plan.sections  # type: ignore[union-attr]
                 for a in s.actions if a.step.kind == "write_file"]
        return params, units

    plant_states(h200, range(4), INTEL)
    assert caps(h200) == (["intel_idle.max_cstate=2"], [])
    epyc = tree(build_epyc, EpycSpec(), tmp_path / "epyc")
    assert caps(epyc) == (["processor.max_cstate=1"], [])
    grace = tree(build_grace, GraceSpec(), tmp_path / "grace")
    params, [unit] = caps(grace)
    assert params == []  # processor.max_cstate does nothing on the LPI path
    assert "cpu[0-9]*/cpuidle/state1/disable; do echo 1 > \"$$f\"" in unit
    assert "state0" not in unit


def test_container_plan_writes_nothing_to_the_hosts_sysfs(tmp_path: Path) -> None:
    from tests.support.fixkit import plan_for
    from tests.support.hostgen.guests import ContainerAuditSpec, build_container_audit

    root = tree(build_container_audit, ContainerAuditSpec(host_cc6=True, host_powersave=True,
                                                          host_numa=True), tmp_path)
    plan = plan_for(root)
    assert not plan.actions
    assert not [p for s in plan.sections for p in s.remedy.boot_params]
    checks = {s.remedy.check for s in plan.sections if s.remedy.advice}
    assert {"cpu.cstates", "cpu.governor", "numa.balancing"} <= checks
    assert all(a.text.startswith("on the host") for s in plan.sections for a in s.remedy.advice)
