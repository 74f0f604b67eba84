"""The tuner end to end: plan, scripts, guard, hostile input, and the audit local options."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.cli.fix import default_rollback_path
from auditor.fix import Action, FixPlan, Section
from auditor.model import Status
from auditor.remedy import Remedy, WriteFile
from tests.support.fixkit import (
    EVIL,
    assert_idempotent_and_reversible,
    audit_root,
    copy_tree,
    fix_cycle,
    needs_root,
    plan_for,
    run,
    statuses,
    tree_hash,
    write_scripts,
)
from tests.support.plant import (
    GPU,
    mrrs,
    plant_cpufreq,
    plant_cstates,
    plant_grub,
    plant_lxc,
    plant_mrrs,
    plant_numa,
    plant_old_kernel,
)
from tests.support.sysroot import Sysroot

FIXED_CHECKS = ("numa.balancing", "cpu.governor", "cpu.cstates", "pcie.mrrs",
                "lxc.device_majors")


def plant_all(root: Sysroot) -> None:
    plant_numa(root)
    plant_cpufreq(root)
    plant_cstates(root)
    plant_mrrs(root)
    plant_lxc(root)
    plant_old_kernel(root)
    plant_grub(root)


@needs_root
def test_every_planted_problem_fixed_then_rolled_back(h200: Sysroot, tmp_path: Path) -> None:
    plant_all(h200)
    before_audit = audit_root(h200)
    for check in (*FIXED_CHECKS, "kernel.version"):
        assert Status.FAIL in statuses(before_audit, check), check
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    after = audit_root(copy)
    for check in FIXED_CHECKS:
        assert statuses(after, check) <= {Status.PASS, Status.SKIP}, (check, after.findings)
    assert Status.FAIL in statuses(after, "kernel.version")  # opt-in: commented out
    assert mrrs(Sysroot(copy)) == 4096
    assert_idempotent_and_reversible(fix, rollback, copy, before)
    assert mrrs(Sysroot(copy)) == 512


@needs_root
def test_numa_fixed_end_to_end_with_the_real_check(h200: Sysroot, tmp_path: Path) -> None:
    plant_numa(h200)
    _, fix, rollback, copy, before = fix_cycle(h200, tmp_path)
    assert statuses(audit_root(copy), "numa.balancing") == {Status.PASS}
    assert_idempotent_and_reversible(fix, rollback, copy, before)


@needs_root
def test_hostile_sysroot_runs_nothing_it_should_not(h200: Sysroot, tmp_path: Path) -> None:
    plant_all(h200)
    config = h200.read("/etc/pve/lxc/101.conf")
    h200.write(f"/etc/pve/lxc/102\n{EVIL}.conf", config)
    h200.write(f"/etc/pve/lxc/103{EVIL}'.conf", config)
    h200.write(f"/var/lib/lxc/web{EVIL}\nx/config", config.replace(": ", " = "))
    h200.symlink(f"/sys/bus/pci/devices/{EVIL}", f"../../../devices/pci0000:00/{GPU}")
    h200.symlink("/sys/bus/pci/devices/not-an-address", f"../../../devices/pci0000:00/{GPU}")
    devices = h200.path("/proc/devices").read_bytes()
    h200.write("/proc/devices", devices + b"\xff\xfe garbage\n509 " + EVIL.encode() +
               b"\nnot-a-number nvidia-uvm\n\x00\x01\n")
    report = audit_root(h200)
    plan = plan_for(h200, report)
    hostile = [s for s in plan.sections if "pwned" in s.remedy.subject]
    assert len(hostile) == 3, plan.summary()  # the hostile configs are fixed too
    work = tmp_path / "work"
    work.mkdir()
    fix, rollback = write_scripts(plan, tmp_path)  # bash -n and shellcheck pass
    copy = copy_tree(h200.root, tmp_path / "copy")
    before = tree_hash(copy)
    assert run(fix, copy, cwd=work).returncode == 0
    fixed = (copy / f"etc/pve/lxc/102\n{EVIL}.conf").read_text()
    assert "c 238:* rwm" in fixed
    assert run(fix, copy, cwd=work).returncode == 0
    assert run(rollback, copy, cwd=work).returncode == 0
    assert tree_hash(copy) == before
    assert list(work.iterdir()) == []
    assert not list(copy.rglob("pwned-marker"))


@needs_root
def test_refuses_a_sysroot_of_another_host(h200: Sysroot, tmp_path: Path) -> None:
    plant_numa(h200)
    fix, rollback = write_scripts(plan_for(h200), tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    (copy / "etc/hostname").write_text("some-other-host\n")
    before = tree_hash(copy)
    for script in (fix, rollback):
        result = run(script, copy)
        assert result.returncode == 2
        assert "not the audited gpu-h200-vm" in result.stderr
    assert tree_hash(copy) == before
    (copy / "etc/hostname").write_text("gpu-h200-vm\n")
    assert run(fix, copy).returncode == 0  # the same copy, named right, is fixed
    assert tree_hash(copy) != before


@needs_root
def test_refuses_another_machine_id(h200: Sysroot, tmp_path: Path) -> None:
    plant_numa(h200)
    h200.write("/etc/machine-id", "0123456789abcdef0123456789abcdef\n")
    fix, _ = write_scripts(plan_for(h200), tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    (copy / "etc/machine-id").write_text("fedcba9876543210fedcba9876543210\n")
    before = tree_hash(copy)
    result = run(fix, copy)
    assert result.returncode == 2 and "machine-id" in result.stderr
    assert tree_hash(copy) == before


def test_live_script_refuses_another_hostname(tmp_path: Path) -> None:
    marker = tmp_path / "written"
    step = WriteFile(str(marker), "x\n")
    plan = FixPlan(
        host="elsewhere", target="ssh://elsewhere", hostname=f"not-{socket.gethostname()}",
        machine_id="", root="", fix_id="guard-test", created="",
        sections=(Section(Remedy("t.t", "s", "write a file", persistent=(step,)),
                          (Action("s001", "persistent", step),)),),
    )
    fix, _ = write_scripts(plan, tmp_path)
    result = run(fix)
    assert result.returncode == 2
    assert "not the audited" in result.stderr or (os.geteuid() != 0 and "root" in result.stderr)
    assert not marker.exists()
    assert not Path("/var/lib/host-auditor/guard-test").exists()


def test_default_rollback_path() -> None:
    assert default_rollback_path("out/fix.sh") == "out/fix.rollback.sh"
    assert default_rollback_path("fix") == "fix.rollback.sh"


@needs_root
def test_cli_dry_run_writes_both_scripts_and_changes_nothing(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_numa(h200)
    before = tree_hash(h200.root)
    code = main(["local", "--root", str(h200.root), "--fix-script", str(tmp_path / "fix.sh")])
    assert code == 1
    assert (tmp_path / "fix.sh").read_text().startswith("#!/usr/bin/env bash")
    assert os.access(tmp_path / "fix.rollback.sh", os.X_OK)
    assert "dry run" in capsys.readouterr().err
    assert tree_hash(h200.root) == before


@needs_root
def test_cli_apply_fixes_and_shows_before_and_after(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str], sysroot_fix_state: Path
) -> None:
    plant_numa(h200)
    out = tmp_path / "after.json"
    code = main(["local", "--root", str(h200.root), "--apply", "--yes", "--check",
                 "numa.balancing", "--format", "json", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "before -> after" in err and "fail -> pass" in err
    assert json.loads(out.read_text())["summary"]["fail"] == 0
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"
    # The state and the rollback are kept on this machine's side, never in the sysroot.
    assert not (h200.root / "var/lib/host-auditor").exists()
    [kept] = re.findall(r"undo with: bash (\S+)", err)
    assert Path(kept).is_file() and Path(kept).parent.parent.parent == sysroot_fix_state
    assert not Path(kept).resolve().is_relative_to(h200.root.resolve())
    assert run(Path(kept)).returncode == 0
    assert h200.read("/proc/sys/kernel/numa_balancing") == "1\n"
    assert not Path(kept).exists() and not (h200.root / "var/lib/host-auditor").exists()


def test_cli_apply_without_a_terminal_needs_yes(
    h200: Sysroot, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_numa(h200)
    before = tree_hash(h200.root)
    assert main(["local", "--root", str(h200.root), "--apply"]) == 2
    assert "--yes" in capsys.readouterr().err
    assert tree_hash(h200.root) == before


def test_cli_refuses_a_tar_capture_for_a_fix(
    h200: Sysroot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = h200.tarball(tmp_path / "capture.tar.gz")
    code = main(["local", "--root", str(capture), "--fix-script", str(tmp_path / "fix.sh")])
    assert code == 2
    assert "unpack the capture" in capsys.readouterr().err
    assert not (tmp_path / "fix.sh").exists()


@pytest.mark.root
@needs_root
def test_live_script_on_this_machine_fixes_and_rolls_back_a_file(tmp_path: Path) -> None:
    from auditor.remedy import RunCommand

    hostname = Path("/proc/sys/kernel/hostname").read_text().strip()
    machine_id = Path("/etc/machine-id").read_text().strip() if Path(
        "/etc/machine-id").exists() else ""
    target = tmp_path / "etc" / "conf.d" / "x.conf"
    steps = (WriteFile(str(target), "a = 1\n"),
             RunCommand(("touch", str(tmp_path / "ran")), after=(0,),
                        undo=("touch", str(tmp_path / "undone"))))
    fix_id = f"test-{os.getpid()}"
    plan = FixPlan(
        host=hostname, target="local", hostname=hostname, machine_id=machine_id, root="",
        fix_id=fix_id, created="",
        sections=(Section(Remedy("t.t", "s", "write a file", persistent=steps),
                          (Action("s001", "persistent", steps[0]),
                           Action("s002", "persistent", steps[1], after=("s001",)))),),
    )
    fix, rollback = write_scripts(plan, tmp_path)
    state = Path("/var/lib/host-auditor") / fix_id
    existed = Path("/var/lib/host-auditor").exists()
    try:
        result = run(fix)
        assert result.returncode == 0, result.stderr
        assert target.read_text() == "a = 1\n" and (tmp_path / "ran").exists()
        (tmp_path / "ran").unlink()
        assert run(fix).returncode == 0
        assert not (tmp_path / "ran").exists()  # nothing changed, so the command did not run
        assert run(rollback).returncode == 0
        assert not target.exists() and not (tmp_path / "etc").exists()
        assert (tmp_path / "undone").exists()
        assert not state.exists()
        assert Path("/var/lib/host-auditor").exists() == existed
    finally:
        if state.exists():
            run(rollback)


@needs_root
def test_the_scripts_read_as_what_they_do(h200: Sysroot, tmp_path: Path) -> None:
    """Human lines say what changes in plain words; escaping only where a value holds a
    control character; the machine-id only as a salted hash."""
    plant_numa(h200)
    plant_mrrs(h200)
    h200.write("/etc/machine-id", "0123456789abcdef0123456789abcdef\n")
    plan = plan_for(h200)
    fix, rollback = write_scripts(plan, tmp_path)
    script = fix.read_text()
    assert "0123456789abcdef0123456789abcdef" not in script + rollback.read_text()
    assert "#     /etc/sysctl.d/60-numa.conf:1: kernel.numa_balancing = 1 -> " \
        "kernel.numa_balancing = 0" in script
    assert "#     0000:00:06.0 MaxReadReq -> 4096 bytes" in script
    copy = copy_tree(h200.root, tmp_path / "copy")
    done = run(fix, copy)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "host-auditor: /etc/sysctl.d/60-numa.conf:1: kernel.numa_balancing = 1 -> " \
        "kernel.numa_balancing = 0" in lines
    assert "host-auditor: 0000:00:06.0 MaxReadReq 512 -> 4096 bytes" in lines
    assert "host-auditor: /proc/sys/kernel/numa_balancing: 1 -> 0" in lines
    assert run(rollback, copy).returncode == 0


@pytest.mark.root
@needs_root
def test_the_live_rollback_is_a_here_document_no_value_can_end(tmp_path: Path) -> None:
    """A value holding newlines, the delimiter's prefix and $(...) stays data: the fix keeps
    the rollback byte for byte, and both run on this machine."""
    hostname = Path("/proc/sys/kernel/hostname").read_text().strip()
    target = tmp_path / "conf.d" / "x\x1b[2J\n.conf"
    content = f"a\nHOST_AUDITOR_ROLLBACK\nHOST_AUDITOR_ROLLBACK_0\n{EVIL}\n\x1b[2J\n"
    step = WriteFile(str(target), content)
    fix_id = f"heredoc-{os.getpid()}"
    plan = FixPlan(host=hostname, target="local", hostname=hostname, machine_id="", root="",
                   fix_id=fix_id, created="",
                   sections=(Section(Remedy("t.t", "s", "write a file", persistent=(step,)),
                                     (Action("s001", "persistent", step),)),))
    fix, rollback = write_scripts(plan, tmp_path)
    assert "write_rollback() {\n    cat <<'HOST_AUDITOR_ROLLBACK_" in fix.read_text()
    state = Path("/var/lib/host-auditor") / fix_id
    try:
        result = run(fix, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert target.read_text() == content
        assert (state / "rollback.sh").read_text() == rollback.read_text()
        assert "$'" in result.stdout  # the odd name is shown escaped, not sent raw
        assert "\x1b" not in result.stdout
        assert run(state / "rollback.sh", cwd=tmp_path).returncode == 0
        assert not target.exists() and not list(tmp_path.rglob("pwned-marker"))
    finally:
        if state.exists():
            run(rollback)
