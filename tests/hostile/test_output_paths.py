"""Where the tool writes (``-o``, fix and rollback scripts, captures, the Slurm state
directory, the script ``--apply`` runs): never through a path another user controls.

Each test plants what an unprivileged user could in a shared directory (a symlink of its
own at the target or on the way, a FIFO, a device node, a pre-made file, a directory it
may change) and runs the real ``audit`` (as root where the suite runs as root).
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from auditor.hosts.local import run_bash
from tests.hostile.conftest import Canary, audit_cmd, loop_device, run_limited
from tests.support.sysroot import CAPTURES, Sysroot

OTHER = 65534  # nobody: the other user of a shared directory
CAPTURE = str(CAPTURES["h200"])
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files")
pytestmark = [needs_root, pytest.mark.root]


def _shared(tmp_path: Path, mode: int = 0o1777) -> Path:
    """A directory every user may write to (sticky, as /tmp, unless ``mode`` says not)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    return shared


def _their_symlink(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)


def _report(*args: str) -> list[str]:
    return audit_cmd("local", "--root", CAPTURE, "--format", "json", *args)


def test_another_users_symlink_at_the_output_is_not_followed(
    tmp_path: Path, canary: Canary
) -> None:
    """The playbook's fixed path under /tmp, planted first as a symlink to a file of
    root's: the write is refused (exit 2, one line), the file it names is untouched."""
    shared = _shared(tmp_path)
    target = shared / "report.json"
    _their_symlink(target, canary.root / "secret")
    result = run_limited(_report("-o", str(target)), timeout=60)
    assert result.code == 2, result.err
    assert "symlink of another user" in result.one_error_line()
    assert canary.unchanged() and target.is_symlink()


def test_another_users_symlink_on_the_way_is_not_followed(
    tmp_path: Path, canary: Canary
) -> None:
    shared = _shared(tmp_path)
    _their_symlink(shared / "results", canary.root / "cron.d")
    result = run_limited(_report("-o", str(shared / "results" / "x.json")), timeout=60)
    assert result.code == 2 and "symlink of another user" in result.one_error_line()
    assert canary.unchanged()


@pytest.mark.parametrize("kind", ["fifo", "char-device", "directory"])
def test_a_special_file_at_the_output_is_refused(tmp_path: Path, kind: str) -> None:
    """A FIFO (which would hang the write), a device node, a directory: one line, exit 2."""
    target = tmp_path / "out.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "char-device":
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        target.mkdir()
    result = run_limited(_report("-o", str(target)), timeout=60)
    assert result.code == 2, result.err
    line = result.one_error_line()
    assert ("directory" if kind == "directory" else "not a regular file") in line


def test_a_block_device_at_the_output_is_never_written(tmp_path: Path) -> None:
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"DISK-CONTENT-91c2\n" * 4096)
    before = disk.read_bytes()
    with loop_device(disk) as (device, major, minor):
        target = tmp_path / "out.prom"
        os.mknod(target, 0o600 | stat.S_IFBLK, os.makedev(major, minor))
        result = run_limited(_report("-o", str(target)), timeout=60)
        assert result.code == 2 and "block device" in result.one_error_line()
        subprocess.run(["blockdev", "--flushbufs", device], check=False)
    assert disk.read_bytes() == before


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_directory_others_may_change_is_refused(tmp_path: Path, mode: int) -> None:
    """Writable by everyone, or by another group, without the sticky bit: they could
    rename their file over ours between the write and the rename."""
    shared = _shared(tmp_path, mode)
    os.chown(shared, os.geteuid(), OTHER)
    result = run_limited(_report("-o", str(shared / "r.json")), timeout=60)
    assert result.code == 2 and "not sticky" in result.one_error_line()
    assert list(shared.iterdir()) == []


def test_a_file_another_user_made_first_becomes_ours(h200: Sysroot, tmp_path: Path) -> None:
    """A fix script pre-made in /tmp by another user, writable by it: the script written
    is a new file of ours (root's, 0755), not the other user's file with our bytes."""
    shared = _shared(tmp_path)
    fix = shared / "fix.sh"
    fix.write_text("touch /tmp/pwned\n")
    os.chown(fix, OTHER, OTHER)
    os.chmod(fix, 0o666)
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--fix-script",
                                   str(fix)), timeout=60)
    assert result.code in (0, 1), result.err
    st = fix.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755
    assert "pwned" not in fix.read_text()


def test_a_rollback_path_symlinked_by_another_user_is_refused(
    h200: Sysroot, tmp_path: Path, canary: Canary
) -> None:
    shared = _shared(tmp_path)
    _their_symlink(shared / "fix.rollback.sh", canary.root / "60-numa.conf")
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--fix-script",
                                   str(shared / "fix.sh")), timeout=60)
    assert result.code == 2 and "symlink of another user" in result.one_error_line()
    assert canary.unchanged()


def test_a_snapshot_through_another_users_symlink_is_refused(
    tmp_path: Path, canary: Canary
) -> None:
    shared = _shared(tmp_path)
    _their_symlink(shared / "snap.tar.gz", canary.root / "secret")
    result = run_limited(audit_cmd("snapshot", "local", "--check", "numa.balancing", "-o",
                                   str(shared / "snap.tar.gz")), timeout=60)
    assert result.code == 2 and "symlink of another user" in result.one_error_line()
    assert canary.unchanged()


def test_our_own_symlink_still_names_where_the_report_goes(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link.json").symlink_to(real / "report.json")
    result = run_limited(_report("-o", str(tmp_path / "link.json")), timeout=60)
    assert result.code in (0, 1), result.err
    assert (real / "report.json").read_text().startswith("{")


def test_apply_runs_the_script_from_a_descriptor_never_a_name_in_tmpdir(
    tmp_path: Path
) -> None:
    """``sudo -E`` leaves root's TMPDIR in another user's directory, where a script named
    there could be renamed over before bash opened it: nothing is named there at all, and
    bash reads the very bytes the tool wrote."""
    tmpdir = _shared(tmp_path, 0o777)
    os.chown(tmpdir, OTHER, OTHER)
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(os.listdir(tmpdir))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmpdir)
    try:
        result = run_bash('printf "%s|%s\\n" "$0" "${BASH_SOURCE[0]:-}"; echo ran\n')
    finally:
        stop.set()
        watcher.join()
        if before is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = before
    assert result.returncode == 0 and result.output.endswith("ran\n"), result.output
    assert result.output.startswith("/dev/fd/")
    assert seen == set() and list(tmpdir.iterdir()) == []


def test_apply_on_a_sysroot_names_no_file_in_tmpdir(h200: Sysroot, tmp_path: Path) -> None:
    from tests.support.plant import plant_numa

    plant_numa(h200)
    tmpdir = _shared(tmp_path, 0o777)
    os.chown(tmpdir, OTHER, OTHER)
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--apply", "--yes",
                                   "--check", "numa.balancing"), timeout=120,
                         env={**os.environ, "TMPDIR": str(tmpdir)})
    assert result.code == 0, result.err
    assert h200.read("/proc/sys/kernel/numa_balancing") == "0\n"
    assert list(tmpdir.iterdir()) == []


# -- the Slurm HealthCheckProgram and Prolog's state directory ----------------------------

SLURM = Path(__file__).resolve().parents[2] / "contrib" / "slurm"


def _slurm_run(script: str, tmp_path: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """Run a contrib script as slurmd would (root, no PATH), scontrol and sinfo stubbed."""
    stub = tmp_path / "stub"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    settings = tmp_path / "settings"
    settings.write_text(f"AUDIT={audit_cmd()[0]}\nSCONTROL={stub}\nSINFO={stub}\n"
                        f"LOGGER=/nonexistent\nAUDIT_ARGS='--root {CAPTURE}'\n"
                        f"STATE_DIR={state}\n")
    return subprocess.run([str(SLURM / script)], capture_output=True, text=True, timeout=120,
                          check=False, env={"SLURMD_NODENAME": "gpu01",
                                            "HOST_AUDITOR_SLURM_CONFIG": str(settings)})


@pytest.mark.parametrize("script", ["host-auditor-healthcheck", "host-auditor-prolog"])
def test_a_shared_state_directory_with_planted_links_is_not_used(
    tmp_path: Path, canary: Canary, script: str
) -> None:
    state = _shared(tmp_path)
    _their_symlink(state / "gpu01.json", canary.root / "secret")
    _their_symlink(state / "gpu01.err", canary.root / "60-numa.conf")
    result = _slurm_run(script, tmp_path, state)
    assert result.returncode == 0, result.stderr
    assert "not a directory of this user's alone" in result.stderr
    assert canary.unchanged()
    assert sorted(p.name for p in state.iterdir()) == ["gpu01.err", "gpu01.json"]


@pytest.mark.parametrize("script", ["host-auditor-healthcheck", "host-auditor-prolog"])
def test_a_private_state_directory_gets_the_report_and_no_err_file(
    tmp_path: Path, script: str
) -> None:
    state = tmp_path / "state"
    result = _slurm_run(script, tmp_path, state)
    assert result.returncode in (0, 1), result.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    assert [p.name for p in state.iterdir()] == ["gpu01.json"]
    assert (state / "gpu01.json").read_text().startswith("{")
