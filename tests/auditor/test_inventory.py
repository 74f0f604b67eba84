"""Inventories: YAML through PyYAML, Ansible's own sources through a real ansible-inventory,
and one line naming the file (exit 2) for anything that cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.errors import UsageError
from auditor.hosts.ssh import SshTarget
from auditor.inventory import (
    ansible_inventory_command,
    expand_range,
    load_inventory,
    looks_like_yaml,
    parse_yaml,
)
from tests.auditor.conftest import SUDO, SshEnv
from tests.support.sshd import Sshd

AUDIT = str(Path(sys.executable).with_name("audit"))
needs_ansible = pytest.mark.skipif(
    ansible_inventory_command() is None,
    reason="ansible-inventory is not installed (pip install -e '.[test]' brings ansible-core)")


def write(tmp_path: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def audit_host(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUDIT, "host", *args], capture_output=True, text=True, timeout=300,
                          check=False)


# -- YAML, read here ---------------------------------------------------------------------------


def test_yaml_with_comments_after_keys_and_flow_mappings() -> None:
    text = """# the fleet
all:
  hosts:
    gpu01:   # rack 3
    gpu02: {ansible_port: 2222}  # a flow mapping
  vars: {ansible_user: admin}
  children:
    gpu:
      hosts: {gpu03: {}, "gpu04": {ansible_host: 10.0.0.4}}
      vars:
        ansible_user: ops   # the group wins over all
"""
    targets = {t.label: t for t in parse_yaml(text)}
    assert targets == {
        "gpu01": SshTarget("gpu01", "admin", None, "gpu01"),
        "gpu02": SshTarget("gpu02", "admin", 2222, "gpu02"),
        "gpu03": SshTarget("gpu03", "ops", None, "gpu03"),
        "gpu04": SshTarget("10.0.0.4", "ops", None, "gpu04"),
    }


def test_one_line_flow_inventory_without_an_extension(tmp_path: Path) -> None:
    path = write(tmp_path, "fleet", "all: {hosts: {gpu01: {}, gpu02: {}}}\n")
    assert [t.host for t in load_inventory(str(path))] == ["gpu01", "gpu02"]


def test_anchors_that_loop_end_and_step_ranges_expand() -> None:
    text = "all: &top\n  hosts: {a: }\n  children:\n    again: *top\n    racks:\n" \
           "      hosts: {'n[1:7:3]': }\n"
    assert sorted(t.host for t in parse_yaml(text)) == ["a", "n1", "n4", "n7"]
    assert expand_range("n[08:10]") == ["n08", "n09", "n10"]


@pytest.mark.parametrize(("text", "reason"), [
    ("all:\n  hosts:\n    gpu01: {ansible_port: 22\n", "not valid YAML ("),  # truncated
    ("all:\n  hosts: [gpu01, gpu02]\n", "hosts of group 'all' must be a mapping"),
    ("- gpu01\n- gpu02\n", "top level is a list"),
    ("all:\n  hosts:\n    gpu01: 7\n", "host 'gpu01' must be a mapping of variables"),
    ("all:\n  children: [gpu]\n", "children of group 'all' must be a mapping"),
    ("all:\n  hosts:\n    gpu01: {ansible_port: seventy}\n", "ansible_port 'seventy'"),
    ("all:\n  hosts:\n    'n[0:99999999]':\n", "not a range of at most"),
    ("all:\n  hosts:\n    'bad host':\n", "'bad host'"),
])
def test_malformed_yaml_is_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = write(tmp_path, "hosts.yml", text)
    with pytest.raises(UsageError) as caught:
        load_inventory(str(path))
    assert str(caught.value).startswith(f"{path}: ") and reason in str(caught.value)
    assert "\n" not in str(caught.value)
    result = audit_host("-i", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"audit: error: {caught.value}\n"


def test_yaml_is_told_from_ini_by_its_first_line() -> None:
    assert looks_like_yaml("# c\nall:\n  hosts:\n")
    assert looks_like_yaml("gpu: {hosts: {a: }}\n")
    assert not looks_like_yaml("[gpu]\na\n")
    assert not looks_like_yaml("ops@gpu-02:2222\ngpu-01\nfd00::7\n")


def test_unreadable_and_binary_inventories(tmp_path: Path) -> None:
    binary = tmp_path / "bin.ini"
    binary.write_bytes(b"\xff\xfe[gpu]\n")
    with pytest.raises(UsageError, match=r"bin\.ini: cannot read inventory \(not UTF-8"):
        load_inventory(str(binary))
    with pytest.raises(UsageError, match="missing: cannot read inventory"):
        load_inventory(str(tmp_path / "missing"))


# -- through a real ansible-inventory ---------------------------------------------------------


@needs_ansible
def test_directory_with_group_vars_and_host_vars(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    write(inventory, "hosts.ini", "[gpu]\ngpu01\ngpu02 ansible_host=10.0.0.2\n[cpu]\ncpu01\n")
    write(inventory, "group_vars/gpu.yml", "ansible_user: ops\nansible_port: 2200\n")
    write(inventory, "host_vars/gpu02.yml", "ansible_port: 2202\n")
    targets = {t.label: t for t in load_inventory(str(inventory))}
    assert targets == {
        "gpu01": SshTarget("gpu01", "ops", 2200, "gpu01"),
        "gpu02": SshTarget("10.0.0.2", "ops", 2202, "gpu02"),
        "cpu01": SshTarget("cpu01", None, None, "cpu01"),
    }


@needs_ansible
def test_a_file_with_group_vars_beside_it_gets_them(tmp_path: Path) -> None:
    hosts = write(tmp_path, "hosts", "[gpu]\ngpu01\n")
    write(tmp_path, "group_vars/all.yml", "ansible_user: admin\n")
    assert load_inventory(str(hosts)) == [SshTarget("gpu01", "admin", None, "gpu01")]


@needs_ansible
def test_dynamic_inventory_script(tmp_path: Path) -> None:
    listing = {"gpu": {"hosts": ["s1", "s2"], "vars": {"ansible_user": "ops"}},
               "_meta": {"hostvars": {"s1": {"ansible_host": "10.1.1.1",
                                              "ansible_port": 2201}}}}
    script = write(tmp_path, "cloud.py", "#!/bin/sh\n"
                   f"[ \"$1\" = --list ] && echo '{json.dumps(listing)}' || echo '{{}}'\n",
                   mode=0o755)
    assert load_inventory(str(script)) == [SshTarget("10.1.1.1", "ops", 2201, "s1"),
                                           SshTarget("s2", "ops", None, "s2")]


@needs_ansible
def test_inventory_plugin_config(tmp_path: Path) -> None:
    config = write(tmp_path, "fleet.yml", """plugin: ansible.builtin.generator
hosts:
  name: "{{ role }}-{{ rack }}"
layers:
  role: [gpu, cpu]
  rack: [r1, r2]
""")
    assert sorted(t.host for t in load_inventory(str(config))) == [
        "cpu-r1", "cpu-r2", "gpu-r1", "gpu-r2"]


@needs_ansible
def test_what_ansible_cannot_read_is_one_line_and_exit_2(tmp_path: Path) -> None:
    inventory = tmp_path / "broken"
    write(inventory, "hosts.yml", "all:\n  hosts: [oops\n")
    result = audit_host("-i", str(inventory))
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"audit: error: {inventory}: ansible-inventory cannot read it (")
    script = write(tmp_path, "fails.sh", "#!/bin/sh\necho 'not json'\n", mode=0o755)
    result = audit_host("-i", str(script))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert str(script) in result.stderr


def test_ansible_sources_without_ansible_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import auditor.inventory as inventory

    monkeypatch.setattr(inventory, "ansible_inventory_command", lambda: None)
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError, match=r"dir: a directory inventory, which needs Ansible's "
                       r"ansible-inventory \(pip install ansible-core\)"):
        load_inventory(str(tmp_path / "dir"))
    hosts = write(tmp_path, "hosts", "[gpu]\ngpu01\n")
    write(tmp_path, "group_vars/all.yml", "ansible_user: admin\n")
    notes: list[str] = []
    assert load_inventory(str(hosts), note=notes.append) == [
        SshTarget("gpu01", None, None, "gpu01")]
    assert notes == [f"{hosts}: group_vars beside it are not read without ansible-inventory "
                     "(pip install ansible-core)"]


@pytest.mark.ssh
@needs_ansible
def test_audit_host_reaches_hosts_of_an_ansible_directory(
    ssh_env: SshEnv, fleet: list[Sshd], tmp_path: Path
) -> None:
    """Address, port and user from group_vars and host_vars reach real loopback sshd."""
    inventory = tmp_path / "inventory"
    write(inventory, "hosts.yml", "gpu:\n  hosts:\n    node-a:\n    node-b:\n")
    write(inventory, "group_vars/gpu.yml", f"ansible_host: 127.0.0.1\nansible_user: {SUDO}\n")
    write(inventory, "host_vars/node-a.yml", f"ansible_port: {fleet[0].port}\n")
    write(inventory, "host_vars/node-b.yml", f"ansible_port: {fleet[1].port}\n")
    result = audit_host("-i", str(inventory), "--identity", str(ssh_env.lab.client_key),
                        "--known-hosts", str(ssh_env.known_hosts), "--check",
                        "numa.balancing", "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    document = json.loads(result.stdout)
    assert sorted(h["target"] for h in document["hosts"]) == sorted(
        f"ssh://{SUDO}@127.0.0.1:{server.port}" for server in fleet[:2])


def test_a_saved_ansible_inventory_listing_is_read_as_such(tmp_path: Path) -> None:
    listing = {"_meta": {"hostvars": {"a": {"ansible_host": "10.0.0.1", "ansible_port": 2201,
                                            "ansible_user": "ops"}}},
               "all": {"children": ["ungrouped", "gpu"]}, "gpu": {"hosts": ["a", "b"]}}
    path = write(tmp_path, "listing.json", json.dumps(listing))
    assert load_inventory(str(path)) == [SshTarget("10.0.0.1", "ops", 2201, "a"),
                                         SshTarget("b", None, None, "b")]


def test_a_comma_separated_host_list_as_ansible_takes_one() -> None:
    assert load_inventory("gpu01, ops@gpu02:2222,") == [
        SshTarget("gpu01", None, None, "gpu01"), SshTarget("gpu02", "ops", 2222, "ops@gpu02:2222")]
    with pytest.raises(UsageError, match="host list: host 'bad host'"):
        load_inventory("gpu01,bad host")
