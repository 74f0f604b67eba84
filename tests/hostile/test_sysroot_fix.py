"""A sysroot someone else controls: its fix and rollback never reach outside it.

Each test plants what a tree's owner could (state directories, symlinks swapped in
while the fix runs, device nodes, FIFOs, hard links) and asserts that the canary files
outside the tree never change, that nothing outside is read into output, and that the
fix still does what it can inside.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from auditor.fix import Action, FixPlan, Section, build_fix
from auditor.hosts import DirectoryHost
from auditor.registry import load_checks
from auditor.remedy import Remedy, WriteFile
from auditor.shipped.sysroot_fix import STATE_ENV, state_dir
from tests.hostile.conftest import Canary, audit_cmd, loop_device, run_limited
from tests.support.fixkit import (
    audit_root,
    copy_tree,
    needs_root,
    plan_for,
    policy,
    run,
    tree_hash,
    write_scripts,
)
from tests.support.plant import plant_cpufreq, plant_mrrs, plant_numa
from tests.support.sysroot import Sysroot

pytestmark = needs_root


def test_a_state_directory_planted_in_the_tree_is_never_used(
    h200: Sysroot, tmp_path: Path, canary: Canary
) -> None:
    """The attack of a predictable id and a state directory in the tree: even with the id
    known, the fix keeps its state on the operator's side and never follows the plant."""
    plant_numa(h200)
    plan = build_fix(DirectoryHost(str(h200.root)), audit_root(h200), load_checks(), policy(),
                     fix_id="known-id")
    planted = h200.root / "var/lib/host-auditor/known-id"
    planted.mkdir(parents=True)
    for action in plan.actions:
        (planted / f"{action.id}.old").symlink_to(canary.root / "cron.d" / "x")
        (planted / f"{action.id}.orig").symlink_to(canary.root / "secret")
        (planted / f"{action.id}.absent").symlink_to(canary.root / "cron.d" / "keep")
    (planted / "rollback.sh").write_text("touch /tmp/pwned\n")
    (planted / "created-dirs").write_text(f"{canary.root / 'cron.d'}\0")
    fix, rollback = write_scripts(plan, tmp_path)
    before = tree_hash(h200.root)
    first = run(fix, h200.root)
    assert first.returncode == 0, first.stderr
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"
    assert run(fix, h200.root).returncode == 0
    undone = run(rollback, h200.root)
    assert undone.returncode == 0, undone.stderr
    assert tree_hash(h200.root) == before  # the plant included, untouched
    assert canary.unchanged() and not (canary.root / "cron.d" / "x").exists()
    for output in (first.stdout, undone.stdout):
        assert str(h200.root / "var") not in output  # no file inside the tree is named to run


def test_fix_ids_are_unpredictable(h200: Sysroot) -> None:
    plant_numa(h200)
    report = audit_root(h200)
    host = DirectoryHost(str(h200.root))
    ids = {build_fix(host, report, load_checks(), policy()).fix_id for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{12}", i) for i in ids)


@pytest.mark.parametrize("unsafe", ["world-writable", "symlink", "other-owner"])
def test_a_state_directory_that_is_not_ours_alone_is_refused(
    h200: Sysroot, tmp_path: Path, canary: Canary, unsafe: str
) -> None:
    plant_numa(h200)
    fix, _ = write_scripts(plan_for(h200), tmp_path)
    base = tmp_path / "state"
    if unsafe == "world-writable":
        base.mkdir(mode=0o777)
        os.chmod(base, 0o777)
    elif unsafe == "symlink":
        base.symlink_to(canary.root)
    else:
        base.mkdir(mode=0o700)
        os.chown(base, 65534, 65534)
    before = tree_hash(h200.root)
    result = run_limited(["bash", str(fix), str(h200.root)],
                         env={**os.environ, STATE_ENV: str(base)}, timeout=60)
    assert result.code == 2, result.err
    assert "state directory" in result.one_error_line()
    assert tree_hash(h200.root) == before and canary.unchanged()


def _dir_plan(root: Path) -> FixPlan:
    step = WriteFile("/etc/host-auditor-test/sub/x.conf", "a = 1\n")
    return FixPlan(
        host="gpu-h200-vm", target=f"sysroot:{root}", hostname="gpu-h200-vm", machine_id="",
        root=str(root), fix_id="dirs-test", created="",
        sections=(Section(Remedy("t.t", "s", "write a file", persistent=(step,)),
                          (Action("s001", "persistent", step),)),),
    )


def test_tampered_created_dirs_never_remove_outside(
    h200: Sysroot, tmp_path: Path, canary: Canary, sysroot_fix_state: Path
) -> None:
    """The state is the operator's; still, a created-dirs entry with '..' is not followed."""
    empty = canary.root / "empty"
    empty.mkdir()
    canary.before = tree_hash(canary.root)
    fix, rollback = write_scripts(_dir_plan(h200.root), tmp_path)
    before = tree_hash(h200.root)
    assert run(fix, h200.root).returncode == 0
    assert h200.read("/etc/host-auditor-test/sub/x.conf") == "a = 1\n"
    state = Path(state_dir(os.path.realpath(h200.root), "dirs-test"))
    with open(state / "created-dirs", "ab") as handle:
        handle.write(f"/../../../../../..{empty}\0{empty}\0".encode())
    assert run(rollback, h200.root).returncode == 0
    assert tree_hash(h200.root) == before
    assert empty.is_dir() and canary.unchanged()


def _swapper(stop: threading.Event, real: Path, link_target: str) -> None:
    """Swap a directory (or file) of the tree with a symlink and back, as fast as it can."""
    parked = real.with_name(real.name + ".parked")
    link = real.with_name(real.name + ".link")
    while not stop.is_set():
        try:
            if link.is_symlink():
                link.unlink()
            link.symlink_to(link_target)
            os.rename(real, parked)
            os.rename(link, real)  # the symlink in place
            time.sleep(0.0005)
            os.rename(real, link)
            os.rename(parked, real)  # the real entry back
        except OSError:
            pass


def test_symlinks_swapped_in_while_the_fix_runs_never_send_it_outside(
    h200: Sysroot, tmp_path: Path, canary: Canary
) -> None:
    """A thread swaps the sysctl.d directory and the kernel value file with symlinks to the
    outside (absolute and relative) while the fix and its rollback run again and again."""
    plant_numa(h200)
    h200.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 1\n")
    fix, rollback = write_scripts(plan_for(h200), tmp_path)
    depth = "../" * len(h200.root.parts)
    swaps = [
        (h200.root / "etc/sysctl.d", str(canary.root)),
        (h200.root / "etc/sysctl.d", depth + str(canary.root).lstrip("/")),
        (h200.root / "proc/sys/kernel/numa_balancing", str(canary.root / "secret")),
    ]
    outputs = []
    for real, target in swaps:
        stop = threading.Event()
        thread = threading.Thread(target=_swapper, args=(stop, real, target), daemon=True)
        thread.start()
        try:
            for _ in range(6):
                for script in (fix, rollback):
                    result = run(script, h200.root)
                    assert result.returncode in (0, 1, 2), result.stderr
                    outputs.append(result.stdout + result.stderr)
        finally:
            stop.set()
            thread.join()
    assert canary.unchanged()
    assert not any(canary.secret in text for text in outputs)


def test_hard_link_to_an_outside_file_is_never_written(
    h200: Sysroot, tmp_path: Path, canary: Canary
) -> None:
    plant_numa(h200)
    conf = h200.path("/etc/sysctl.d/60-numa.conf")
    conf.unlink()
    os.link(canary.root / "60-numa.conf", conf)  # the tree's owner links a file it can read
    fix, _ = write_scripts(plan_for(h200), tmp_path)
    result = run(fix, h200.root)
    assert result.returncode == 1 and "other hard links" in result.stderr
    assert canary.unchanged()
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"  # the rest was fixed


@pytest.mark.parametrize("link", ["absolute", "relative"])
def test_the_guard_never_prints_a_file_outside_the_tree(
    h200: Sysroot, tmp_path: Path, canary: Canary, link: str
) -> None:
    plant_numa(h200)
    fix, rollback = write_scripts(plan_for(h200), tmp_path)
    target = str(canary.root / "secret")
    if link == "relative":
        target = "../" * 12 + target.lstrip("/")
    h200.symlink("/etc/hostname", target)
    before = tree_hash(h200.root)
    for script in (fix, rollback):
        result = run(script, h200.root)
        assert result.returncode == 2
        assert canary.secret not in result.stdout + result.stderr
    assert tree_hash(h200.root) == before


def test_device_nodes_and_fifos_where_files_are_expected(
    h200: Sysroot, tmp_path: Path
) -> None:
    """A block device (a loop device standing in for the operator's disk) as a governor file
    and as PCI config space, a FIFO as another governor file: the audit reads none of them,
    the fix writes none of them, and neither hangs."""
    plant_cpufreq(h200)
    plant_mrrs(h200)
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"DISK-CONTENT-5b1e\n" * 4096)
    disk_before = disk.read_bytes()
    with loop_device(disk) as (_device, major, minor):
        governor = h200.path("/sys/devices/system/cpu/cpufreq/policy0/scaling_governor")
        governor.unlink()
        os.mknod(governor, 0o600 | stat.S_IFBLK, os.makedev(major, minor))
        fifo = h200.path("/sys/devices/system/cpu/cpufreq/policy1/scaling_governor")
        fifo.unlink()
        os.mkfifo(fifo)
        configs: list[Path | None] = [p for p in h200.root.glob("sys/devices/pci*/*/config")
                                      if "06.0" in str(p)]
        [config] = configs or [None]
        if config is not None:
            config.unlink()
            os.mknod(config, 0o600 | stat.S_IFBLK, os.makedev(major, minor))
        report = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json"),
                             timeout=60)
        assert report.code == 1, report.err
        assert "DISK-CONTENT" not in report.out
        document = json.loads(report.out)
        assert document["summary"]["error"] == 0
        applied = run_limited(audit_cmd("local", "--root", str(h200.root), "--apply", "--yes",
                                        "--check", "cpu.governor", "--check", "pcie.mrrs",
                                        "--format", "json"), timeout=120)
        assert applied.code in (0, 1), applied.err
        assert "DISK-CONTENT" not in applied.out + applied.err
    assert disk.read_bytes() == disk_before
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    fixed = h200.read("/sys/devices/system/cpu/cpufreq/policy2/scaling_governor")
    assert fixed == "performance\n"  # the regular files were fixed


def test_apply_tells_the_operator_to_run_nothing_inside_the_tree(
    h200: Sysroot, tmp_path: Path
) -> None:
    plant_numa(h200)
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--apply", "--yes",
                                   "--check", "numa.balancing"), timeout=60)
    assert result.code == 0, result.err
    [undo] = re.findall(r"undo with: bash (\S+)", result.err)
    assert not Path(undo).resolve().is_relative_to(h200.root.resolve())
    assert not (h200.root / "var/lib/host-auditor").exists()
    assert run(Path(undo)).returncode == 0
    assert h200.read("/proc/sys/kernel/numa_balancing") == "1\n"


def test_the_script_needs_no_sysroot_state_and_a_copy_is_fixed_alike(
    h200: Sysroot, tmp_path: Path
) -> None:
    """`bash fix.sh COPY` fixes another copy; each copy keeps its own state (keyed by its
    real path), so rolling one back leaves the other fixed."""
    plant_numa(h200)
    fix, rollback = write_scripts(plan_for(h200), tmp_path)
    copy = copy_tree(h200.root, tmp_path / "copy")
    assert run(fix, h200.root).returncode == 0 and run(fix, copy).returncode == 0
    assert run(rollback, copy).returncode == 0
    assert (copy / "proc/sys/kernel/numa_balancing").read_text() == "1\n"
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"
    assert run(rollback, h200.root).returncode == 0
