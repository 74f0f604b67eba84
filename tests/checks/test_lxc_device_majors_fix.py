"""lxc.device_majors: its fix rewrites the running config's allow rules."""

from __future__ import annotations

from pathlib import Path

from tests.support.factories import make_report
from tests.support.fixkit import (
    EVIL,
    assert_idempotent_and_reversible,
    copy_tree,
    fix_cycle,
    needs_root,
    plan_for,
    run,
    tree_hash,
    write_scripts,
)
from tests.support.plant import LXC_CONFIG, plant_lxc
from tests.support.sysroot import Sysroot


@needs_root
def test_stale_major_rewritten_in_main_section_only(h200: Sysroot, tmp_path: Path) -> None:
    findings = plant_lxc(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path, make_report(findings))
    expected = LXC_CONFIG.replace("c 509:* rwm", "c 238:* rwm", 1)
    assert (copy / "etc/pve/lxc/101.conf").read_text() == expected
    assert expected.count("c 509:* rwm") == 1  # the snapshot section keeps its rule
    text = fix.read_text()
    assert "#   pct reboot 101" in text
    assert "devN: entries" in text
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_hostile_config_name_runs_nothing(h200: Sysroot, tmp_path: Path) -> None:
    name = f"/etc/pve/lxc/1\n{EVIL}'.conf"
    findings = plant_lxc(h200, path=name, container=f"1{EVIL}")
    work = tmp_path / "work"
    work.mkdir()
    plan = plan_for(h200, make_report(findings))
    fix, rollback = write_scripts(plan, tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    before = tree_hash(copy)
    assert run(fix, copy, cwd=work).returncode == 0
    assert (copy / name.lstrip("/")).read_text() == LXC_CONFIG.replace("509", "238", 1)
    assert run(fix, copy, cwd=work).returncode == 0
    assert run(rollback, copy, cwd=work).returncode == 0
    assert tree_hash(copy) == before
    assert list(work.iterdir()) == []


@needs_root
def test_missing_rule_is_added_to_the_main_section_with_the_real_check(
    h200: Sysroot, tmp_path: Path
) -> None:
    from auditor.model import Status
    from tests.support.fixkit import audit_root, statuses

    config = LXC_CONFIG.replace("lxc.cgroup2.devices.allow: c 509:* rwm\n", "", 1)
    h200.write("/etc/pve/lxc/101.conf", config)
    assert statuses(audit_root(h200), "lxc.device_majors") == {Status.FAIL}
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    main, _, snapshot = (copy / "etc/pve/lxc/101.conf").read_text().partition("\n[")
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in main
    assert snapshot == config.partition("\n[")[2]
    assert statuses(audit_root(copy), "lxc.device_majors") <= {Status.PASS, Status.SKIP}
    assert_idempotent_and_reversible(fix, rollback, copy, before)
