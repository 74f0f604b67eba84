"""known_hosts read line by line: markers, hashed names, patterns, and the SSH policy on them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

import paramiko
import pytest

from auditor.errors import HostKeyRejected
from auditor.hosts.known_hosts import KnownHosts, matches
from auditor.hosts.ssh import SshContext, SshOptions, _make_policy


def key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


@pytest.fixture(scope="module")
def keys() -> list[paramiko.PKey]:
    return [paramiko.Ed25519Key.from_private_key_file(str(_keygen(i))) for i in range(3)]


def _keygen(index: int) -> Path:
    import subprocess
    import tempfile

    path = Path(tempfile.mkdtemp()) / f"k{index}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_markers_and_bad_lines_cost_only_their_own_line(tmp_path: Path,
                                                        keys: list[paramiko.PKey]) -> None:
    a, b, revoked = keys
    known = tmp_path / "known_hosts"
    known.write_text("\n".join([
        "@cert-authority *.example.com " + key_line(b),
        "gpu-01 ssh-ed25519 not-base64!!",
        "garbage",
        "@revoked * " + key_line(revoked),
        "gpu-01 " + key_line(a),
        f"{hashed('gpu-02')} " + key_line(b),
        "gpu-03,!bad-03,*.rack7 " + key_line(revoked),
        "[gpu-04]:2222 " + key_line(a),
    ]) + "\n")
    hosts = KnownHosts()
    hosts.load(str(known))
    assert [k.blob for k in hosts.lookup("gpu-01")] == [a.asbytes()]
    assert [k.blob for k in hosts.lookup("gpu-02")] == [b.asbytes()]
    assert hosts.lookup("gpu-03") == []  # revoked: never trusted, whatever else lists it
    assert hosts.lookup("x.example.com") == []  # a CA key trusts no host key here
    assert [k.blob for k in hosts.lookup("[gpu-04]:2222")] == [a.asbytes()]
    assert hosts.is_revoked(revoked) and not hosts.is_revoked(a)
    assert hosts.skipped == 3


@pytest.mark.parametrize(("name", "patterns", "expected"), [
    ("gpu-07", ("gpu-0?",), True),
    ("GPU-07", ("gpu-07",), True),
    ("gpu-07", ("gpu-*", "!gpu-07"), False),
    ("gpu-[07]", ("gpu-[07]",), True),
    ("gpu-0", ("gpu-[07]",), False),
])
def test_patterns(name: str, patterns: tuple[str, ...], expected: bool) -> None:
    assert matches(name, patterns) is expected


def test_a_revoked_key_is_refused_even_with_accept_new(tmp_path: Path,
                                                       keys: list[paramiko.PKey]) -> None:
    _, _, revoked = keys
    known = tmp_path / "known_hosts"
    known.write_text("@revoked * " + key_line(revoked) + "\n")
    options = SshOptions(known_hosts=(str(known),), accept_new_host_keys=True)
    context = SshContext(options)
    record = tmp_path / "recorded"
    policy = _make_policy(str(record), context, [str(known)], alias=None)
    with pytest.raises(HostKeyRejected, match="REVOKED"):
        policy.missing_host_key(paramiko.SSHClient(), "gpu-01", revoked)
    assert not record.exists()


def test_host_key_alias_is_used_to_record(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    a = keys[0]
    record = tmp_path / "known_hosts"
    record.write_text("")
    context = SshContext(SshOptions(known_hosts=(str(record),), accept_new_host_keys=True))
    policy = _make_policy(str(record), context, [str(record)], alias="pinned-alias")
    policy.missing_host_key(paramiko.SSHClient(), "[10.0.0.7]:2222", a)
    assert record.read_text() == f"pinned-alias {key_line(a)}\n"
    assert [k for k, _ in context.known_keys([str(record)], "pinned-alias")] == ["ssh-ed25519"]
