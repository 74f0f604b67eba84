"""cpu.cstates: its fix on the H200 capture with idle states planted."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from auditor.render import render_fix
from tests.support.factories import make_report
from tests.support.fixkit import (
    assert_idempotent_and_reversible,
    fix_cycle,
    needs_root,
    plan_for,
    write_scripts,
)
from tests.support.plant import grub_line, plant_cpufreq, plant_cstates, plant_grub
from tests.support.sysroot import Sysroot


@needs_root
def test_deep_state_disabled_on_every_cpu_and_capped_at_boot(
    h200: Sysroot, tmp_path: Path
) -> None:
    findings = plant_cstates(h200)
    plant_grub(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(findings))
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


def test_live_plan_refreshes_grub_only_after_a_change(h200: Sysroot, tmp_path: Path) -> None:
    findings = plant_cstates(h200)
    plant_grub(h200)
    plan = dataclasses.replace(plan_for(h200, make_report(findings)), root="")
    fix, rollback = write_scripts(plan, tmp_path)
    boot = next(a for a in plan.actions if a.step.kind == "replace_line")
    assert f"run_after 0 {boot.id} update-grub" in fix.read_text()
    assert f"undo_after 0 {boot.id} update-grub" in rollback.read_text()
    assert "ROOT" not in render_fix(plan).script  # a booted machine's script: no sysroot


def test_haltpoll_has_no_boot_parameter_so_a_unit_disables_the_state(virtio: Sysroot) -> None:
    findings = plant_cstates(virtio, driver="haltpoll")
    plan = plan_for(virtio, make_report(findings))
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
    plan = plan_for(h200, make_report(findings))
    write_scripts(dataclasses.replace(plan, root=""), tmp_path)
    subprocess.run(["bash", "-n", str(tmp_path / "fix.sh")], check=True)
