"""lxc.device_majors against the real h200 capture, with container configs planted in copies.

The capture's /proc/devices has nvidia-uvm at 238 and nvidia-caps at 241, and its
/dev holds nvidia-uvm 238:0, nvidia-caps/nvidia-cap1 241:1 and nvidia0 195:0.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from auditor.checks.lib.lxc_config import (
    ConfigLine,
    cgroup_mode,
    parse_device_rule,
    parse_proc_devices,
)
from auditor.checks.lib.lxc_devices import Rule, allows, bpf_allows, node_driver
from auditor.checks.lxc_device_majors import LxcDeviceMajors
from auditor.hosts import DirectoryHost
from auditor.hosts.archive import ArchiveHost
from auditor.hosts.base import Host
from auditor.model import Finding, Status
from auditor.registry import load_checks
from tests.support.sysroot import CAPTURES, Sysroot

REPO = Path(__file__).resolve().parents[2]
UVM_NOW = "238"  # the capture's nvidia-uvm major
STALE = "509"

PVE_HEAD = """\
arch: amd64
cores: 16
features: nesting=1
hostname: llm-01
memory: 65536
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:5E:3A:01,ip=dhcp,type=veth
ostype: ubuntu
rootfs: local-lvm:vm-101-disk-0,size=200G
swap: 0
unprivileged: 0
"""

GPU_MOUNTS = "".join(
    f"lxc.mount.entry: /dev/{n} dev/{n} none bind,optional,create=file\n"
    for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
)


def pve_config(uvm_major: str, head: str = PVE_HEAD, tail: str = "") -> str:
    """Return a Proxmox GPU container config allowing nvidia-uvm at ``uvm_major``."""
    return (
        head
        + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        + f"lxc.cgroup2.devices.allow: c {uvm_major}:* rwm\n"
        + GPU_MOUNTS
        + tail
    )


def evaluate(host: Host | Sysroot) -> list[Finding]:
    if isinstance(host, Sysroot):
        host = DirectoryHost(str(host.root))
    return list(LxcDeviceMajors().evaluate(host))


def evidence(finding: Finding) -> dict[str, str]:
    return dict(finding.evidence)


def drop_device_nodes(root: Sysroot, *paths: str) -> None:
    """Remove /dev nodes where the extraction made them (it does only as root)."""
    for path in paths:
        if root.path(path).exists():
            root.remove(path)


# -- the planted cases ---------------------------------------------------------------


def test_no_containers_is_skip(h200: Sysroot) -> None:
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert finding.message == "no LXC containers"


def test_stale_uvm_major_fails_per_device(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert {f.subject for f in findings} == {"101"}
    assert [evidence(f)["device"] for f in findings] == ["/dev/nvidia-uvm",
                                                         "/dev/nvidia-uvm-tools"]
    for finding in findings:
        assert STALE in finding.message and UVM_NOW in finding.message
        assert evidence(finding) | {"device": ""} == {
            "config": "/etc/pve/lxc/101.conf",
            "flavour": "proxmox",
            "device": "",
            "driver_name": "nvidia-uvm",
            "allowed_major": STALE,
            "current_major": UVM_NOW,
            "rule": f"lxc.cgroup2.devices.allow: c {STALE}:* rwm",
            "rule_line": "12",
            "allow_key": "lxc.cgroup2.devices.allow",
            "major_source": evidence(finding)["major_source"],
        }
        assert finding.expected == f"c {UVM_NOW}:* rwm"
    # The rule line number points at the line as written in the file.
    lines = h200.read("/etc/pve/lxc/101.conf").splitlines()
    assert lines[11] == f"lxc.cgroup2.devices.allow: c {STALE}:* rwm"


def test_current_uvm_major_passes(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW))
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert finding.subject == "101"
    assert f"nvidia-uvm {UVM_NOW}" in finding.message
    assert "4 bind-mounted GPU nodes" in finding.message


@pytest.mark.parametrize("section", ["[before-upgrade]", "[pve:pending]"])
def test_stale_rule_outside_the_main_section_is_ignored(h200: Sysroot, section: str) -> None:
    stale_copy = pve_config(STALE, head=f"{section}\n{PVE_HEAD}")
    h200.write("/etc/pve/lxc/101.conf",
               pve_config(UVM_NOW, head="parent: before-upgrade\n" + PVE_HEAD)
               + "\n" + stale_copy + "snaptime: 1733100000\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS


def test_stale_main_section_fails_even_when_the_snapshot_is_right(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               pve_config(STALE) + "\n" + pve_config(UVM_NOW, head="[before-upgrade]\n"))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert {evidence(f)["rule_line"] for f in findings} == {"12"}


HYBRID_CGROUP = (
    "12:devices:/lxc/gpu1\n11:memory:/lxc/gpu1\n1:name=systemd:/init.scope\n0::/init.scope\n"
)


def plain_config(uvm_major: str) -> str:
    mounts = "".join(
        f"lxc.mount.entry = /dev/{n} dev/{n} none bind,optional,create=file 0 0\n"
        for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
    )
    return (
        "lxc.include = /usr/share/lxc/config/ubuntu.common.conf\n"
        "lxc.arch = linux64\n"
        "lxc.rootfs.path = dir:/var/lib/lxc/gpu1/rootfs\n"
        "lxc.uts.name = gpu1\n"
        "lxc.cgroup.devices.allow = c 195:* rwm\n"
        f"lxc.cgroup.devices.allow = c {uvm_major}:* rwm\n" + mounts
    )


def test_plain_lxc_v1_rules_on_a_v1_host(h200: Sysroot) -> None:
    h200.write("/proc/1/cgroup", HYBRID_CGROUP)
    h200.write("/var/lib/lxc/gpu1/config", plain_config(STALE))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    first = evidence(findings[0])
    assert findings[0].subject == "gpu1"
    assert first["flavour"] == "lxc"
    assert first["config"] == "/var/lib/lxc/gpu1/config"
    assert first["rule"] == f"lxc.cgroup.devices.allow = c {STALE}:* rwm"
    assert first["allow_key"] == "lxc.cgroup.devices.allow"
    assert (first["allowed_major"], first["current_major"]) == (STALE, UVM_NOW)

    h200.write("/var/lib/lxc/gpu1/config", plain_config(UVM_NOW))
    assert [f.status for f in evaluate(h200)] == [Status.PASS]


def test_v1_rules_are_ignored_on_a_pure_cgroup2_host(h200: Sysroot) -> None:
    # The capture's /proc/1/cgroup is "0::/": LXC ignores lxc.cgroup.* keys there.
    h200.write("/var/lib/lxc/gpu1/config", plain_config(UVM_NOW))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL] * 4
    assert all("ignored on this pure cgroup2 host" in f.message for f in findings)
    assert {evidence(f)["allow_key"] for f in findings} == {"lxc.cgroup2.devices.allow"}
    assert {evidence(f)["rule"] for f in findings} == {""}


def test_plain_lxc_without_include_or_rules_is_unrestricted(h200: Sysroot) -> None:
    config = plain_config(STALE)
    config = "".join(line + "\n" for line in config.splitlines()
                     if not line.startswith(("lxc.include", "lxc.cgroup")))
    h200.write("/var/lib/lxc/gpu1/config", config)
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "not restricted" in finding.message
    h200.write("/var/lib/lxc/gpu1/config", "lxc.include = /usr/share/lxc/config/common.conf\n"
               + config)
    assert {f.status for f in evaluate(h200)} == {Status.FAIL}


def test_dev_entries_follow_the_live_major(h200: Sysroot) -> None:
    devs = "".join(
        f"dev{i}: /dev/{n},gid=44\n"
        for i, n in enumerate(("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"))
    )
    # Leftover stale rules do not matter: Proxmox allows each devN at its live major.
    h200.write("/etc/pve/lxc/102.conf",
               PVE_HEAD + devs + f"lxc.cgroup2.devices.allow: c {STALE}:* rwm\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "lasting fix" in finding.message
    assert "4 GPU nodes are passed through" in finding.message


def test_container_without_gpu_passes(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/103.conf", PVE_HEAD + "mp0: /srv/models,mp=/models\n")
    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE))
    by_subject = {f.subject: f for f in evaluate(h200)}
    assert by_subject["103"].status is Status.PASS
    assert "no GPU device nodes" in by_subject["103"].message
    assert by_subject["101"].status is Status.FAIL


def test_proxmox_symlink_layout(h200: Sysroot) -> None:
    h200.write("/etc/pve/nodes/pve1/lxc/101.conf", pve_config(STALE))
    h200.write("/etc/pve/nodes/pve2/lxc/201.conf", pve_config("511"))  # another node's
    h200.symlink("/etc/pve/lxc", "nodes/pve1/lxc")
    findings = evaluate(h200)
    assert {f.subject for f in findings} == {"101"}
    assert {evidence(f)["config"] for f in findings} == {"/etc/pve/lxc/101.conf"}


def test_proxmox_nodes_tree_without_the_link_uses_this_hosts_node(h200: Sysroot) -> None:
    hostname = h200.read("/etc/hostname").strip()
    h200.write(f"/etc/pve/nodes/{hostname}/lxc/101.conf", pve_config(STALE))
    h200.write("/etc/pve/nodes/other/lxc/201.conf", pve_config("511"))
    findings = evaluate(h200)
    assert {f.subject for f in findings} == {"101"}
    assert {f.status for f in findings} == {Status.FAIL}

    h200.remove(f"/etc/pve/nodes/{hostname}")
    h200.write("/etc/pve/nodes/third/lxc/301.conf", pve_config(UVM_NOW))
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "2 cluster nodes" in finding.message


def test_generated_plain_config_of_a_proxmox_container_is_not_judged_twice(
    h200: Sysroot,
) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW))
    h200.write("/var/lib/lxc/101/config", plain_config(STALE))
    assert [(f.subject, f.status) for f in evaluate(h200)] == [("101", Status.PASS)]


HOSTILE = "1\n$(touch pwned)`id`'\""


def test_hostile_file_name_is_carried_raw(h200: Sysroot, tmp_path: Path) -> None:
    h200.write(f"/etc/pve/lxc/{HOSTILE}.conf", pve_config(STALE))
    plain = "gpu " + HOSTILE
    h200.write(f"/var/lib/lxc/{plain}/config", plain_config(STALE).replace(
        "lxc.cgroup.", "lxc.cgroup2."))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL] * 4
    assert {f.subject for f in findings} == {HOSTILE, plain}
    assert {evidence(f)["config"] for f in findings} == {
        f"/etc/pve/lxc/{HOSTILE}.conf", f"/var/lib/lxc/{plain}/config"
    }
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for fmt in ("text", "markdown", "html", "junit", "json"):
        result = run_cli(h200, fmt, cwd=cwd)
        assert result.returncode == 1, result.stderr
        assert "pwned" in result.stdout
    assert not list(cwd.iterdir())


def test_eight_gpu_node_with_caps(h200: Sysroot) -> None:
    gpus = "".join(
        f"lxc.mount.entry: /dev/nvidia{i} dev/nvidia{i} none bind,optional,create=file\n"
        for i in range(8)
    )
    def config(uvm: str, caps: str) -> str:
        return (
            PVE_HEAD
            + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
            + f"lxc.cgroup2.devices.allow: c {uvm}:* rwm\n"
            + f"lxc.cgroup2.devices.allow: c {caps}:* rwm\n"
            + "lxc.cgroup2.devices.allow: c 10:200 rwm\n"
            + gpus
            + "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
            + "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"
            + "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none "
              "bind,optional,create=file\n"
            + "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir\n"
            + "lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file\n"
        )

    h200.write("/etc/pve/lxc/120.conf", config("509", "510"))
    findings = evaluate(h200)
    failed = {evidence(f)["device"]: evidence(f) for f in findings}
    assert {f.status for f in findings} == {Status.FAIL}
    assert failed["/dev/nvidia-uvm"]["allowed_major"] == "509"
    assert failed["/dev/nvidia-uvm"]["current_major"] == UVM_NOW
    caps = [path for path in failed if path.startswith("/dev/nvidia-caps")]
    assert caps  # the bind of the directory brings its nodes (or the directory itself)
    for path in caps:
        assert failed[path]["driver_name"] == "nvidia-caps"
        assert failed[path]["allowed_major"] == "510"
        assert failed[path]["current_major"] == "241"
        assert failed[path]["rule"] == "lxc.cgroup2.devices.allow: c 510:* rwm"
    assert not any(path.startswith("/dev/nvidia") and path[11:].isdigit() for path in failed)

    h200.write("/etc/pve/lxc/120.conf", config(UVM_NOW, "241"))
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "nvidia-caps 241" in finding.message


def test_access_and_order_of_rules(h200: Sysroot) -> None:
    cases = {
        "lxc.cgroup2.devices.allow: a\n": Status.PASS,
        "lxc.cgroup2.devices.allow: c *:* rwm\n": Status.PASS,
        "lxc.cgroup2.devices.allow: c *:* m\n": Status.FAIL,
        f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* m\n": Status.FAIL,
        f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n"
        f"lxc.cgroup2.devices.deny: c {UVM_NOW}:* rwm\n": Status.FAIL,
        f"lxc.cgroup2.devices.allow: c {UVM_NOW}:0 rw\n"
        f"lxc.cgroup2.devices.allow: c {UVM_NOW}:1 rw\n": Status.PASS,
    }
    for rules, status in cases.items():
        h200.write("/etc/pve/lxc/101.conf",
                   PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n" + rules + GPU_MOUNTS)
        assert {f.status for f in evaluate(h200)} == {status}, rules


def test_per_minor_stale_rules_pair_with_their_nodes(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               f"lxc.cgroup2.devices.allow: c {STALE}:0 rw\n"
               f"lxc.cgroup2.devices.allow: c {STALE}:1 rw\n" + GPU_MOUNTS)
    rules = {evidence(f)["device"]: evidence(f)["rule"] for f in evaluate(h200)}
    assert rules == {
        "/dev/nvidia-uvm": f"lxc.cgroup2.devices.allow: c {STALE}:0 rw",
        "/dev/nvidia-uvm-tools": f"lxc.cgroup2.devices.allow: c {STALE}:1 rw",
    }


def test_ambiguous_stale_majors_are_listed_without_a_rule_to_rewrite(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.cgroup2.devices.allow: c 509:* rwm\n"
               "lxc.cgroup2.devices.allow: c 510:* rwm\n" + GPU_MOUNTS)
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    for finding in findings:
        assert (evidence(finding)["allowed_major"], evidence(finding)["rule"]) == ("509 510", "")
        assert "add 'lxc.cgroup2.devices.allow: c 238:* rwm'" in finding.fix


def test_config_that_is_not_a_file_is_skipped(h200: Sysroot) -> None:
    # A FIFO would block a reader forever on the live host.
    h200.path("/etc/pve/lxc").mkdir(parents=True)
    os.mkfifo(h200.path("/etc/pve/lxc/101.conf"))
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "not a file" in finding.message


def test_garbage_proc_devices_and_binary_config_do_not_crash(h200: Sysroot) -> None:
    h200.write("/proc/devices",
               b"Character devices:\n\xff\xfe nvidia\n99999999999999999999 nvidia-uvm\n"
               b"abc nvidia-uvm\n\x00\x00\n238\n\nBlock devices:\n238 nvidia-uvm\n")
    drop_device_nodes(h200, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    h200.write("/etc/pve/lxc/101.conf",
               b"\x00\xff\xfe\x7fELF\x02\x01\n" + pve_config(STALE).encode()
               + b"lxc.cgroup2.devices.allow: c \xff:* rwm\nlxc.mount.entry: \x00\n")
    findings = evaluate(h200)
    # nvidia-uvm's major is unknown now: those nodes cannot be judged.
    assert [f.status for f in findings] == [Status.SKIP, Status.SKIP]
    assert "no 'nvidia-uvm' line" in findings[0].message


def test_missing_driver_line_with_a_fixed_major_still_judges(h200: Sysroot) -> None:
    h200.write("/proc/devices", "Character devices:\n  1 mem\n")
    drop_device_nodes(h200, "/dev/nvidia0", "/dev/nvidiactl")
    h200.write("/etc/pve/lxc/101.conf",
               PVE_HEAD + "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,create=file\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.FAIL
    assert evidence(finding)["current_major"] == "195"
    assert evidence(finding)["rule"] == ""


def test_missing_fixed_major_rule_names_no_stale_rule(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               pve_config(STALE) + "lxc.mount.entry: /dev/dri dev/dri none bind,create=dir\n")
    dri = [evidence(f) for f in evaluate(h200) if evidence(f)["driver_name"] == "drm"]
    assert dri
    for found in dri:
        assert (found["current_major"], found["allowed_major"], found["rule"]) == ("226", "", "")


def capture_with(files: dict[str, str]) -> ArchiveHost:
    """Return the real capture as a tar host, with files replaced or added."""
    source = tarfile.open(CAPTURES["h200"])
    buffer = io.BytesIO()
    with source, tarfile.open(fileobj=buffer, mode="w") as out:
        for member in source.getmembers():
            if "/" + member.name.lstrip("./") in files:
                continue
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
        for path, text in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            data = text.encode()
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return ArchiveHost(buffer.getvalue(), "h200-planted")


def test_device_node_numbers_beat_proc_devices() -> None:
    # /proc/devices names 250, but the node the container binds is 238:0 in the capture.
    proc = "Character devices:\n195 nvidia\n195 nvidiactl\n250 nvidia-uvm\n"
    host = capture_with({"/proc/devices": proc, "/etc/pve/lxc/101.conf": pve_config("250")})
    by_device = {evidence(f)["device"]: f for f in evaluate(host)}
    uvm = by_device["/dev/nvidia-uvm"]
    assert uvm.status is Status.FAIL
    assert evidence(uvm)["major_source"] == "device node"
    assert evidence(uvm)["current_major"] == UVM_NOW


# -- the CLI and the registry --------------------------------------------------------


def run_cli(root: Sysroot, fmt: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "auditor", "local", "--root", str(root.root),
         "--format", fmt, "--check", "lxc.device_majors"],
        capture_output=True, text=True, env=env, cwd=cwd or REPO, check=False,
    )


def test_cli_json_names_subject_and_evidence(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE))
    result = run_cli(h200, "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    failed = [f for f in report["findings"] if f["status"] == "fail"]
    assert [f["subject"] for f in failed] == ["101", "101"]
    assert {f["check"] for f in failed} == {"lxc.device_majors"}
    assert {f["severity"] for f in failed} == {"critical"}
    uvm = next(f for f in failed if f["evidence"]["device"] == "/dev/nvidia-uvm")
    assert uvm["evidence"]["config"] == "/etc/pve/lxc/101.conf"
    assert uvm["evidence"]["rule"] == f"lxc.cgroup2.devices.allow: c {STALE}:* rwm"
    assert (uvm["evidence"]["allowed_major"], uvm["evidence"]["current_major"]) == (
        STALE, UVM_NOW)


def test_registered_last_and_reads_cover_every_path(h200: Sysroot) -> None:
    assert LxcDeviceMajors in load_checks()
    read: list[str] = []

    class Recording(DirectoryHost):
        def read_bytes(self, path: str, limit: int = 1 << 20) -> bytes:
            read.append(path)
            return super().read_bytes(path, limit)

        def device_numbers(self, path: str) -> tuple[int, int] | None:
            read.append(path)
            return super().device_numbers(path)

    h200.write("/etc/pve/nodes/pve1/lxc/101.conf", pve_config(STALE).replace(
        GPU_MOUNTS, GPU_MOUNTS + "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none "
        "bind,create=dir\nlxc.mount.entry: /dev/dri dev/dri none bind,create=dir\n"))
    h200.write("/var/lib/lxc/gpu1/config", plain_config(STALE))
    list(LxcDeviceMajors().evaluate(Recording(str(h200.root))))
    assert "/etc/pve/nodes/pve1/lxc/101.conf" in read
    unread = [p for p in read
              if not any(fnmatch.fnmatchcase(p, pattern) for pattern in LxcDeviceMajors.reads)]
    assert unread == []


# -- unit tables ---------------------------------------------------------------------


def rules(*lines: str) -> list[Rule]:
    parsed = []
    for number, line in enumerate(lines, start=1):
        kind, _, value = line.partition(" ")
        rule = parse_device_rule(value)
        assert rule is not None
        parsed.append(Rule(kind == "allow", rule, ConfigLine(number, line)))
    return parsed


@pytest.mark.parametrize(
    ("lines", "major", "minor", "expected"),
    [
        ((), 238, 0, False),
        (("allow a",), 238, 0, True),
        (("allow c 238:* rwm",), 238, 0, True),
        (("allow c 238:0 rw",), 238, 1, False),
        (("allow c 238:0 rw",), 238, None, True),
        (("allow c 238:* r",), 238, 0, False),
        (("allow c 238:* r", "allow c 238:* w"), 238, 0, False),
        (("allow b 238:* rwm",), 238, 0, False),
        (("allow c 238:* rwm", "deny c 238:* rwm"), 238, 0, False),
        (("allow c 238:* rwm", "deny c 238:0 rwm"), 238, 0, True),  # exact match only
        (("allow c 238:* rwm", "deny a"), 238, 0, False),
        (("allow a", "deny c 238:* w"), 238, 0, False),
        (("allow a", "deny c 238:* w", "allow c 238:* w"), 238, 0, True),
        (("allow a", "deny c 195:* rwm"), 238, 0, True),
        (("deny a", "allow c *:* rwm"), 238, 7, True),
    ],
)
def test_allows(lines: tuple[str, ...], major: int, minor: int | None, expected: bool) -> None:
    assert allows(rules(*lines), major, minor) is expected


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("0::/\n", "v2"),
        ("0::/init.scope\n", "v2"),
        (HYBRID_CGROUP, "v1"),
        ("12:memory:/\n0::/\n", "unknown"),
        ("garbage\n", "unknown"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_cgroup_mode(text: str | None, mode: str) -> None:
    assert cgroup_mode(text) == mode


def test_parse_proc_devices_reads_only_the_character_section() -> None:
    text = (CAPTURES["h200"].parent / "README.md").read_text()  # not /proc/devices at all
    assert parse_proc_devices(text) == {}
    majors = parse_proc_devices(
        "Character devices:\n195 nvidia\n231 infiniband_verbs\n238 nvidia-uvm\n"
        "244 infiniband_verbs\n\nBlock devices:\n 7 loop\n"
    )
    assert majors == {"nvidia": [195], "infiniband_verbs": [231, 244], "nvidia-uvm": [238]}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/dev/nvidia0", ("nvidia", 0)),
        ("/dev/nvidia7", ("nvidia", 7)),
        ("/dev/nvidiactl", ("nvidiactl", 255)),
        ("/dev/nvidia-modeset", ("nvidia", 254)),
        ("/dev/nvidia-uvm", ("nvidia-uvm", 0)),
        ("/dev/nvidia-uvm-tools", ("nvidia-uvm", 1)),
        ("/dev/nvidia-caps", ("nvidia-caps", None)),
        ("/dev/nvidia-caps/nvidia-cap2", ("nvidia-caps", 2)),
        ("/dev/nvidia-caps-imex-channels/channel0", ("nvidia-caps-imex-channels", 0)),
        ("/dev/nvidia-nvswitch3", ("nvidia-nvswitch", 3)),
        ("/dev/nvidia-nvswitchctl", ("nvidia-nvswitch", 255)),
        ("/dev/dri", ("drm", None)),
        ("/dev/dri/renderD128", ("drm", 128)),
        ("/dev/net/tun", None),
        ("/dev/nvidia0\n", None),
    ],
)
def test_node_driver(path: str, expected: tuple[str, int | None] | None) -> None:
    assert node_driver(path) == expected


# -- LXC's cgroup2 device program (cgroup2_devices.c) ----------------------------------------


def switch_rules(*lines: str) -> list[Rule]:
    parsed = []
    for number, line in enumerate(lines, start=1):
        kind, _, value = line.partition(" ")
        rule = parse_device_rule(value)
        assert rule is not None
        parsed.append(Rule(kind == "allow", rule, ConfigLine(number, line)))
    return parsed


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ((), True),  # no rule: LXC attaches no program at all
        (("deny a",), True),  # the switch empties the list: still no program
        (("allow c 238:* rwm", "deny a"), True),
        (("deny a", "allow c 1:3 rwm"), False),
        (("deny a", "allow c 238:* rwm"), True),
        (("deny a", "allow c 238:0 rw"), True),
        (("deny a", "allow c 238:1 rw"), False),
        (("deny a", "allow c 238:* r"), False),  # rw is not within r
        (("deny a", "allow c 238:* rwm", "deny c 238:* rwm"), False),  # the same rule flips
        (("deny a", "allow c 238:* rwm", "deny c 238:0 rwm"), True),  # denies are skipped
        (("deny a", "allow a *:* rwm"), True),  # an ordinary rule matching every device
        (("allow a",), True),
        (("allow a", "deny c 238:* w"), True),  # rw is not within w: the deny never matches
        (("allow a", "deny c 238:* rw"), False),
        (("allow a", "deny c 238:* rw", "allow c 238:* rw"), True),
        (("deny a", "allow c 238:* rwm", "allow a"), True),
    ],
)
def test_lxc_cgroup2_program(lines: tuple[str, ...], expected: bool) -> None:
    assert bpf_allows(switch_rules(*lines), 238, 0) is expected


def test_empty_value_clears_the_rules_written_before(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.cgroup2.devices.allow:\n"
               "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    assert {f.status for f in evaluate(h200)} == {Status.FAIL}
    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE) + "lxc.cgroup2:\n"
               f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n")
    # Everything cleared, then one allow rule: an allow-list of nvidia-uvm alone.
    findings = evaluate(h200)
    assert {f.status for f in findings} == {Status.FAIL}
    assert [dict(f.evidence)["device"] for f in findings] == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_allow_rule_by_path_is_resolved_at_start(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.cgroup2.devices.allow: /dev/nvidia-uvm rwm\n"
               "lxc.cgroup2.devices.allow: /dev/nvidia-uvm-tools rwm\n" + GPU_MOUNTS)
    if not h200.path("/dev/nvidia-uvm").is_char_device():
        pytest.skip("the capture's device nodes are made only as root")
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS


# -- lxc.include ----------------------------------------------------------------------------


def test_included_profile_is_followed_and_its_stale_line_rewritten(
    h200: Sysroot, tmp_path: Path
) -> None:
    from tests.support.fixkit import fix_cycle

    h200.write("/etc/lxc/gpu.conf", "# shared\nlxc.cgroup2.devices.allow = c 195:* rwm\n"
               f"lxc.cgroup2.devices.allow = 'c {STALE}:* rwm'\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/gpu.conf\n"
               + GPU_MOUNTS)
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    ev = dict(findings[0].evidence)
    assert (ev["rule_path"], ev["rule_line"], ev["allowed_major"]) == (
        "/etc/lxc/gpu.conf", "3", STALE)
    assert "which the config includes" in findings[0].message
    plan, _, _, copy, _ = fix_cycle(h200, tmp_path)
    assert (copy / "etc/lxc/gpu.conf").read_text() == (
        "# shared\nlxc.cgroup2.devices.allow = c 195:* rwm\n"
        f"lxc.cgroup2.devices.allow = 'c {UVM_NOW}:* rwm'\n")
    sections = [s for s in plan.sections if s.remedy.check == "lxc.device_majors"]
    assert [len(s.actions) for s in sections] == [1, 0]  # uvm-tools shares uvm's line
    assert any("every container that includes it" in n for n in sections[0].remedy.notes)
    assert (copy / "etc/pve/lxc/101.conf").read_text() == h200.read("/etc/pve/lxc/101.conf")


def test_included_directory_reads_its_conf_files_in_order(h200: Sysroot) -> None:
    h200.write("/etc/lxc/gpu.d/10-rules.conf", "lxc.cgroup2.devices.allow = c 195:* rwm\n"
               f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/lxc/gpu.d/20-mounts.conf", GPU_MOUNTS.replace(": ", " = "))
    h200.write("/etc/lxc/gpu.d/notes.txt", "lxc.cgroup2.devices.deny = a\n")  # not *.conf
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/gpu.d/\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "4 bind-mounted GPU nodes" in finding.message
    assert dict(finding.evidence)["includes"] == (
        "/etc/lxc/gpu.d/10-rules.conf /etc/lxc/gpu.d/20-mounts.conf")


def test_include_loop_means_the_container_does_not_start(h200: Sysroot) -> None:
    # LXC has no bound: it reads a.conf, b.conf, a.conf ... until it runs out of file
    # descriptors and the config fails to load.
    h200.write("/etc/lxc/a.conf", "lxc.include = /etc/lxc/b.conf\n")
    h200.write("/etc/lxc/b.conf", "lxc.include = /etc/lxc/a.conf\n"
               "lxc.cgroup2.devices.allow = c 195:* rwm\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/a.conf\n"
               + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.WARN
    assert "a loop LXC follows until it fails" in finding.message
    assert "does not start" in finding.message
    assert evidence(finding)["include"] == "/etc/lxc/a.conf"
    # The same loop through a link (c.conf -> a.conf) is the same file.
    h200.write("/etc/lxc/b.conf", "lxc.include = /etc/lxc/c.conf\n")
    h200.symlink("/etc/lxc/c.conf", "a.conf")
    [finding] = evaluate(h200)
    assert finding.status is Status.WARN
    assert evidence(finding)["include"] == "/etc/lxc/c.conf"


def test_includes_deeper_than_the_bound_leave_the_verdict_open(h200: Sysroot) -> None:
    for level in range(10):
        h200.write(f"/etc/lxc/n{level}.conf", f"lxc.include = /etc/lxc/n{level + 1}.conf\n")
    h200.write("/etc/lxc/n10.conf", f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.include: /etc/lxc/n0.conf\n" + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "includes nest more than 8 deep" in finding.message


def test_nested_directories_are_read_as_lxc_reads_them(h200: Sysroot) -> None:
    # A directory (no trailing slash: stat says so) included from a file in an included
    # directory; only names ending in .conf, hidden ones too, no subdirectory walked.
    h200.write("/etc/lxc/gpu.d/10-base.conf", "lxc.cgroup2.devices.allow = c 195:* rwm\n"
               "lxc.include = /etc/lxc/profiles/uvm.d\n")
    h200.write("/etc/lxc/gpu.d/10-base.conf.bak", "lxc.cgroup2.devices.deny = a\n")
    h200.write("/etc/lxc/gpu.d/README", "lxc.cgroup2.devices.deny = a\n")
    h200.write("/etc/lxc/profiles/uvm.d/.20-uvm.conf",
               f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/lxc/profiles/uvm.d/sub/30-deny.conf", "lxc.cgroup2.devices.deny = a\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/gpu.d/\n"
               + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS, finding.message
    assert evidence(finding)["includes"] == (
        "/etc/lxc/gpu.d/10-base.conf /etc/lxc/profiles/uvm.d/.20-uvm.conf")
    # The hidden file holds the only uvm rule: without it nvidia-uvm is refused.
    h200.remove("/etc/lxc/profiles/uvm.d/.20-uvm.conf")
    assert {f.status for f in evaluate(h200)} == {Status.FAIL}


def test_relative_include_is_opened_from_where_lxc_starts(h200: Sysroot) -> None:
    # pct start runs lxc-start from a systemd unit, in /; plain LXC may be started anywhere.
    h200.write("/etc/lxc/gpu.conf", "lxc.cgroup2.devices.allow = c 195:* rwm\n"
               f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: etc/lxc/gpu.conf\n"
               + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert evidence(finding)["includes"] == "/etc/lxc/gpu.conf"
    h200.remove("/etc/pve/lxc/101.conf")
    h200.write("/var/lib/lxc/gpu1/config", "lxc.include = /usr/share/lxc/config/common.conf\n"
               "lxc.include = etc/lxc/gpu.conf\n" + GPU_MOUNTS.replace(": ", " = "))
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "a relative path, resolved from wherever LXC was started" in finding.message


def test_include_lxc_cannot_read_as_it_is_named_stops_the_start(h200: Sysroot) -> None:
    h200.write("/etc/lxc/gpu.conf", f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    # A file named with a trailing slash: opendir fails with ENOTDIR.
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.include: /etc/lxc/gpu.conf/\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.WARN
    assert "/etc/lxc/gpu.conf is a file, not a directory" in finding.message
    # A directory named *.conf inside an included directory: read() fails with EISDIR.
    h200.path("/etc/lxc/gpu.d/20-old.conf").mkdir(parents=True)
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.include: /etc/lxc/gpu.d\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.WARN
    assert evidence(finding)["include"] == "/etc/lxc/gpu.d/20-old.conf"
    assert "is a directory, which LXC reads as a file" in finding.message


def test_a_directory_of_more_files_than_the_bound_is_not_cut_silently(h200: Sysroot) -> None:
    for n in range(70):
        h200.write(f"/etc/lxc/many.d/{n:02d}.conf", "lxc.tty.max = 2\n")
    h200.write("/etc/lxc/many.d/99.conf", f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.include: /etc/lxc/many.d/\n" + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "holds more included files than this audit follows (64)" in finding.message


def test_links_are_followed_only_inside_the_paths_read(h200: Sysroot, tmp_path: Path) -> None:
    rules = ("lxc.cgroup2.devices.allow = c 195:* rwm\n"
             f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/lxc/profiles/gpu.conf", rules)
    h200.symlink("/etc/lxc/gpu.conf", "profiles/gpu.conf")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/gpu.conf\n"
               + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    # A link climbing out of the tree stays in it (the seam clamps it at the root), and a
    # target outside the paths read is not followed: the file beside the tree is never read.
    outside = h200.root.parent / "srv" / "gpu.conf"
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_text(rules)
    depth = "../" * (len(h200.root.parts) + 2)
    h200.remove("/etc/lxc/gpu.conf")
    h200.symlink("/etc/lxc/gpu.conf", f"{depth}{outside.relative_to('/')}")
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert f"is a link to /{outside.relative_to('/')}, which is not among the paths" in (
        finding.message)


def test_include_outside_the_read_paths_leaves_the_verdict_open(h200: Sysroot) -> None:
    h200.write("/root/gpu.conf", f"lxc.cgroup2.devices.allow = c {UVM_NOW}:* rwm\n")
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.include: /root/gpu.conf\n" + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "/root/gpu.conf is not among the paths this audit reads" in finding.message


def test_missing_included_file_means_the_container_does_not_start(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.include: /etc/lxc/gone.conf\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.WARN
    assert "does not start" in finding.message
    # A missing directory is skipped, as do_includedir does.
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.include: /etc/lxc/gone.d/\n")
    assert [f.status for f in evaluate(h200)] == [Status.PASS]


def test_lxc_shipped_files_are_assumed_where_the_tree_lacks_them(h200: Sysroot) -> None:
    # Unprivileged on Proxmox: userns.conf.d/01-pve.conf makes the list a deny-list, so a
    # stale allow line restricts nothing.
    h200.write("/etc/pve/.version", "{}\n")
    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE).replace("unprivileged: 0",
                                                                  "unprivileged: 1"))
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "deny-list" in finding.message
    assert "/usr/share/lxc/config/userns.conf" in dict(finding.evidence)["assumed"]


# -- the nvidia hook -------------------------------------------------------------------------

HOOK = ("lxc.hook.mount: /usr/share/lxc/hooks/nvidia\n"
        "lxc.environment: NVIDIA_VISIBLE_DEVICES={visible}\n")
ALLOW_LIST = "lxc.cgroup2.devices.deny: a\nlxc.cgroup2.devices.allow: c 195:* rwm\n"


def hook_config(visible: str, rules: str, unprivileged: bool = True) -> str:
    head = PVE_HEAD.replace("unprivileged: 0", f"unprivileged: {int(unprivileged)}")
    return head + HOOK.format(visible=visible) + rules


def test_hook_nodes_need_their_live_majors_allowed(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               hook_config("all", ALLOW_LIST + f"lxc.cgroup2.devices.allow: c {STALE}:* rwm\n"))
    findings = evaluate(h200)
    assert [dict(f.evidence)["device"] for f in findings] == ["/dev/nvidia-uvm",
                                                              "/dev/nvidia-uvm-tools"]
    assert {dict(f.evidence)["via"] for f in findings} == {"hook"}
    assert {dict(f.evidence)["allowed_major"] for f in findings} == {STALE}
    h200.write("/etc/pve/lxc/101.conf",
               hook_config("0", ALLOW_LIST + f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n"))
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "GPU nodes bound by the nvidia hook" in finding.message


@pytest.mark.parametrize("visible", ["void", ""])
def test_hook_that_binds_nothing_gives_no_gpu(h200: Sysroot, visible: str) -> None:
    h200.write("/etc/pve/lxc/101.conf", hook_config(visible, ALLOW_LIST))
    [finding] = evaluate(h200)
    assert (finding.status, finding.message) == (
        Status.PASS, "no GPU device nodes are mounted or passed through")


def test_hook_in_a_privileged_container_stops_its_start(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf",
               hook_config("all", ALLOW_LIST + f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n",
                           unprivileged=False))
    [finding] = evaluate(h200)
    assert finding.status is Status.FAIL
    assert "only works in unprivileged mode" in finding.message
    assert "does not start" in finding.message


def test_hook_with_mig_devices_needs_the_caps_major(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", hook_config(
        "all", ALLOW_LIST + f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n"
        "lxc.environment: NVIDIA_MIG_MONITOR_DEVICES=all\n"))
    devices = {dict(f.evidence)["device"] for f in evaluate(h200) if f.status is Status.FAIL}
    assert devices and all(d.startswith("/dev/nvidia-caps/") for d in devices)


# -- running containers ------------------------------------------------------------------------


def test_proxmox_container_running_with_its_last_starts_rules(h200: Sysroot) -> None:
    from tests.support.factories import make_report
    from tests.support.fixkit import plan_for

    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW))
    h200.write("/var/lib/lxc/101/config", plain_config(STALE).replace("lxc.cgroup.",
                                                                      "lxc.cgroup2."))
    assert [f.status for f in evaluate(h200)] == [Status.PASS]  # not running: next start
    h200.write("/sys/fs/cgroup/lxc/101/cgroup.type", "domain\n")
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert all("stays broken until restarted (pct reboot 101)" in f.message for f in findings)
    assert all(f"it still has the old rule 'lxc.cgroup2.devices.allow = c {STALE}:* rwm' "
               "(/var/lib/lxc/101/config:6)" in f.message for f in findings)
    assert all("the config on disk needs no change" in f.message for f in findings)
    assert {dict(f.evidence)["view"] for f in findings} == {"running"}
    plan = plan_for(h200, make_report(findings))
    [section, _] = [s for s in plan.sections if s.remedy.check == "lxc.device_majors"]
    assert not section.actions
    assert section.remedy.advice[0].argv == ("pct", "reboot", "101")


def test_running_container_whose_started_config_is_unseen_is_not_judged_running(
        h200: Sysroot) -> None:
    # Proxmox: the config pct start writes is missing.
    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW))
    h200.write("/sys/fs/cgroup/lxc/101/cgroup.type", "domain\n")
    config, running = evaluate(h200)
    assert (config.status, config.aspect) == (Status.PASS, "")
    assert (running.status, running.aspect) == (Status.SKIP, "running")
    assert "what it was started with is unknown: /var/lib/lxc/101/config, which pct start " \
           "writes, is missing" in running.message
    # Plain LXC on cgroup2: no file shows it; lxc-info asks the running monitor.
    h200.remove("/etc/pve/lxc/101.conf")
    h200.write("/var/lib/lxc/gpu1/config", plain_config(UVM_NOW).replace("lxc.cgroup.",
                                                                         "lxc.cgroup2."))
    h200.write("/sys/fs/cgroup/lxc.payload.gpu1/cgroup.type", "domain\n")
    config, running = evaluate(h200)
    assert config.status is Status.PASS and "runs with" not in config.message
    assert (running.status, running.aspect) == (Status.SKIP, "running")
    assert "'lxc-info -n gpu1 -c lxc.cgroup2.devices.allow' shows its rules" in running.message
    # A failing config says the running state is unknown rather than guessing it.
    h200.write("/var/lib/lxc/gpu1/config", plain_config(STALE).replace("lxc.cgroup.",
                                                                       "lxc.cgroup2."))
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert all("what it was started with is unknown" in f.message for f in findings)


def test_config_broken_after_the_start_runs_until_the_next_start(h200: Sysroot,
                                                                  tmp_path: Path) -> None:
    from tests.support.fixkit import fix_cycle

    h200.write("/etc/pve/lxc/101.conf", pve_config(STALE))
    h200.write("/var/lib/lxc/101/config", plain_config(UVM_NOW).replace("lxc.cgroup.",
                                                                        "lxc.cgroup2."))
    h200.write("/sys/fs/cgroup/lxc/101/cgroup.type", "domain\n")
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert all("which still allow it: it breaks at its next start" in f.message
               for f in findings)
    assert {evidence(f)["running_allows"] for f in findings} == {"yes"}
    plan, _, _, copy, _ = fix_cycle(h200, tmp_path)
    [section, _] = [s for s in plan.sections if s.remedy.check == "lxc.device_majors"]
    assert f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm" in (
        copy / "etc/pve/lxc/101.conf").read_text()
    assert "no restart is needed" in section.remedy.advice[0].text
    assert not section.remedy.advice[0].argv
    # Broken on disk and in its start alike: fix the file, then restart.
    h200.write("/var/lib/lxc/101/config", plain_config(STALE).replace("lxc.cgroup.",
                                                                      "lxc.cgroup2."))
    findings = evaluate(h200)
    assert all("which do not allow it either" in f.message and "pct reboot 101" in f.message
               for f in findings)


def test_plain_container_on_cgroup_v1_is_judged_by_its_devices_list(h200: Sysroot) -> None:
    h200.write("/proc/1/cgroup", HYBRID_CGROUP)
    h200.write("/var/lib/lxc/gpu1/config", plain_config(UVM_NOW))
    h200.write("/sys/fs/cgroup/devices/lxc.payload.gpu1/devices.list",
               f"c 1:3 rwm\nc 195:* rwm\nc {STALE}:* rwm\n")
    findings = evaluate(h200)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert all("lxc-stop -n gpu1 -r" in f.message for f in findings)
    h200.write("/sys/fs/cgroup/devices/lxc.payload.gpu1/devices.list", "a *:* rwm\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "it runs with the same access" in finding.message


@pytest.mark.parametrize(("instances", "logs", "restart"), [
    ("/var/lib/incus/containers", "/var/log/incus", "incus restart llm"),
    ("/var/snap/lxd/common/lxd/containers", "/var/snap/lxd/common/lxd/logs", "lxc restart llm"),
])
def test_incus_and_lxd_instances(h200: Sysroot, instances: str, logs: str,
                                 restart: str) -> None:
    h200.path(f"{instances}/llm").mkdir(parents=True)
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert "not running" in finding.message
    h200.write("/sys/fs/cgroup/lxc.payload.llm/cgroup.type", "domain\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "not readable" in finding.message
    generated = ("lxc.cgroup2.devices.deny = a\nlxc.cgroup2.devices.allow = c 195:* rwm\n"
                 "lxc.cgroup2.devices.allow = c {major}:* rwm\n"
                 "lxc.mount.entry = /var/lib/x/devices/llm/unix.dev-nvidia--uvm dev/nvidia-uvm "
                 "none bind,create=file 0 0\n")
    h200.write(f"{logs}/llm/lxc.conf", generated.format(major=STALE))
    [finding] = evaluate(h200)
    assert finding.status is Status.FAIL
    assert restart in finding.message
    h200.write(f"{logs}/llm/lxc.conf", generated.format(major=UVM_NOW))
    [finding] = evaluate(h200)
    assert finding.status is Status.PASS
    assert f"{logs}/llm/lxc.conf" in finding.message


# -- AMD ---------------------------------------------------------------------------------------


def test_amd_kfd_is_judged_and_named_in_the_fix(h200: Sysroot, tmp_path: Path) -> None:
    from tests.support.fixkit import fix_cycle

    h200.write("/proc/devices", h200.read("/proc/devices").replace(
        "Character devices:\n", "Character devices:\n234 kfd\n"))
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 226:* rwm\n"
               "lxc.cgroup2.devices.allow: c 235:* rwm\n"
               "lxc.mount.entry: /dev/kfd dev/kfd none bind,optional,create=file\n")
    [finding] = evaluate(h200)
    assert finding.status is Status.FAIL
    assert dict(finding.evidence)["driver_name"] == "kfd"
    assert (dict(finding.evidence)["allowed_major"], dict(finding.evidence)["current_major"]) == (
        "235", "234")
    plan, _, _, copy, _ = fix_cycle(h200, tmp_path)
    [section] = [s for s in plan.sections if s.remedy.check == "lxc.device_majors"]
    assert section.remedy.title == "allow /dev/kfd by its current major 234 (was 235)"
    assert "lxc.cgroup2.devices.allow: c 234:* rwm" in (copy / "etc/pve/lxc/101.conf").read_text()


def test_only_dynamic_majors_are_taken_for_stale_ones(h200: Sysroot) -> None:
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.cgroup2.devices.allow: c 195:* rwm\n"
               "lxc.cgroup2.devices.allow: c 136:* rwm\nlxc.cgroup2.devices.allow: c 10:200 rwm\n"
               + GPU_MOUNTS)
    for finding in evaluate(h200):
        assert dict(finding.evidence)["rule"] == ""


def test_huge_included_file_is_not_read(h200: Sysroot) -> None:
    h200.write("/etc/lxc/big.conf", "lxc.cgroup2.devices.allow = c 195:* rwm\n" * 20_000)
    h200.write("/etc/pve/lxc/101.conf", PVE_HEAD + "lxc.include: /etc/lxc/big.conf\n"
               + GPU_MOUNTS)
    [finding] = evaluate(h200)
    assert finding.status is Status.SKIP
    assert "larger than 256 KiB" in finding.message


def test_missing_include_and_privileged_hook_get_advice(h200: Sysroot) -> None:
    from tests.support.fixkit import plan_for

    h200.write("/etc/pve/lxc/101.conf", pve_config(UVM_NOW) + "lxc.include: /etc/lxc/gone.conf\n")
    h200.write("/etc/pve/lxc/102.conf", hook_config(
        "all", ALLOW_LIST + f"lxc.cgroup2.devices.allow: c {UVM_NOW}:* rwm\n",
        unprivileged=False))
    plan = plan_for(h200)
    titles = sorted(s.remedy.title for s in plan.sections
                    if s.remedy.check == "lxc.device_majors")
    assert titles == ["lxc.include /etc/lxc/gone.conf does not exist",
                      "the nvidia hook needs an unprivileged container"]
    assert not plan.actions


# -- the generated hosts -----------------------------------------------------------------------


def test_generated_pve9_reads_its_nested_includes(tmp_path: Path) -> None:
    from tests.support.hostgen.containers import PveSpec, build_pve9

    root = build_pve9(PveSpec()).write_dir(tmp_path / "pve9")
    by_id = {f.subject: f for f in evaluate(DirectoryHost(str(root)))}
    assert by_id["207"].status is Status.PASS
    # Relative, then a directory, a directory in it, and a link: README and .bak unread.
    assert evidence(by_id["207"])["includes"].endswith(
        " /etc/lxc/gpu.d/10-nvidia.conf /etc/lxc/profiles/uvm.d/20-uvm.conf "
        "/etc/lxc/gpu.d/30-mounts.conf")
    assert "5 bind-mounted GPU nodes" in by_id["207"].message
    root = build_pve9(PveSpec(stale_nested=True)).write_dir(tmp_path / "nested")
    failed = [f for f in evaluate(DirectoryHost(str(root))) if f.status is Status.FAIL]
    assert {(f.subject, evidence(f)["rule_path"]) for f in failed} == {
        ("207", "/etc/lxc/profiles/uvm.d/20-uvm.conf")}


def test_generated_link_out_of_the_root_is_never_read(tmp_path: Path) -> None:
    from tests.support.hostgen.containers import LxcSpec, build_lxc_host
    from tests.support.recording import RecordingHost

    root = build_lxc_host(LxcSpec(escaping_include=True, stale_plain=True)).write_dir(
        tmp_path / "lxc")
    host = RecordingHost(str(root))
    by_id = {(f.subject, f.aspect): f for f in LxcDeviceMajors().evaluate(host)}
    gpu1 = by_id[("gpu1", "")]
    assert gpu1.status is Status.SKIP
    assert "/etc/lxc/shared/gpu.conf is a link to /srv/lxc/gpu.conf" in gpu1.message
    assert not any(p.startswith("/srv") for p in host.asked)
    # Without the link gpu1 fails on its stale rule; it runs, and no file shows its start.
    root = build_lxc_host(LxcSpec(stale_plain=True)).write_dir(tmp_path / "plain")
    statuses = {(f.subject, f.aspect): f.status for f in evaluate(DirectoryHost(str(root)))}
    assert statuses[("gpu1", "")] is Status.FAIL
    root = build_lxc_host(LxcSpec()).write_dir(tmp_path / "fine")
    statuses = {(f.subject, f.aspect): f.status for f in evaluate(DirectoryHost(str(root)))}
    assert (statuses[("gpu1", "")], statuses[("gpu1", "running")]) == (Status.PASS,
                                                                        Status.SKIP)
