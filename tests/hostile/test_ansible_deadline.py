"""The agentless Ansible action has a deadline per node.

A real ``ansible-playbook`` audits two nodes of a loopback sshd: a healthy one, and a
hostile one whose every command (a ForceCommand script) answers the collector's header
and then trickles a byte every 0.3 s forever. The hostile node's task fails at its
``timeout`` with one line; the healthy node is audited; the play ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.sshd import Sshd, SshLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTILE = f"ha-ansdl{os.getpid() % 100000:05d}"
TRICKLE = r"""#!/bin/sh
printf 'audit-collect 1 sudo=off\npython uid=0\n'
while :; do printf x; sleep 0.3; done
"""


@dataclass
class Lab:
    lab: SshLab
    server: Sshd
    known_hosts: Path


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        pytest.skip("the hostile node needs root and openssh-server")
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-core is not installed in this environment")
    lab = SshLab(Path(tempfile.mkdtemp(prefix="ha-ansdl-")))
    try:
        script = lab.root / "trickle.sh"
        script.write_text(TRICKLE)
        os.chmod(script, 0o755)
        lab.add_user(HOSTILE)
        server = lab.start(extra=[f"Match User {HOSTILE}", f"    ForceCommand sh {script}"])
        known = lab.known_hosts(lab.root / "known_hosts", [server])
        yield Lab(lab, server, known)
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)


def test_a_trickling_node_fails_at_its_deadline_and_the_play_goes_on(
        lab: Lab, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    common = {
        "ansible_host": lab.server.address,
        "ansible_port": lab.server.port,
        "ansible_ssh_private_key_file": str(lab.lab.client_key),
        "ansible_ssh_common_args": (f"-o UserKnownHostsFile={lab.known_hosts} "
                                    "-o StrictHostKeyChecking=yes -o ControlMaster=no"),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {
        "healthy": {**common, "ansible_user": "root"},
        "hostile": {**common, "ansible_user": HOSTILE},
    }}}}}))
    results = tmp_path / "results"
    results.mkdir()
    play = [{"hosts": "gpu", "gather_facts": False, "tasks": [
        {"host_auditor.gpuhost.audit": {"timeout": 5, "fail_on": "never",
                                        "checks": ["numa.balancing"]},
         "register": "audit", "ignore_errors": True},
        {"ansible.builtin.copy": {"content": "{{ audit | to_json }}",
                                  "dest": f"{results}/{{{{ inventory_hostname }}}}.json"},
         "delegate_to": "localhost", "connection": "local",
         "vars": {"ansible_python_interpreter": sys.executable}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    home = tmp_path / "home"
    home.mkdir()
    control = tempfile.mkdtemp(prefix="ha-cp-")
    request.addfinalizer(lambda: shutil.rmtree(control, ignore_errors=True))
    env = {
        "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
        "ANSIBLE_HOME": str(home / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"), "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "LANG": "C.UTF-8",
        # ssh's control socket must fit a socket path (108 bytes): a short private directory,
        # not one under pytest's deep temporary tree.
        "ANSIBLE_SSH_CONTROL_PATH_DIR": control,
    }
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory),
                           str(tmp_path / "play.yml")], env=env, capture_output=True,
                          text=True, timeout=240, check=False)
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    hostile = json.loads((results / "hostile.json").read_text())
    healthy = json.loads((results / "healthy.json").read_text())
    assert hostile["failed"] and "timed out after 5 s" in hostile["msg"], output
    assert "\n" not in hostile["msg"]
    assert not healthy.get("failed"), healthy.get("msg")
    assert healthy["ansible_facts"]["host_auditor"]["findings"], healthy
    assert wall < 90, (wall, output)
