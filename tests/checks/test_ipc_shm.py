"""ipc.shm: the mount table and tmpfs sizes as the kernel writes them, Docker's sizes as
go-units reads them, what the check says in a container, and the daemon.json it writes."""

from __future__ import annotations

import json
from pathlib import Path

from auditor.checks.ipc_shm import IpcShm, parse_mounts, tmpfs_size
from auditor.checks.lib.docker import parse_size
from auditor.hosts import DirectoryHost
from auditor.model import Status
from tests.support.cases import Case, check_fix
from tests.support.hostgen.serving import base, dgx_class, docker_gpu_container
from tests.support.sysroot import Sysroot


def test_mount_table_escapes_and_last_mount_wins() -> None:
    text = ("tmpfs /dev/shm tmpfs rw,size=65536k 0 0\n"
            "tmpfs /mnt/with\\040space tmpfs rw 0 0\n"
            "tmpfs /dev/shm tmpfs rw,size=1g 0 0\n")
    mounts = parse_mounts(text)
    assert mounts[1].target == "/mnt/with space"
    assert [m for m in mounts if m.target == "/dev/shm"][-1].options == ("rw", "size=1g")


def test_tmpfs_sizes() -> None:
    ram = 64 << 30
    assert tmpfs_size(("rw", "size=65536k"), ram) == 64 << 20
    assert tmpfs_size(("size=16G",), ram) == 16 << 30
    assert tmpfs_size(("size=25%",), ram) == 16 << 30
    assert tmpfs_size(("nr_blocks=1024",), ram) == 4 << 20
    assert tmpfs_size(("rw", "inode64"), ram) == 32 << 30  # tmpfs(5): half of RAM
    assert tmpfs_size(("rw",), None) is None
    assert tmpfs_size(("size=lots",), ram) is None


def test_docker_sizes() -> None:
    assert parse_size("64m") == 64 << 20
    assert parse_size("16GiB") == 16 << 30
    assert parse_size("1.5g") == 3 << 29
    assert parse_size(1073741824) == 1 << 30
    assert parse_size("lots") is None
    assert parse_size(True) is None


def test_container_says_docker_default_and_how_to_start(tmp_path: Path) -> None:
    root = base(lambda: docker_gpu_container(gpus=4), "docker")(tmp_path)
    findings = list(IpcShm().evaluate(DirectoryHost(str(root.root))))
    assert [f.subject for f in findings] == ["/dev/shm"]  # no host-side subjects in a container
    shm = findings[0]
    assert shm.status is Status.FAIL
    assert shm.observed == "64 MiB"
    assert "Docker's 64 MiB default" in shm.message and "4 /dev/nvidiaN" in shm.message
    assert "--ipc=host" in shm.fix


def _docker_host(root: Sysroot) -> None:
    root.write("/etc/docker/daemon.json", '{"runtimes": {"nvidia": {"path": '
               '"nvidia-container-runtime"}}, "default-shm-size": "64m"}')


def test_fix_keeps_the_other_daemon_settings(tmp_path: Path) -> None:
    case = Case("64m default", Status.WARN, _docker_host, base=base(dgx_class, "dgx"),
                fixed=True)
    check_fix(IpcShm, case, tmp_path, [IpcShm])
    root = case.tree(tmp_path / "again")
    from auditor.fix import build_fix
    from auditor.policy import load_policy
    from auditor.runner import audit

    host = DirectoryHost(str(root.root))
    report = audit(host, [IpcShm], load_policy([IpcShm]))
    plan = build_fix(host, report, [IpcShm], load_policy([IpcShm]))
    written = [s for section in plan.sections for s in section.remedy.persistent]
    assert len(written) == 1
    values = json.loads(written[0].content)  # type: ignore[union-attr]
    assert values == {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
                      "default-shm-size": "16g"}
