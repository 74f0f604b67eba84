"""cpu.governor: its fix on the H200 capture with cpufreq planted."""

from __future__ import annotations

from pathlib import Path

from tests.support.factories import make_report
from tests.support.fixkit import assert_idempotent_and_reversible, fix_cycle, needs_root
from tests.support.plant import CPUFREQ, grub_line, plant_cpufreq, plant_grub
from tests.support.sysroot import Sysroot


@needs_root
def test_governors_set_to_performance_and_default_governor_on_cmdline(
    h200: Sysroot, tmp_path: Path
) -> None:
    findings = plant_cpufreq(h200)
    plant_grub(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(findings))
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
    plan, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(findings))
    policy = copy / CPUFREQ.lstrip("/") / "policy3"
    assert (policy / "energy_performance_preference").read_text() == "performance\n"
    assert (policy / "scaling_governor").read_text() == "performance\n"
    unit = copy / "etc/systemd/system/host-auditor-cpu-performance.service"
    assert "$$f" in unit.read_text()
    link = copy / "etc/systemd/system/multi-user.target.wants" / unit.name
    assert link.is_symlink() and str(link.readlink()) == "/" + str(unit.relative_to(copy))
    # EPP is written before the governor, so the rollback restores the governor first.
    paths = [getattr(a.step, "path", "") for a in plan.actions]
    assert paths.index(f"{CPUFREQ}/policy0/energy_performance_preference") < paths.index(
        f"{CPUFREQ}/policy0/scaling_governor")
    assert_idempotent_and_reversible(fix, rollback, copy, before)


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


@needs_root
def test_the_fix_sets_the_governor_the_policy_names(h200: Sysroot, tmp_path: Path) -> None:
    """A policy's governor is what the check judges by and what the fix writes (here and on
    the boot command line), through --policy on the command line."""
    from auditor.cli import main
    from tests.support.fixkit import copy_tree, run, tree_hash

    plant_cpufreq(h200)
    plant_grub(h200)
    policy = tmp_path / "site.toml"
    policy.write_text('[checks."cpu.governor"]\ngovernor = "schedutil"\n')
    fix = tmp_path / "fix.sh"
    code = main(["local", "--root", str(h200.root), "--policy", str(policy), "--check",
                 "cpu.governor", "--fix-script", str(fix)])
    assert code == 1
    copy = copy_tree(h200.root, tmp_path / "copy")
    before = tree_hash(copy)
    assert run(fix, copy).returncode == 0
    governors = {(copy / f"{CPUFREQ.lstrip('/')}/policy{n}/scaling_governor").read_text()
                 for n in range(16)}
    assert governors == {"schedutil\n"}
    assert "cpufreq.default_governor=schedutil" in grub_line(copy)
    assert "performance" not in grub_line(copy)
    after = main(["local", "--root", str(copy), "--policy", str(policy), "--check",
                  "cpu.governor"])
    assert after == 0
    assert run(tmp_path / "fix.rollback.sh", copy).returncode == 0
    assert tree_hash(copy) == before
