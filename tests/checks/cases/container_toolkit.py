"""container.toolkit: /dev/char links under Docker's and containerd's systemd cgroup driver
(DGX-class, a Hyper-V VM under Kubernetes), CDI mode and cgroupfs, Ubuntu's ldconfig.real on
Debian, a rootless Docker, an unregistered default runtime, a RHEL node, inside a container."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, build_driver_host
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    hyperv_vm,
    rhel_metal,
    serving_files,
)
from tests.support.sysroot import Sysroot

CHECK = "container.toolkit"

CONFIG = """#accept-nvidia-visible-devices-as-volume-mounts = false
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "{ldconfig}"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"

[nvidia-container-runtime]
log-level = "info"
mode = "{mode}"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false
"""
DEVICES = ("Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n"
           "234 nvidia-caps\n508 nvidia-uvm\n509 nvidia-nvswitch\n\nBlock devices:\n  8 sd\n")


def toolkit(root: Sysroot, *, ldconfig: str = "@/sbin/ldconfig.real", mode: str = "auto",
            docker_json: str = '{"runtimes": {"nvidia": {"args": [], "path": '
                               '"nvidia-container-runtime"}}}\n') -> None:
    root.write("/etc/nvidia-container-runtime/config.toml",
               CONFIG.format(ldconfig=ldconfig, mode=mode))
    for name in ("nvidia-container-runtime", "nvidia-ctk", "nvidia-container-cli",
                 "dockerd"):
        root.write(f"/usr/bin/{name}", "#!/bin/false\n")
    root.write("/sbin/ldconfig.real", b"\x7fELF")
    root.write("/sbin/ldconfig", "#!/bin/sh\nexec /sbin/ldconfig.real \"$@\"\n")
    root.write("/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma\n")
    root.write("/proc/devices", DEVICES)
    if docker_json:
        root.write("/etc/docker/daemon.json", docker_json)


def links(root: Sysroot) -> None:
    toolkit(root)
    for path in sorted(root.root.glob("dev/nvidia*")):
        st = path.stat()
        import os
        major, minor = (os.major(st.st_rdev), os.minor(st.st_rdev)) if st.st_rdev else (0, 0)
        if st.st_rdev:
            root.symlink(f"/dev/char/{major}:{minor}", f"../{path.name}")


def udev_and_links(root: Sysroot) -> None:
    links(root)
    root.write("/lib/udev/rules.d/71-nvidia-dev-char.rules",
               'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/usr/bin/nvidia-ctk '
               'system create-dev-char-symlinks --create-all"\n')


def cgroupfs(root: Sysroot) -> None:
    toolkit(root, docker_json='{"exec-opts": ["native.cgroupdriver=cgroupfs"]}\n')


def cdi_mode(root: Sysroot) -> None:
    toolkit(root, mode="cdi")


def debian_real(root: Sysroot) -> None:
    toolkit(root)
    root.remove("/sbin/ldconfig.real")
    root.write("/sbin/ldconfig", b"\x7fELF")


def rootless(root: Sysroot) -> None:
    udev_and_links(root)
    root.write("/run/user/1000/docker.sock", "")


def default_unregistered(root: Sysroot) -> None:
    udev_and_links(root)
    root.write("/etc/docker/daemon.json", '{"default-runtime": "nvidia"}\n')


def kubernetes(root: Sysroot) -> None:
    toolkit(root, docker_json="")
    root.write("/etc/containerd/config.toml",
               'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.'
               'options]\n  SystemdCgroup = true\n[plugins."io.containerd.grpc.v1.cri".'
               'containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n')
    root.remove("/usr/bin/dockerd")


def rhel_containerd_cgroupfs(root: Sysroot) -> None:
    toolkit(root, ldconfig="@/sbin/ldconfig", docker_json="")
    root.remove("/usr/bin/dockerd")
    root.remove("/sbin/ldconfig.real")
    root.write("/etc/containerd/config.toml", "version = 2\n")


def debian() -> object:
    tree = build_driver_host(DriverSpec(distro="debian", hostname="deb-gpu-01", rdma_nics=2))
    serving_files(tree)
    return tree


CASES = [
    Case("toolkit not installed", Status.SKIP, base=base(dgx_class, "dgx")),
    Case("DGX-class, Docker on cgroup v2, no /dev/char links", Status.FAIL, toolkit,
         base=base(dgx_class, "dgx"), fixed=True),
    Case("DGX-class with the /dev/char links", Status.PASS, links,
         base=base(dgx_class, "dgx")),
    Case("DGX-class with the toolkit's udev rule and the links", Status.PASS, udev_and_links,
         base=base(dgx_class, "dgx")),
    Case("Docker with the cgroupfs driver", Status.PASS, cgroupfs,
         base=base(dgx_class, "dgx")),
    Case("the toolkit in CDI mode", Status.PASS, cdi_mode, base=base(dgx_class, "dgx")),
    Case("Debian with Ubuntu's @/sbin/ldconfig.real", Status.FAIL, debian_real,
         base=base(debian, "debian"), fixed=True),  # type: ignore[arg-type]
    Case("rootless Docker without no-cgroups", Status.WARN, rootless,
         base=base(dgx_class, "dgx")),
    Case("Docker's default runtime nvidia, not registered", Status.FAIL, default_unregistered,
         base=base(dgx_class, "dgx")),
    Case("Hyper-V VM under Kubernetes: containerd SystemdCgroup, no links", Status.FAIL,
         kubernetes, base=base(hyperv_vm, "hyperv"), fixed=True),
    Case("RHEL, containerd with cgroupfs, @/sbin/ldconfig", Status.PASS,
         rhel_containerd_cgroupfs, base=base(rhel_metal, "rhel")),
    Case("inside a Docker container", Status.SKIP, toolkit,
         base=base(docker_gpu_container, "docker")),
]
