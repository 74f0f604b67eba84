"""A tenant who owns a sysroot acts between the fix and its rollback (run as root).

The fix keeps each file's bytes, owner, mode and inode; the rollback writes back only onto
the inode the fix left, and a file removed since is made again as its old owner without
setuid or setgid bits. A backup cut short (the disk full while it was written) is never
taken for a whole one.
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from auditor.fix import Action, FixPlan, Section
from auditor.remedy import AppendLine, Remedy, Step, WriteFile
from tests.support.fixkit import needs_root, run, tree_hash, write_scripts
from tests.support.sysroot import Sysroot

pytestmark = [needs_root, pytest.mark.root]

TENANT = 65534  # nobody: the sysroot's owner, unprivileged

#: A real program, and a line a config parser would take, so the fix edits it.
PAYLOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
const char line[] = "\nkernel.numa_balancing = 1\n";
int main(void) { printf("euid=%d\n", (int)geteuid()); return line[0] == 0; }
"""


def _plan(root: Path, *steps: Step, fix_id: str = "tenant-test") -> FixPlan:
    actions = tuple(Action(f"s{i:03d}", "persistent", step) for i, step in enumerate(steps, 1))
    return FixPlan(
        host="gpu-h200-vm", target=f"sysroot:{root}", hostname="gpu-h200-vm", machine_id="",
        root=str(root), fix_id=fix_id, created="",
        sections=(Section(Remedy("t.t", "s", "edit files", persistent=steps), actions),),
    )


def _compile(where: Path) -> bytes:
    """Compile the payload (a real ELF program) and return its bytes."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the setuid payload")
    source = where / "payload.c"
    source.write_text(PAYLOAD_C)
    binary = where / "payload"
    subprocess.run([compiler, "-o", str(binary), str(source)], check=True)
    assert subprocess.run([str(binary)], capture_output=True, text=True,
                          check=True).stdout == f"euid={os.geteuid()}\n"
    return binary.read_bytes()


def _tenant_dir(h200: Sysroot) -> Path:
    """A directory of the tree its tenant owns (and so may remove files from)."""
    tenant = h200.path("/opt/tenant")
    tenant.mkdir(parents=True)
    os.chown(tenant, TENANT, TENANT)
    return tenant


def _privileged(root: Path) -> list[str]:
    """Return every setuid or setgid file of the tree owned by root (or root's group)."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode) and (
                    (st.st_mode & stat.S_ISUID and st.st_uid == 0)
                    or (st.st_mode & stat.S_ISGID and st.st_gid == 0)):
                found.append(os.path.join(dirpath, name))
    return found


@pytest.mark.parametrize("owner", [TENANT, 0])
def test_a_file_removed_after_the_fix_is_never_made_a_setuid_root_program(
    h200: Sysroot, tmp_path: Path, owner: int
) -> None:
    """The critical attack: the tenant's setuid program (its own, harmless) is edited by
    the fix, then removed; the rollback, as root, must not make it again as root with its
    setuid bit (nor keep a setuid bit on a file made again, whoever owned it)."""
    payload = _compile(tmp_path)
    tenant = _tenant_dir(h200)
    program = tenant / "tool"
    program.write_bytes(payload)
    os.chown(program, owner, owner)
    os.chmod(program, 0o6755)
    privileged_before = _privileged(h200.root)
    fix, rollback = write_scripts(_plan(h200.root, AppendLine("/opt/tenant/tool", "# x")),
                                  tmp_path)
    done = run(fix, h200.root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert program.read_bytes() == payload + b"\n# x\n"
    program.unlink()  # the tenant owns the directory: it may remove the file
    undone = run(rollback, h200.root)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    st = os.lstat(program)
    assert program.read_bytes() == payload  # the bytes are back...
    assert (st.st_uid, st.st_gid) == (owner, owner)  # ...as their old owner's...
    assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID)  # ...without setuid or setgid
    assert "bits dropped" in undone.stdout
    assert _privileged(h200.root) == [p for p in privileged_before if p != str(program)]


def test_a_file_replaced_after_the_fix_is_left_alone(h200: Sysroot, tmp_path: Path) -> None:
    """The tenant removes the edited file and puts its own setuid program there: the
    rollback writes nothing into it, changes none of its bits, and says why (exit 1)."""
    payload = _compile(tmp_path)
    tenant = _tenant_dir(h200)
    conf = tenant / "tool.conf"
    conf.write_text("a = 1\n")
    os.chown(conf, TENANT, TENANT)
    fix, rollback = write_scripts(_plan(h200.root, AppendLine("/opt/tenant/tool.conf", "b = 2")),
                                  tmp_path)
    assert run(fix, h200.root).returncode == 0
    conf.unlink()
    conf.write_bytes(payload)
    os.chown(conf, TENANT, TENANT)
    os.chmod(conf, 0o4755)
    before = tree_hash(h200.root)
    undone = run(rollback, h200.root)
    assert undone.returncode == 1
    assert "replaced since the fix" in undone.stderr and "not restored" in undone.stderr
    assert tree_hash(h200.root) == before
    st = os.lstat(conf)
    assert st.st_uid == TENANT and conf.read_bytes() == payload


def test_a_file_the_fix_made_is_removed_only_while_it_is_that_file(
    h200: Sysroot, tmp_path: Path
) -> None:
    """A file that did not exist before the fix: the rollback removes the fix's own file,
    never one the tenant put at its path since."""
    _tenant_dir(h200)
    fix, rollback = write_scripts(
        _plan(h200.root, WriteFile("/opt/tenant/new.conf", "x = 1\n")), tmp_path)
    assert run(fix, h200.root).returncode == 0
    made = h200.path("/opt/tenant/new.conf")
    made.unlink()
    made.write_text("the tenant's\n")
    undone = run(rollback, h200.root)
    assert undone.returncode == 1 and "not removed" in undone.stderr
    assert made.read_text() == "the tenant's\n"


def test_a_backup_cut_short_is_never_trusted(h200: Sysroot, tmp_path: Path) -> None:
    """The disk fills while the backup is written (a file-size limit cuts the write, as
    ENOSPC would): the fix fails before changing the file; a second run takes the backup
    again instead of trusting the cut one, and the rollback restores every byte."""
    big = h200.write("/etc/big.conf", "".join(f"key{i} = {i}\n" for i in range(120_000)))
    assert big.stat().st_size > 1 << 20
    fix, rollback = write_scripts(_plan(h200.root, AppendLine("/etc/big.conf", "last = 1"),
                                        fix_id="cut-test"), tmp_path)
    before = tree_hash(h200.root)

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, 512 << 10))

    cut = subprocess.run(["bash", str(fix), str(h200.root)], capture_output=True, text=True,
                         check=False, timeout=60, preexec_fn=small_disk)
    assert cut.returncode == 1, cut.stdout + cut.stderr
    assert tree_hash(h200.root) == before  # nothing changed without a whole backup
    done = run(fix, h200.root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert big.read_text().endswith("last = 1\n")
    undone = run(rollback, h200.root)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(h200.root) == before


def test_the_booted_machines_bash_fix_never_trusts_a_cut_backup(h200: Sysroot,
                                                                 tmp_path: Path) -> None:
    """The same in the bash engine, with a real full disk: its state directory is a tmpfs
    too small for the backup. The fix stops before the change, leaves no backup under the
    name a re-run trusts; with room again, a re-run backs the file up whole, and the
    rollback restores every byte."""
    from tests.support import livefix
    from tests.support.fixkit import live_plan

    if livefix.available():
        pytest.fail(livefix.available())  # as root, the bash engine runs here
    big = h200.write("/etc/big.conf", "".join(f"key{i} = {i}\n" for i in range(120_000)))
    plan = live_plan(_plan(h200.root, AppendLine("/etc/big.conf", "last = 1"),
                           fix_id="cut-bash"), h200.root)
    fix, rollback = write_scripts(plan, tmp_path)
    work = tmp_path / "live"
    state = work / "state"
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "cut-state",
                    str(state)], check=True)
    try:
        before = tree_hash(h200.root)
        cut = livefix.run_live(fix, h200.root, plan, work)
        assert cut.process.returncode != 0, cut.output
        assert "No space left on device" in cut.output
        assert tree_hash(h200.root) == before  # nothing changed without a whole backup
        kept = [name for name in os.listdir(state) if name != "lost+found"]
        [fix_state] = kept
        names = os.listdir(state / fix_state)
        assert not any(name.endswith(".orig") and not name.startswith(".new.")
                       for name in names), names
        subprocess.run(["mount", "-o", "remount,size=16m", str(state)], check=True)
        done = livefix.run_live(fix, h200.root, plan, work)
        assert done.process.returncode == 0, done.output
        assert big.read_text().endswith("last = 1\n")
        [orig] = [name for name in os.listdir(state / fix_state) if name.endswith(".orig")
                  and not name.startswith(".new.")]
        assert (state / fix_state / orig).read_bytes() == big.read_bytes()[:-len("last = 1\n")]
        undone = livefix.run_live(rollback, h200.root, plan, work)
        assert undone.process.returncode == 0, undone.output
        assert tree_hash(h200.root) == before
        assert livefix.leftovers(work) == []
    finally:
        subprocess.run(["umount", str(state)], check=False)
