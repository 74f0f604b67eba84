"""A directory sysroot with mounts inside it, swapped for ``/``, or far larger than a host.

The mount tests run each command in a private mount namespace of its own (``unshare -m``),
so what they mount (the live /proc, a tracefs pipe, a directory outside the tree) is
gone with it. The audit and the fix stay on the tree's own mounts; the tree is the
directory opened once, whatever its name names later; and a directory sysroot is read
with the caps of a tar capture.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.fix import Action, FixPlan, Section
from auditor.hosts import local
from auditor.remedy import Remedy, WriteFile
from tests.hostile.conftest import Canary, audit_cmd, run_limited
from tests.support.fixkit import needs_root, plan_for, run, write_scripts
from tests.support.plant import plant_numa
from tests.support.sysroot import Sysroot

pytestmark = [needs_root, pytest.mark.root]


def _namespace(commands: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run shell commands in a private mount namespace of their own (root)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("no mount namespaces here")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", commands],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_the_live_proc_mounted_in_the_tree_is_never_read(h200: Sysroot) -> None:
    """An image chroot with the live /proc mounted in it: neither the auditor's own
    /proc/self/environ nor the live kernel's command line reach the report."""
    marker = "HOST-AUDITOR-ENV-CANARY-4e1d"
    proc = h200.path("/proc")
    probe = (f"from auditor.hosts import DirectoryHost\n"
             f"host = DirectoryHost({str(h200.root)!r})\n"
             "for path in ('/proc/self/environ', '/proc/cmdline', '/proc/self/ns/pid'):\n"
             "    try:\n"
             "        print(path, host.read_bytes(path)[:4000])\n"
             "    except OSError as exc:\n"
             "        print(path, 'refused', exc)\n")
    result = _namespace(
        f"mount -t proc proc {shlex.quote(str(proc))}\n"
        f"export MARKER={marker}\n"
        f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}\n"
        f"{shlex.quote(audit_cmd()[0])} local --root {shlex.quote(str(h200.root))} "
        "--format json || true\n")
    assert result.returncode == 0, result.stderr
    assert marker not in result.stdout + result.stderr
    live_cmdline = Path("/proc/cmdline").read_text().strip()
    assert live_cmdline not in result.stdout
    assert result.stdout.count("refused") == 3, result.stdout
    assert "mount point" in result.stdout


def test_a_fix_never_writes_through_a_mount_in_the_tree(
    h200: Sysroot, tmp_path: Path, canary: Canary
) -> None:
    """The directory a fix writes in is a bind mount of a directory outside the tree (it
    holds a file of the same name): the fix is refused before any change (exit 2), and
    nothing outside changes."""
    plant_numa(h200)
    fix, _rollback = write_scripts(plan_for(h200), tmp_path)
    sysctl_d = h200.path("/etc/sysctl.d")
    result = _namespace(
        f"mount --bind {shlex.quote(str(canary.root))} {shlex.quote(str(sysctl_d))}\n"
        f"bash {shlex.quote(str(fix))} {shlex.quote(str(h200.root))} || echo rc=$?\n")
    assert "rc=2" in result.stdout, result.stdout + result.stderr
    assert "/etc/sysctl.d is a mount point" in result.stderr
    assert canary.unchanged()
    assert h200.read("/proc/sys/kernel/numa_balancing") == "1\n"


def test_a_tracefs_pipe_in_the_tree_does_not_hang_the_audit(h200: Sysroot) -> None:
    """trace_pipe blocks a reader until there is trace data: bind-mounted where a check
    reads, or read inside a tree that is itself on tracefs, it never holds the audit."""
    plant_numa(h200)
    tracing = h200.root.parent / "tracing"
    tracing.mkdir()
    value = h200.path("/proc/sys/kernel/numa_balancing")
    probe = ("from auditor.shipped.treeio import Tree\n"
             f"tree = Tree({str(tracing)!r})\n"
             "try:\n"
             "    tree.read('/trace_pipe', 100)\n"
             "except OSError as exc:\n"
             "    print('trace_pipe', exc.strerror)\n")
    try:
        result = _namespace(
            f"mount -t tracefs nodev {shlex.quote(str(tracing))} || exit 77\n"
            f"mount --bind {shlex.quote(str(tracing / 'trace_pipe'))} "
            f"{shlex.quote(str(value))}\n"
            f"timeout 60 {shlex.quote(audit_cmd()[0])} local --root "
            f"{shlex.quote(str(h200.root))} --format json --check numa.balancing "
            "|| echo rc=$?\n"
            f"timeout 20 {shlex.quote(sys.executable)} -c {shlex.quote(probe)}\n",
            timeout=120)
    finally:
        tracing.rmdir()
    if result.returncode == 77:
        pytest.skip("no tracefs here")
    assert "rc=124" not in result.stdout, "the audit hung on trace_pipe"
    assert "trace_pipe Resource temporarily unavailable" in result.stdout, result.stdout
    document = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
    [finding] = [f for f in document["findings"] if f["check"] == "numa.balancing"]
    assert finding["status"] != "pass"


def _live_plan(root: Path) -> tuple[FixPlan, Path]:
    """A plan whose guard the live machine passes (its hostname and machine-id, which any
    user may read and copy into an image), writing a file on the machine's own /tmp."""
    hostname = Path("/etc/hostname").read_text().strip().splitlines()[0]
    machine_id = Path("/etc/machine-id").read_text().strip()
    target = Path(f"/tmp/host-auditor-live-root-canary-{os.getpid()}")
    step = WriteFile(str(target), "the live machine was changed\n")
    plan = FixPlan(
        host=hostname, target=f"sysroot:{root}", hostname=hostname, machine_id=machine_id,
        root=str(root), fix_id="live-root-test", created="",
        sections=(Section(Remedy("t.t", "s", "write a file", persistent=(step,)),
                          (Action("s001", "persistent", step),)),),
    )
    return plan, target


def test_a_tree_that_is_the_live_root_is_refused_by_what_is_held(tmp_path: Path) -> None:
    """The live / bind-mounted at the sysroot's path (as a swap of the name for a symlink
    to / would make it between a test of the name and its opening): the fix decides on the
    directory it holds, not on the name, and refuses before its guard."""
    if not Path("/etc/hostname").is_file() or not Path("/etc/machine-id").is_file():
        pytest.skip("the live machine has no /etc/hostname or /etc/machine-id")
    image = tmp_path / "image"
    image.mkdir()
    plan, target = _live_plan(image)
    fix, _rollback = write_scripts(plan, tmp_path)
    try:
        result = _namespace(f"mount --bind / {shlex.quote(str(image))}\n"
                            f"bash {shlex.quote(str(fix))} || echo rc=$?\n")
        assert "rc=2" in result.stdout, result.stdout + result.stderr
        assert "ROOT is /" in result.stderr
        assert not target.exists()
        # A plain symlink to / is refused alike.
        link = tmp_path / "link"
        link.symlink_to("/")
        refused = run(fix, link)
        assert refused.returncode == 2 and "ROOT is /" in refused.stderr
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_directory_sysroot_has_the_caps_of_a_capture(h200: Sysroot) -> None:
    """100,000 one-line Proxmox LXC configs (39 s and 358 MiB before the caps): the audit
    stops reading at a capture's entry cap and is refused as an over-large capture is
    (one line, exit 2), in bounded memory."""
    configs = h200.path("/etc/pve/lxc")
    configs.mkdir(parents=True)
    for index in range(100_000):
        fd = os.open(configs / f"{index + 100}.conf", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"arch: amd64\n")
        os.close(fd)
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", "json"),
                         timeout=120, memory=1 << 30)
    assert result.code == 2, result.err[-2000:]
    line = result.one_error_line()
    assert f"more than {local.MAX_ENTRIES} entries" in line and "caps of a capture" in line
    assert result.out == ""


def test_the_directory_caps_are_a_captures() -> None:
    from auditor.hosts import archive

    assert local.MAX_ENTRIES == archive.MAX_MEMBERS
    assert local.MAX_BYTES == archive.MAX_ARCHIVE


@pytest.mark.parametrize("use_openat2", [None, False], ids=["openat2", "walk"])
def test_a_bind_mount_of_the_same_file_system_is_not_crossed(
    h200: Sysroot, canary: Canary, use_openat2: bool | None
) -> None:
    """A bind mount of a directory of the same file system has the tree's st_dev: the
    component walk (kernels without openat2) tells it by its mount id."""
    assert os.stat(canary.root).st_dev == os.stat(h200.root).st_dev
    probe = ("from auditor.shipped.treeio import Tree\n"
             f"tree = Tree({str(h200.root)!r}, use_openat2={use_openat2!r})\n"
             "for read in (lambda: tree.read('/etc/sysctl.d/secret', 100),\n"
             "             lambda: tree.read_file(b'/etc/sysctl.d', b'secret', 100),\n"
             "             lambda: tree.read_file(b'/etc/sysctl.d', b'secret', 100),\n"
             "             lambda: tree.listdir('/etc/sysctl.d')):\n"
             "    try:\n"
             "        print('read', read())\n"
             "    except OSError as exc:\n"
             "        print('refused', exc.strerror)\n")
    sysctl_d = h200.path("/etc/sysctl.d")
    result = _namespace(
        f"mount --bind {shlex.quote(str(canary.root))} {shlex.quote(str(sysctl_d))}\n"
        f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}\n")
    assert result.returncode == 0, result.stderr
    assert canary.secret not in result.stdout
    assert result.stdout.count("refused a mount point inside the tree is not crossed") == 4, \
        result.stdout
