"""A process's name proves nothing: daemons are the system's by their unit and owner.

On a generated HGX node whose fabric manager is installed but stopped, a process named
``nv-fabricmanager`` is planted as an unprivileged user's, as a container's (root inside
it) and in another PID namespace: the fabric-manager failure stays a failure. The control
is the same process as the system's (in its unit's cgroup, or root on the host), which
passes. ``nvidia-persistenced``'s pid file naming a user's look-alike is not the daemon.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.checks.nvidia_fabricmanager import NvidiaFabricmanager
from auditor.checks.nvidia_persistence import NvidiaPersistence
from auditor.hosts import DirectoryHost
from auditor.model import Finding, Status
from tests.hostile.conftest import audit_cmd, run_limited
from tests.support.hostgen.nvidia import DriverSpec, build_driver_host, process_identity

PID = 6601
FM_UNIT = "/system.slice/nvidia-fabricmanager.service"
SESSION = "/user.slice/user-1000.slice/session-3.scope"
DOCKER = "/system.slice/docker-4f1e9a.scope"


def hgx(tmp_path: Path, uid: int, cgroup: str, pid_ns: str = "pid:[4026531836]",
        status: bool = True) -> Path:
    tree = build_driver_host(DriverSpec(nvswitches=4, fabricmanager="stopped"))
    tree.put(f"/proc/{PID}/comm", "nv-fabricmanage\n")
    process_identity(tree, PID, "nv-fabricmanage", uid, cgroup, pid_ns)
    tree.links["/proc/1/ns/pid"] = "pid:[4026531836]"
    if not status:
        del tree.files[f"/proc/{PID}/status"]
    return tree.write_dir(tmp_path / "node")


def fabric(root: Path) -> Finding:
    (finding,) = NvidiaFabricmanager().evaluate(DirectoryHost(str(root)))
    return finding


@pytest.mark.parametrize(("uid", "cgroup"), [(0, FM_UNIT), (0, "/system.slice/sshd.service")])
def test_the_systems_fabric_manager_passes(tmp_path: Path, uid: int, cgroup: str) -> None:
    """The control: the same process, in its unit's cgroup or as root on the host, counts."""
    finding = fabric(hgx(tmp_path, uid, cgroup))
    assert finding.status is Status.PASS, finding.message
    assert dict(finding.evidence)["pid"] == str(PID)


@pytest.mark.parametrize(("uid", "cgroup", "pid_ns", "why"), [
    (1000, SESSION, "pid:[4026531836]", "run by uid 1000, not root"),
    (0, DOCKER, "pid:[4026531836]", "docker container"),
    (0, "/", "pid:[4026532999]", "another PID namespace"),
    (1000, f"{SESSION}/nvidia-fabricmanager.service", "pid:[4026531836]", "not root"),
])
def test_a_look_alike_never_turns_the_failure_into_a_pass(
        tmp_path: Path, uid: int, cgroup: str, pid_ns: str, why: str) -> None:
    root = hgx(tmp_path, uid, cgroup, pid_ns)
    finding = fabric(root)
    assert finding.status is Status.FAIL and finding.observed == "not running"
    assert why in dict(finding.evidence)["ignored"] and "proves nothing" in finding.message
    # The whole command agrees: exit 1, the failure in the report.
    result = run_limited(audit_cmd("local", "--root", str(root), "--check",
                                   "nvidia.fabricmanager", "--format", "json"), timeout=60)
    assert result.code == 1, result.err
    assert json.loads(result.out)["findings"][0]["status"] == "fail"


def test_an_owner_that_was_not_read_is_not_taken_as_either(tmp_path: Path) -> None:
    finding = fabric(hgx(tmp_path, 0, FM_UNIT, status=False))
    assert finding.status is Status.SKIP and "cannot be told" in finding.message


def test_persistenced_pid_file_naming_a_users_look_alike(tmp_path: Path) -> None:
    tree = build_driver_host(DriverSpec())
    process_identity(tree, 2417, "nvidia-persiste", 1000, SESSION)
    root = tree.write_dir(tmp_path / "node")
    (finding,) = NvidiaPersistence().evaluate(DirectoryHost(str(root)))
    assert finding.status is Status.WARN and "not running" in finding.message
    # The control: the generated node's own daemon (its user, its unit's cgroup) runs.
    (control,) = NvidiaPersistence().evaluate(DirectoryHost(str(
        build_driver_host(DriverSpec()).write_dir(tmp_path / "control"))))
    assert control.status is Status.PASS, control.message
