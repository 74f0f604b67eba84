"""container.toolkit: device numbers, the cgroup driver's evidence, the /dev/char links fix."""

from __future__ import annotations

from pathlib import Path

from auditor.checks.container_toolkit import (
    _numbers_from_name,
    cgroup_driver,
    nvidia_nodes,
)
from auditor.checks.lib.docker import daemon_config
from auditor.hosts import DirectoryHost
from tests.support.hostgen.serving import base, dgx_class

MAJORS = {"nvidia-frontend": 195, "nvidia-uvm": 508}


def test_numbers_from_names_as_the_driver_gives_them() -> None:
    assert _numbers_from_name("nvidia3", MAJORS) == (195, 3)
    assert _numbers_from_name("nvidiactl", MAJORS) == (195, 255)
    assert _numbers_from_name("nvidia-modeset", MAJORS) == (195, 254)
    assert _numbers_from_name("nvidia-uvm-tools", MAJORS) == (508, 1)
    assert _numbers_from_name("nvidia-uvm", {}) is None


def test_nodes_seen_as_plain_files_take_numbers_from_proc_devices(tmp_path: Path) -> None:
    root = base(lambda: dgx_class(nvswitches=0, gpus=2), "dgx")(tmp_path)
    for path in root.root.glob("dev/nvidia*"):
        path.unlink()
        path.write_text("")  # as a capture made without device entries has them
    root.write("/proc/devices", "Character devices:\n195 nvidia-frontend\n508 nvidia-uvm\n")
    nodes = {n.path: n.link for n in nvidia_nodes(DirectoryHost(str(root.root)))}
    assert nodes["/dev/nvidia1"] == "/dev/char/195:1"
    assert nodes["/dev/nvidiactl"] == "/dev/char/195:255"
    assert nodes["/dev/nvidia-uvm-tools"] == "/dev/char/508:1"


def test_a_commented_systemd_cgroup_line_is_not_the_driver(tmp_path: Path) -> None:
    root = base(dgx_class, "dgx")(tmp_path)
    root.write("/etc/containerd/config.toml", "version = 2\n# SystemdCgroup = true\n")
    host = DirectoryHost(str(root.root))
    driver = cgroup_driver(host, daemon_config(host))
    assert driver is not None and not driver.systemd
    root.write("/etc/containerd/config.toml", "version = 2\n[x]\n  SystemdCgroup = true  # k8s\n")
    host = DirectoryHost(str(root.root))
    driver = cgroup_driver(host, daemon_config(host))
    assert driver is not None and driver.systemd
