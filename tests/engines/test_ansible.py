"""The Ansible collection run by the real ``ansible-playbook`` against a loopback sshd.

The target is this machine reached over SSH as an unprivileged user with sudo; the
audits and fixes go to generated hosts kept as sysroot directories on it (``root:``), so
nothing of the machine running the tests changes. ``become`` is Ansible's (sudo).
"""

from __future__ import annotations

import ast
import json
import os
import runpy
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.engines.conftest import SshTarget
from tests.support.fixkit import tree_hash
from tests.support.hostgen import FIXED_BY_SCRIPT
from tests.support.pyz import audit_pyz

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "ansible"
COLLECTION = COLLECTIONS / "ansible_collections" / "host_auditor" / "gpuhost"
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@dataclass
class Ansible:
    """An inventory of one target (the lab's sshd) and the environment to run Ansible in."""

    workdir: Path
    inventory: Path
    env: dict[str, str]

    @property
    def state(self) -> Path:
        """Where the fixes the plays run keep their state (the play's environment)."""
        return self.workdir / "fix-state"

    def playbook(self, tasks: list[dict[str, Any]], *args: str, become: bool = True,
                 gather_facts: bool = False, extra_vars: dict[str, Any] | None = None
                 ) -> tuple[int, dict[str, Any], str]:
        """Run a play of ``tasks`` on the target; return the exit code, every registered
        result (by its register name) and the output."""
        names = [t["register"] for t in tasks if "register" in t]
        results = self.workdir / "results.json"
        results.unlink(missing_ok=True)
        keep = {
            "name": "keep the registered results on the controller",
            "ansible.builtin.copy": {
                "content": "{{ {" + ", ".join(f"'{n}': {n} | default(None)" for n in names)
                           + "} | to_json }}",
                "dest": str(results),
            },
            "delegate_to": "localhost",
            "become": False,
            "check_mode": False,
            "diff": False,
        }
        # A fix's state (old values, backups, its rollback) goes to the run's own directory
        # through the play's environment, never to this machine's /var/lib/host-auditor.
        play = [{"hosts": "gpu", "gather_facts": gather_facts, "become": become,
                 "environment": {"HOST_AUDITOR_STATE_DIR": str(self.state)},
                 "tasks": [*tasks, keep]}]
        path = self.workdir / "play.yml"
        path.write_text(yaml.safe_dump(play, sort_keys=False))
        command = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(path), *args]
        if extra_vars:
            command += ["-e", json.dumps(extra_vars)]
        proc = subprocess.run(command, env=self.env, capture_output=True, text=True,
                              timeout=300, check=False)
        output = proc.stdout + proc.stderr
        found = json.loads(results.read_text()) if results.exists() else {}
        return proc.returncode, found, output


@pytest.fixture(scope="module")
def ansible(ssh_target: SshTarget, tmp_path_factory: pytest.TempPathFactory) -> Ansible:
    """Ansible set up to reach the lab's sshd as the sudo user, with the collection."""
    workdir = tmp_path_factory.mktemp("ansible")
    server = ssh_target.server
    inventory = workdir / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {"gpu01": {
        "ansible_host": server.address,
        "ansible_port": server.port,
        "ansible_user": ssh_target.user,
        "ansible_ssh_private_key_file": str(ssh_target.lab.client_key),
        "ansible_ssh_common_args": (f"-o UserKnownHostsFile={ssh_target.known_hosts} "
                                    "-o StrictHostKeyChecking=yes -o ControlMaster=no"),
        "ansible_python_interpreter": "/usr/bin/python3",
    }}}}}}))
    # Ansible's temporary directory on the controller stays in the run's directory.
    localhost = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_remote_tmp": str(workdir / "remote-tmp")}
    inventory_data = yaml.safe_load(inventory.read_text())
    inventory_data["all"]["hosts"] = {"localhost": localhost}
    inventory.write_text(yaml.safe_dump(inventory_data))
    home = workdir / "home"
    home.mkdir()
    env = {
        "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "ANSIBLE_HOME": str(home / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(workdir / "tmp"),
        "ANSIBLE_REMOTE_TMP": "/tmp/.ansible-${USER}",
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "LANG": "C.UTF-8",
    }
    return Ansible(workdir, inventory, env)


@pytest.fixture
def image(make_host: Callable[..., Path]) -> Path:
    """The 8-GPU node with its six problems, owned by root (the user needs become)."""
    return make_host()


def audit_json(root: Path) -> dict[str, Any]:
    proc = subprocess.run([str(BIN / "audit"), "local", "--root", str(root), "--format",
                           "json"], capture_output=True, text=True, check=False)
    document: dict[str, Any] = json.loads(proc.stdout)
    return document


def comparable(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return sorted((f["check"], f["subject"], f["status"], f["observed"])
                  for f in report["findings"])


def audit_task(register: str = "audit", **args: Any) -> dict[str, Any]:
    return {"name": "audit", "host_auditor.gpuhost.audit": args, "register": register,
            "ignore_errors": True}


# -- audit ---------------------------------------------------------------------------------


def test_audit_returns_the_report_as_a_fact_and_fails_by_fail_on(
    ansible: Ansible, image: Path
) -> None:
    expected = audit_json(image)
    code, results, output = ansible.playbook([
        audit_task(root=str(image)),
        # Ansible keeps the facts of a task that did not fail.
        audit_task("lenient", root=str(image), fail_on="never"),
        {"name": "the fact is set on the host", "ansible.builtin.set_fact": {
            "seen": "{{ ansible_facts.host_auditor.summary }}"}, "register": "fact"},
    ])
    assert code == 0, output
    audit = results["audit"]
    assert audit["failed"] is True and audit["changed"] is False and audit["rc"] == 1
    report = audit["ansible_facts"]["host_auditor"]
    assert report["host"] == "pve-gpu-01"
    assert comparable(report) == comparable(expected)
    assert audit["msg"].startswith("FAIL ") and len(audit["msg"].encode()) <= 80
    assert audit["summary"] == expected["summary"]
    assert results["fact"]["ansible_facts"]["seen"] == expected["summary"]
    assert results["lenient"]["failed"] is False and results["lenient"]["rc"] == 1


def test_audit_of_the_target_itself_agrees_with_audit_local(ansible: Ansible) -> None:
    """The booted target (this machine), collected over SSH under sudo."""
    local = subprocess.run([str(BIN / "audit"), "local", "--format", "json"],
                           capture_output=True, text=True, check=False)
    expected = json.loads(local.stdout)
    code, results, output = ansible.playbook([audit_task()])
    assert code == 0, output
    report = results["audit"]["ansible_facts"]["host_auditor"]
    assert report["target"] == "ansible://gpu01"
    assert [(c["check"], c["status"]) for c in report["checks"]] == \
        [(c["check"], c["status"]) for c in expected["checks"]]
    assert results["audit"]["failed"] is (local.returncode != 0)


def test_without_become_root_only_reads_are_noted(ansible: Ansible, image: Path) -> None:
    image.chmod(0o755)
    code, results, output = ansible.playbook([audit_task(root=str(image))], become=False)
    assert code == 0, output
    facts = results["audit"]["ansible_facts"]["host_auditor"]["facts"]
    assert "non-root" in facts["privilege"]


def test_bad_options_fail_the_task_in_one_line(ansible: Ansible, image: Path) -> None:
    code, results, output = ansible.playbook([
        audit_task("unknown", checks=["no.such"]),
        audit_task("missing", root=str(image / "absent")),
        audit_task("relative", root="relative/dir"),
    ])
    assert code == 0, output
    assert "unknown check id 'no.such'" in results["unknown"]["msg"]
    assert "absent: no such directory" in results["missing"]["msg"]
    assert results["relative"]["failed"] is True
    assert all("Traceback" not in r["msg"] for r in results.values())


# -- tune: --check --diff, apply under become, apply again ---------------------------------


def test_check_mode_changes_nothing_and_diffs_the_would_be_changes(
    ansible: Ansible, image: Path
) -> None:
    before = tree_hash(image)
    code, results, output = ansible.playbook(
        [audit_task("tune", root=str(image), state="tuned", fail_on="never")],
        "--check", "--diff")
    assert code == 0, output
    tune = results["tune"]
    assert tune["changed"] is True and tune["failed"] is False
    assert tree_hash(image) == before
    diff = tune["diff"]
    before_lines, after_lines = diff["before"].splitlines(), diff["after"].splitlines()
    assert "pcie.mrrs 0000:18:00.0: 512" in before_lines
    assert "pcie.mrrs 0000:18:00.0: 4096" in after_lines
    assert "numa.balancing kernel: 1" in before_lines and "numa.balancing kernel: 0" in after_lines
    assert {line.split()[0] for line in before_lines} == set(FIXED_BY_SCRIPT)
    assert "kernel.version" not in diff["before"]  # a reboot, not a change the fix makes
    assert "+pcie.mrrs 0000:18:00.0: 4096" in output  # Ansible's diff shows it


def test_apply_with_become_then_again_changes_nothing(ansible: Ansible, image: Path) -> None:
    before = tree_hash(image)
    code, results, output = ansible.playbook(
        [audit_task("tune", root=str(image), state="tuned", fail_on="never")], "--diff")
    assert code == 0, output
    tune = results["tune"]
    assert tune["changed"] is True, tune.get("msg")
    # A subject may vanish with its problem (the fixed C-state): its "after" is "".
    moved = {(m["check"], m["before"]) for m in tune["moved"]}
    assert {(check, "fail") for check in FIXED_BY_SCRIPT} <= moved
    statuses = {c["check"]: c["status"] for c in tune["ansible_facts"]["host_auditor"]["checks"]}
    assert all(statuses[check] == "pass" for check in FIXED_BY_SCRIPT), statuses
    assert statuses["kernel.version"] == "fail"
    fixed = tree_hash(image)
    assert fixed != before
    rollback = Path(tune["rollback"])
    # The rollback is kept where the tree's owner cannot rewrite it: outside the tree.
    assert rollback.is_file() and not rollback.is_relative_to(image)
    # ... where the play's environment put it (the agentless action honours environment:).
    assert rollback.is_relative_to(ansible.state)

    code, results, output = ansible.playbook(
        [audit_task("again", root=str(image), state="tuned", fail_on="never")])
    assert code == 0, output
    assert results["again"]["changed"] is False and "moved" not in results["again"]
    assert tree_hash(image) == fixed
    kept = image / "rollback-copy.sh"
    shutil.copy(rollback, kept)
    # Run as the fix ran (as root, with the play's state directory), so it finds the
    # state the fix kept.
    from auditor.shipped.sysroot_fix import STATE_ENV

    env = {**os.environ, STATE_ENV: str(ansible.state)}
    undone = subprocess.run(["bash", str(kept)], capture_output=True, text=True, check=False,
                            env=env)
    kept.unlink()
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hash(image) == before


def test_a_failed_tuned_report_fails_the_task(ansible: Ansible, image: Path) -> None:
    """With the default fail_on the kernel still waiting for its reboot fails the task."""
    code, results, output = ansible.playbook(
        [audit_task("tune", root=str(image), state="tuned")])
    assert code == 0, output
    assert results["tune"]["changed"] is True and results["tune"]["failed"] is True
    assert results["tune"]["msg"].startswith("FAIL kernel.version ")


# -- the module on a target that has host-auditor installed --------------------------------


def test_installed_mode_runs_the_module_on_the_target(ansible: Ansible, image: Path) -> None:
    expected = audit_json(image)
    before = tree_hash(image)
    code, results, output = ansible.playbook([
        {**audit_task(root=str(image), mode="installed"),
         "vars": {"ansible_python_interpreter": sys.executable}},
        {**audit_task("check", root=str(image), mode="installed", state="tuned",
                      fail_on="never"), "vars": {"ansible_python_interpreter": sys.executable},
         "check_mode": True, "diff": True},
        {**audit_task("tune", root=str(image), mode="installed", state="tuned",
                      fail_on="never"), "vars": {"ansible_python_interpreter": sys.executable}},
        {**audit_task("again", root=str(image), mode="installed", state="tuned",
                      fail_on="never"), "vars": {"ansible_python_interpreter": sys.executable}},
    ])
    assert code == 0, output
    assert comparable(results["audit"]["ansible_facts"]["host_auditor"]) == comparable(expected)
    assert results["audit"]["failed"] is True
    assert results["check"]["changed"] is True
    assert "pcie.mrrs 0000:18:00.0: 4096" in results["check"]["diff"]["after"]
    assert results["tune"]["changed"] is True and results["again"]["changed"] is False
    assert tree_hash(image) != before


def test_installed_mode_runs_the_single_file_build_pushed_by_ansible(
    ansible: Ansible, image: Path, tmp_path: Path
) -> None:
    """A node whose Python has nothing of host-auditor: Ansible copies the build there and
    the module runs with it (the README's play, to a scratch path instead of
    /usr/local/bin)."""
    expected = audit_json(image)
    nodes_bin = tmp_path / "node-bin"
    nodes_bin.mkdir()
    nodes_bin.chmod(0o755)
    pushed = nodes_bin / "audit"
    code, results, output = ansible.playbook([
        {"name": "push", "ansible.builtin.copy": {"src": str(audit_pyz()), "dest": str(pushed),
                                                  "mode": "0755"}, "register": "push"},
        {**audit_task(root=str(image), mode="installed", executable=str(pushed),
                      fail_on="never"),
         "vars": {"ansible_python_interpreter": "/usr/bin/python3"}},
    ])
    assert code == 0, output
    assert results["push"]["changed"] is True and os.access(pushed, os.X_OK)
    assert comparable(results["audit"]["ansible_facts"]["host_auditor"]) == comparable(expected)
    assert results["audit"]["msg"].startswith("FAIL ")


def test_installed_mode_without_host_auditor_says_so(ansible: Ansible) -> None:
    code, results, output = ansible.playbook([audit_task(mode="installed")])
    assert code == 0, output
    assert "host-auditor" in results["audit"]["msg"]
    assert "Traceback" not in results["audit"]["msg"]


# -- facts.d -----------------------------------------------------------------------------


def test_fact_script_puts_the_report_in_ansible_local(ansible: Ansible, tmp_path: Path) -> None:
    facts = tmp_path / "facts.d"
    facts.mkdir()
    shutil.copy(REPO / "contrib" / "ansible" / "host_auditor.fact", facts / "host_auditor.fact")
    os.chmod(facts, 0o755)
    os.chmod(facts / "host_auditor.fact", 0o755)
    code, results, output = ansible.playbook([
        {"name": "gather", "ansible.builtin.setup": {"fact_path": str(facts),
                                                     "gather_subset": ["!all", "local"]},
         "environment": {"PATH": f"{BIN}:/usr/bin:/bin"}, "register": "facts"},
    ])
    assert code == 0, output
    local = results["facts"]["ansible_facts"]["ansible_local"]["host_auditor"]
    assert isinstance(local, dict), local
    assert local["target"] == "local" and {c["check"] for c in local["checks"]} >= {
        "pcie.mrrs", "cpu.governor"}


# -- the README's recipe -----------------------------------------------------------------


def test_readme_recipe_runs_under_check_mode(ansible: Ansible, tmp_path: Path) -> None:
    """``ansible.builtin.command`` is skipped under --check unless the task says
    ``check_mode: false``: the recipe audits and brings the result home either way."""
    recipe = REPO / "contrib" / "ansible" / "audit-and-merge.yml"
    assert recipe.read_text() in (REPO / "README.md").read_text()
    play = yaml.safe_load(recipe.read_text())
    play[0]["hosts"] = "gpu"
    # Where audit is installed here (a path only root may enter, on a developer's machine).
    play[0].update(environment={"PATH": f"{BIN}:/usr/bin:/bin"}, become=True)
    play[1]["tasks"][0]["ansible.builtin.command"] = play[1]["tasks"][0][
        "ansible.builtin.command"].replace("--golden gpu-001 ", "")
    playbook = tmp_path / "recipe.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**ansible.env, "PATH": f"{BIN}:/usr/bin:/bin"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(ansible.inventory),
                           str(playbook), "--check"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "results" / "gpu01.json").read_text())
    assert result["target"] == "local"
    assert (tmp_path / "fleet.txt").read_text().strip()


# -- the collection's documentation ---------------------------------------------------------


def argument_spec() -> dict[str, dict[str, Any]]:
    spec: dict[str, dict[str, Any]] = runpy.run_path(
        str(COLLECTION / "plugins" / "module_utils" / "host_auditor.py"))["ARGUMENT_SPEC"]
    return spec


def module_strings() -> dict[str, str]:
    tree = ast.parse((COLLECTION / "plugins" / "modules" / "audit.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")}


def test_module_documentation_is_yaml_with_the_keys_ansible_requires() -> None:
    strings = module_strings()
    doc = yaml.safe_load(strings["DOCUMENTATION"])
    for key in ("module", "short_description", "description", "options", "author",
                "version_added"):
        assert doc.get(key), key
    for name, option in doc["options"].items():
        assert option.get("description") and option.get("type"), name
    examples = yaml.safe_load(strings["EXAMPLES"])
    # The module's own tasks, showing a result, and putting the single-file audit on a node
    # for mode: installed.
    assert all("host_auditor.gpuhost.audit" in task or "ansible.builtin.debug" in task
               or "ansible.builtin.copy" in task for task in examples)
    assert any("host_auditor.gpuhost.audit" in task for task in examples)
    for name, value in yaml.safe_load(strings["RETURN"]).items():
        assert value.get("description") and value.get("returned") and value.get("type"), name


def test_ansible_doc_reads_the_module_documentation() -> None:
    ARGUMENT_SPEC = argument_spec()
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)}
    proc = subprocess.run([str(BIN / "ansible-doc"), "-t", "module", "--json",
                           "host_auditor.gpuhost.audit"], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["host_auditor.gpuhost.audit"]
    doc = entry["doc"]
    assert doc["module"] == "audit" and doc["short_description"]
    assert set(doc["options"]) == set(ARGUMENT_SPEC)
    for name, spec in ARGUMENT_SPEC.items():
        option = doc["options"][name]
        assert option["type"] == spec["type"], name
        assert option.get("default") == spec.get("default"), name
        assert option.get("choices") == spec.get("choices"), name
    assert yaml.safe_load(entry["examples"])
    assert {"msg", "rc", "ansible_facts", "fix", "moved"} <= set(entry["return"])



def test_readme_tune_play_installed_by_ansible_galaxy(ansible: Ansible, image: Path,
                                                      tmp_path: Path) -> None:
    """The README's route: install the collection with ansible-galaxy, run tune.yml with
    --check --diff, then for real, then again (on a sysroot here, not this machine)."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("# tune.yml\n"):]
    play = yaml.safe_load(block[: block.index("```")])
    installed = tmp_path / "collections"
    env = {**ansible.env, "ANSIBLE_COLLECTIONS_PATH": str(installed)}
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(COLLECTION),
                           "-p", str(installed)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (installed / "ansible_collections" / "host_auditor" / "gpuhost"
            / "MANIFEST.json").exists()
    play[0]["hosts"] = "gpu"
    play[0]["tasks"][0]["host_auditor.gpuhost.audit"].update(root=str(image))
    play[0]["tasks"][0]["register"] = "tune"
    # The fix's state goes to the run's own directory, as a sysroot's owner would keep it,
    # never to this machine's /var/lib/host-auditor (the play honours environment:).
    play[0]["environment"] = {"HOST_AUDITOR_STATE_DIR": str(ansible.state)}
    playbook = tmp_path / "tune.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    before = tree_hash(image)
    runs = []
    for args in (["--check", "--diff"], [], []):
        proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(ansible.inventory),
                               str(playbook), *args], env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append(proc.stdout)
        if args:
            assert tree_hash(image) == before
    assert "changed=1" in runs[0] and "+pcie.mrrs 0000:18:00.0: 4096" in runs[0]
    assert "changed=1" in runs[1] and tree_hash(image) != before
    assert "changed=0" in runs[2]
    assert list(ansible.state.rglob("rollback.sh")), "the fix kept no rollback in the play's place"
