"""Where the audit runs: bare metal, a VM guest, a container, from the files that say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.environment import READS, detect
from auditor.hosts import DirectoryHost
from tests.support.hostgen.base import Tree
from tests.support.hostgen.guests import (
    ContainerAuditSpec,
    KvmGuestSpec,
    build_container_audit,
    build_kvm_guest,
)
from tests.support.hostgen.platforms import build_epyc, build_grace
from tests.support.recording import RecordingHost, undeclared
from tests.support.sysroot import CAPTURES, extract_capture


def where(tree: Tree, tmp_path: Path) -> str:
    return detect(DirectoryHost(str(tree.write_dir(tmp_path / "t")))).describe()


def test_generated_hosts(tmp_path: Path) -> None:
    assert where(build_epyc(), tmp_path / "epyc") == "bare metal"
    # arm64 has no hypervisor flag: the DMI vendor (NVIDIA) says bare metal.
    assert where(build_grace(), tmp_path / "grace") == "bare metal"
    # QEMU's DMI strings, and kvm-clock tells KVM.
    assert where(build_kvm_guest(KvmGuestSpec()), tmp_path / "kvm") == "VM (kvm)"
    assert where(build_container_audit(ContainerAuditSpec()), tmp_path / "ct") == (
        "unprivileged container (lxc)")


@pytest.mark.parametrize(("files", "expected"), [
    ({"/.dockerenv": ""}, "container (docker)"),
    ({"/run/.containerenv": ""}, "container (podman)"),
    ({"/run/host/container-manager": "systemd-nspawn\n"}, "container (systemd-nspawn)"),
    ({"/proc/1/cgroup": "0::/lxc.payload.web/init.scope\n"}, "container (lxc)"),
    ({"/proc/1/cgroup": "0::/kubepods/besteffort/pod1/abc\n"}, "container (kubernetes)"),
    ({"/proc/1/uid_map": "0 1000 1\n"}, "unprivileged container (unknown container)"),
    ({"/proc/1/uid_map": "0 0 4294967295\n"}, "bare metal"),
    ({"/sys/hypervisor/type": "xen\n"}, "VM (xen)"),
    ({"/sys/hypervisor/type": "xen\n", "/proc/xen/capabilities": "control_d\n"}, "bare metal"),
    # A cloud "metal" instance: a cloud vendor string, no hypervisor flag on x86.
    ({"/proc/cpuinfo": "vendor_id\t: GenuineIntel\nflags\t\t: fpu vme\n",
      "/sys/class/dmi/id/sys_vendor": "Amazon EC2\n"}, "bare metal"),
    ({"/proc/cpuinfo": "vendor_id\t: GenuineIntel\nflags\t\t: fpu hypervisor\n",
      "/sys/class/dmi/id/sys_vendor": "Amazon EC2\n"}, "VM (amazon)"),
    ({"/proc/cpuinfo": "processor\t: 0\nFeatures\t: fp asimd\n",
      "/sys/class/dmi/id/sys_vendor": "QEMU\n"}, "VM (qemu)"),
    ({"/run/systemd/container": "lxc\n", "/proc/1/uid_map": "0 100000 65536\n",
      "/proc/cpuinfo": "vendor_id\t: AuthenticAMD\nflags\t\t: fpu hypervisor\n",
      "/sys/devices/system/clocksource/clocksource0/available_clocksource": "kvm-clock tsc\n"},
     "unprivileged container (lxc) in a VM (kvm)"),
])
def test_evidence(files: dict[str, str], expected: str, tmp_path: Path) -> None:
    tree = Tree()
    for path, text in files.items():
        tree.put(path, text)
    assert where(tree, tmp_path) == expected


@pytest.mark.parametrize(("files", "links", "expected"), [
    # A VM whose root filesystem was built from a container image (Firecracker, cloud
    # images): the marker files are left over, the PID namespace is the kernel's own.
    ({"/.dockerenv": "", "/run/systemd/container": "docker\n",
      "/proc/cpuinfo": "vendor_id\t: GenuineIntel\nflags\t\t: fpu hypervisor\n"},
     {"/proc/self/ns/pid": "pid:[4026531836]"}, "VM (unknown hypervisor)"),
    ({"/.dockerenv": ""}, {"/proc/1/ns/pid": "pid:[4026531836]"}, "bare metal"),
    # A real container: its own PID namespace, with or without a marker.
    ({"/.dockerenv": ""}, {"/proc/1/ns/pid": "pid:[4026532301]"}, "container (docker)"),
    ({}, {"/proc/self/ns/pid": "pid:[4026532301]"}, "container (unknown container)"),
    # pid 1's namespace (readable as root) is the one that counts, not the reader's.
    ({}, {"/proc/1/ns/pid": "pid:[4026531836]", "/proc/self/ns/pid": "pid:[4026532301]"},
     "bare metal"),
])
def test_the_pid_namespace_decides_over_leftover_markers(
    files: dict[str, str], links: dict[str, str], expected: str, tmp_path: Path
) -> None:
    tree = Tree()
    for path, text in files.items():
        tree.put(path, text)
    tree.links.update(links)
    assert where(tree, tmp_path) == expected


def test_hostile_files_are_bounded(tmp_path: Path) -> None:
    tree = Tree()
    tree.put("/run/systemd/container", "$(reboot)\n" + "x" * 100_000)
    tree.put("/proc/1/uid_map", "0 0 4294967295\n" * 10_000)
    tree.put("/proc/1/cgroup", ("12:x:/y\n" * 100_000) + "0::/docker/abc\n")
    env = detect(DirectoryHost(str(tree.write_dir(tmp_path / "t"))))
    assert env.container in ("", "unknown container")
    assert env.user_namespace


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_reads_are_declared(capture: str, tmp_path: Path) -> None:
    root = extract_capture(CAPTURES[capture], tmp_path / capture)
    host = RecordingHost(str(root))
    assert detect(host).vm
    assert undeclared(host.asked, READS) == []
