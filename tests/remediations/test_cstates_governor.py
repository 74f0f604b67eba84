"""cpu.cstates and cpu.governor remediations on the H200 capture with cpufreq planted."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from auditor.render import render_fix
from tests.support.fixkit import (
    assert_idempotent_and_reversible,
    fix_cycle,
    needs_root,
    plan_for,
    report_of,
    write_scripts,
)
from tests.support.plant import CPUFREQ, plant_cpufreq, plant_cstates, plant_grub
from tests.support.sysroot import Sysroot


def grub_line(root: Path) -> str:
    lines = (root / "etc/default/grub").read_text().splitlines()
    return next(line for line in lines if line.startswith("GRUB_CMDLINE_LINUX_DEFAULT="))


@needs_root
def test_deep_state_disabled_on_every_cpu_and_capped_at_boot(
    h200: Sysroot, tmp_path: Path
) -> None:
    findings = plant_cstates(h200)
    plant_grub(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, report_of(findings))
    cpu = copy / "sys/devices/system/cpu"
    assert {(cpu / f"cpu{n}/cpuidle/state3/disable").read_text() for n in range(16)} == {"1\n"}
    assert {(cpu / f"cpu{n}/cpuidle/state1/disable").read_text() for n in range(16)} == {"0\n"}
    # intel_idle keeps its first two states (C1, C1E); processor.max_cstate is acpi_idle's
    # and stays as it was.
    assert grub_line(copy) == (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=9 intel_idle.max_cstate=2"'
    )
    assert "update-grub" not in [ln.strip() for ln in fix.read_text().splitlines()]
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_governors_set_to_performance_and_default_governor_on_cmdline(
    h200: Sysroot, tmp_path: Path
) -> None:
    findings = plant_cpufreq(h200)
    plant_grub(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, report_of(findings))
    governors = {(copy / f"{CPUFREQ.lstrip('/')}/policy{n}/scaling_governor").read_text()
                 for n in range(16)}
    assert governors == {"performance\n"}
    assert "cpufreq.default_governor=performance" in grub_line(copy)
    assert "daemons that set governors can revert this" in fix.read_text()
    assert_idempotent_and_reversible(fix, rollback, copy, before)
    assert (copy / f"{CPUFREQ.lstrip('/')}/policy9/scaling_governor").read_text() == "ondemand\n"


@needs_root
def test_intel_pstate_gets_epp_and_a_systemd_unit(h200: Sysroot, tmp_path: Path) -> None:
    findings = plant_cpufreq(h200, driver="intel_pstate", epp=True)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, report_of(findings))
    policy = copy / CPUFREQ.lstrip("/") / "policy3"
    assert (policy / "energy_performance_preference").read_text() == "performance\n"
    assert (policy / "scaling_governor").read_text() == "performance\n"
    unit = copy / "etc/systemd/system/host-auditor-cpu-performance.service"
    assert "$$f" in unit.read_text()
    link = copy / "etc/systemd/system/multi-user.target.wants" / unit.name
    assert link.is_symlink() and str(link.readlink()) == "/" + str(unit.relative_to(copy))
    # EPP is written before the governor, so the rollback restores the governor first.
    text = fix.read_text()
    text = text[text.index("\nstate_init()"):]  # the steps, after the embedded rollback
    assert text.index("policy0/energy_performance_preference") < text.index(
        "policy0/scaling_governor")
    assert_idempotent_and_reversible(fix, rollback, copy, before)


def test_live_plan_refreshes_grub_only_after_a_change(h200: Sysroot, tmp_path: Path) -> None:
    findings = plant_cstates(h200)
    plant_grub(h200)
    plan = dataclasses.replace(plan_for(h200, report_of(findings)), root="")
    fix, rollback = write_scripts(plan, tmp_path)
    boot = next(a for a in plan.actions if a.step.kind == "replace_line")
    assert f"run_after 0 {boot.id} update-grub" in fix.read_text()
    assert f"undo_after 0 {boot.id} update-grub" in rollback.read_text()
    assert "sysfs.path" in render_fix(plan).script  # the helper is there, used only with ROOT


def test_haltpoll_has_no_boot_parameter_so_a_unit_disables_the_state(virtio: Sysroot) -> None:
    findings = plant_cstates(virtio, driver="haltpoll")
    plan = plan_for(virtio, report_of(findings))
    state, unit = [s for s in plan.sections if s.remedy.check == "cpu.cstates"]
    assert not state.remedy.boot_params and not unit.remedy.boot_params
    assert any("no boot parameter" in n for n in state.remedy.notes)
    assert [a.step.path for a in unit.actions[:2]] == [  # type: ignore[union-attr]
        "/etc/systemd/system/host-auditor-cpuidle.service",
        "/etc/systemd/system/multi-user.target.wants/host-auditor-cpuidle.service"]
    assert "state3/disable" in unit.actions[0].step.content  # type: ignore[union-attr]
    assert not [s for s in plan.sections if s.remedy.check == "boot"]


def test_bash_n_on_every_rendering(h200: Sysroot, tmp_path: Path) -> None:
    findings = [*plant_cstates(h200), *plant_cpufreq(h200, "intel_pstate", epp=True)]
    plan = plan_for(h200, report_of(findings))
    write_scripts(dataclasses.replace(plan, root=""), tmp_path)
    subprocess.run(["bash", "-n", str(tmp_path / "fix.sh")], check=True)


@needs_root
def test_boost_and_max_freq_cap_lifted_with_the_real_check(h200: Sysroot, tmp_path: Path) -> None:
    from auditor.model import Status
    from tests.support.fixkit import audit_root, statuses

    plant_cpufreq(h200)
    h200.write("/sys/devices/system/cpu/cpufreq/boost", "0\n")
    for n in range(4):
        h200.write(f"{CPUFREQ}/policy{n}/scaling_max_freq", "2000000\n")
    assert Status.WARN in statuses(audit_root(h200), "cpu.governor")
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert (copy / "sys/devices/system/cpu/cpufreq/boost").read_text() == "1\n"
    assert (copy / CPUFREQ.lstrip("/") / "policy2/scaling_max_freq").read_text() == "3800000\n"
    assert statuses(audit_root(copy), "cpu.governor") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)
