"""Hostile host and user names from the command line and inventories (CVE-2023-51385).

An ssh config's ``Match exec`` runs a shell command with ``%h`` (the host name) and ``%r``
(the user) expanded into it; paramiko evaluates it as OpenSSH does. OpenSSH 9.6 refuses
such names before it reads any config; so does host-auditor: each name below is one line
on stderr and exit 2, and the config's ``Match exec`` never runs. A control run with a
valid name shows that the same config is evaluated on the tool's real path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile.conftest import audit_cmd, run_limited


def ssh_config(tmp_path: Path) -> tuple[Path, Path]:
    """Write an ssh config whose Match exec expands %h and %r in a shell; return it and its
    marker directory (``ran`` appears there whenever the Match exec runs)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "echo %h %r >/dev/null; touch {markers}/ran"\n'
                      "    Port 1\n")
    return config, markers


def audit_host(config: Path, *args: str) -> tuple[int, str]:
    result = run_limited(audit_cmd("host", "--ssh-config", str(config), "--timeout", "3",
                                   "--known-hosts", "/dev/null", *args), timeout=60)
    return result.code, result.err if result.code != 2 else result.one_error_line()


def test_a_valid_name_does_evaluate_the_configs_match_exec(tmp_path: Path) -> None:
    """The control: the tool's own ssh config path runs Match exec (so the tests below can fail)."""
    config, markers = ssh_config(tmp_path)
    code, _ = audit_host(config, "127.0.0.1")
    assert code == 3  # port 1 refuses the connection
    assert (markers / "ran").exists()


@pytest.mark.parametrize("name", [
    "gpu01$(touch MARKERS/pwned)",
    "gpu01`touch MARKERS/pwned`",
    "gpu01;touch MARKERS/pwned",
    "gpu01|touch MARKERS/pwned",
    "-oProxyCommand=touch MARKERS/pwned",
    "gpu01\ttouch",
    "gpu01\x1b[31m",
    "gpu\u202e10upg",  # a bidi override
    "'gpu01'@host",  # a user with quotes
    "-oProxyCommand=x@gpu01",
])
def test_names_openssh_refuses_are_one_line_exit_2_and_run_nothing(tmp_path: Path,
                                                                   name: str) -> None:
    config, markers = ssh_config(tmp_path)
    code, line = audit_host(config, "--", name.replace("MARKERS", str(markers)))
    assert code == 2, line
    assert "refused as a" in line and line.startswith("audit: error: ")
    assert list(markers.iterdir()) == []


def test_inventories_are_held_to_the_same_rules(tmp_path: Path) -> None:
    config, markers = ssh_config(tmp_path)
    pwned = markers / "pwned"
    cases = {
        "hosts.yml": json.dumps({"all": {"hosts": {f"gpu01$(touch {pwned})": {}}}}),
        "address.ini": f"gpu01 ansible_host=10.0.0.1`touch${{IFS}}{pwned}`\n",
        "user.ini": f"gpu01 ansible_user=root$(touch${{IFS}}{pwned})\n",
        "dash.ini": "gpu01 ansible_host=-oProxyCommand=x\n",
        "vars.ini": f"[gpu]\ngpu01\n[gpu:vars]\nansible_user=a;touch${{IFS}}{pwned}\n",
    }
    for file, text in cases.items():
        (tmp_path / file).write_text(text)
        code, line = audit_host(config, "-i", str(tmp_path / file))
        assert code == 2, (file, line)
        assert str(tmp_path / file) in line and "refused as a" in line, line
    code, line = audit_host(config, "-i", f"ok-host,gpu02$(touch {pwned}),")
    assert code == 2 and "refused as a host name" in line
    code, line = audit_host(config, "--user", f"x;touch {pwned}", "127.0.0.1")
    assert code == 2 and "--user" in line
    assert list(markers.iterdir()) == []


@pytest.mark.parametrize(("name", "host", "user"), [
    ("[fe80::1%eth0]:2222", "fe80::1%eth0", None), ("ops@gpu-07.dc:22", "gpu-07.dc", "ops"),
    ("::1", "::1", None), ("ssh://root@10.0.0.7:2222", "10.0.0.7", "root"),
    ("gpu_01.example", "gpu_01.example", None),
])
def test_ordinary_names_are_still_taken(name: str, host: str, user: str | None) -> None:
    from auditor.hosts.ssh import parse_target

    target = parse_target(name)
    assert (target.host, target.user) == (host, user)
