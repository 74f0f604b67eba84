"""numa.balancing remediation on the real capture with the problem planted."""

from __future__ import annotations

from pathlib import Path

from auditor.model import Status
from tests.support.fixkit import (
    assert_idempotent_and_reversible,
    audit_root,
    fix_cycle,
    needs_root,
    plan_for,
    statuses,
)
from tests.support.plant import add_node
from tests.support.sysroot import Sysroot


def plant(root: Sysroot) -> None:
    add_node(root, 1)
    root.write("/proc/sys/kernel/numa_balancing", "1\n")


@needs_root
def test_sysctl_d_file_setting_1_is_edited_and_runtime_set(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    h200.write("/etc/sysctl.d/50-numa.conf", "# tuned by hand\nkernel.numa_balancing = 1\n")
    assert statuses(audit_root(h200), "numa.balancing") == {Status.FAIL}
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert (copy / "proc/sys/kernel/numa_balancing").read_text() == "0\n"
    assert (copy / "etc/sysctl.d/50-numa.conf").read_text() == (
        "# tuned by hand\nkernel.numa_balancing = 0\n"
    )
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_nothing_sets_it_so_a_drop_in_is_written(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    drop_in = copy / "etc/sysctl.d/99-zz-host-auditor-numa.conf"
    assert drop_in.read_text() == "kernel.numa_balancing = 0\n"
    assert oct(drop_in.stat().st_mode & 0o777) == "0o644"
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_off_now_but_not_at_boot_gets_only_the_drop_in(h200: Sysroot, tmp_path: Path) -> None:
    add_node(h200, 1)
    h200.write("/proc/sys/kernel/numa_balancing", "0\n")
    assert statuses(audit_root(h200), "numa.balancing") == {Status.WARN}
    plan, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    [section] = [s for s in plan.sections if s.remedy.check == "numa.balancing"]
    assert [a.phase for a in section.actions] == ["persistent"]
    assert (copy / "etc/sysctl.d/99-zz-host-auditor-numa.conf").read_text() == (
        "kernel.numa_balancing = 0\n"
    )
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_sysctl_conf_the_boot_does_not_read_is_changed_too(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    original = h200.read("/etc/sysctl.conf")
    h200.write("/etc/sysctl.conf", original + "kernel.numa_balancing=1\n")
    h200.write("/etc/sysctl.d/zz-late.conf", "kernel.numa_balancing = 0\n")
    plan, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    [section] = [s for s in plan.sections if s.remedy.check == "numa.balancing"]
    assert any("not read at boot" in note for note in section.remedy.notes)
    assert (copy / "etc/sysctl.conf").read_text() == original + "kernel.numa_balancing=0\n"
    assert not (copy / "etc/sysctl.d/99-zz-host-auditor-numa.conf").exists()
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_vendor_file_is_masked_from_etc(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    h200.write("/usr/lib/sysctl.d/50-numa.conf", "kernel.numa_balancing = 1\nvm.x = 2\n")
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert (copy / "usr/lib/sysctl.d/50-numa.conf").read_text().startswith(
        "kernel.numa_balancing = 1"
    )
    assert (copy / "etc/sysctl.d/50-numa.conf").read_text() == (
        "kernel.numa_balancing = 0\nvm.x = 2\n"
    )
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


def test_passing_host_gets_no_numa_steps(h200: Sysroot) -> None:
    plan = plan_for(h200)
    assert not [s for s in plan.sections if s.remedy.check == "numa.balancing"]


@needs_root
def test_line_changed_since_audit_is_left_alone(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    h200.write("/etc/sysctl.d/50-numa.conf", "kernel.numa_balancing = 1\n")
    from tests.support.fixkit import copy_tree, run, write_scripts

    plan = plan_for(h200)
    fix, _ = write_scripts(plan, tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    (copy / "etc/sysctl.d/50-numa.conf").write_text("kernel.numa_balancing = 2\n")
    result = run(fix, copy)
    assert result.returncode == 1
    assert "changed since the audit" in result.stderr
    assert (copy / "etc/sysctl.d/50-numa.conf").read_text() == "kernel.numa_balancing = 2\n"


@needs_root
def test_absolute_symlink_in_sysroot_is_followed_inside_it(h200: Sysroot, tmp_path: Path) -> None:
    plant(h200)
    original = h200.read("/etc/sysctl.conf")
    h200.write("/etc/sysctl.conf", original + "kernel.numa_balancing = 1\n")
    h200.symlink("/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.conf")
    live = Path("/etc/sysctl.conf")
    live_bytes = live.read_bytes() if live.exists() else None
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert (copy / "etc/sysctl.conf").read_text() == original + "kernel.numa_balancing = 0\n"
    assert (live.read_bytes() if live.exists() else None) == live_bytes
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_symlink_leading_out_of_the_sysroot_is_refused(h200: Sysroot, tmp_path: Path) -> None:
    from tests.support.fixkit import copy_tree, run, write_scripts

    plant(h200)
    h200.write("/etc/sysctl.d/50-numa.conf", "kernel.numa_balancing = 1\n")
    fix, _ = write_scripts(plan_for(h200), tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "50-numa.conf").write_text("kernel.numa_balancing = 1\n")
    import shutil

    shutil.rmtree(copy / "etc/sysctl.d")
    (copy / "etc/sysctl.d").symlink_to(outside)
    result = run(fix, copy)
    assert result.returncode == 2 and "changed since the audit" in result.stderr
    assert (outside / "50-numa.conf").read_text() == "kernel.numa_balancing = 1\n"
    assert (copy / "proc/sys/kernel/numa_balancing").read_text() == "1\n"  # nothing changed


@needs_root
def test_setting_after_blank_lines_is_found_on_its_own_line(h200: Sysroot, tmp_path: Path
                                                           ) -> None:
    plant(h200)
    h200.write("/etc/sysctl.d/50-numa.conf", "\n\n# numa\nkernel.numa_balancing=1\n")
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert (copy / "etc/sysctl.d/50-numa.conf").read_text() == (
        "\n\n# numa\nkernel.numa_balancing=0\n")
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)
