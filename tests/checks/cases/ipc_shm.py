"""ipc.shm: Docker's 64 MiB /dev/shm in an 8-GPU and a 1-GPU container, --shm-size and
--ipc=host, a Hyper-V VM and a DGX-class node with a tmpfs of half their RAM, Docker's
default for new containers on a host, logind's RemoveIPC on Slurm nodes (RHEL, SUSE), and a
capture without the mount table."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    grace_blackwell,
    hyperv_vm,
    rhel_metal,
    suse_metal,
)
from tests.support.sysroot import Sysroot

CHECK = "ipc.shm"


def docker_installed(root: Sysroot) -> None:
    root.write("/usr/bin/dockerd", "#!/bin/false\n")


def docker_default_16g(root: Sysroot) -> None:
    root.write("/etc/docker/daemon.json", '{\n  "runtimes": {"nvidia": {"path": '
               '"nvidia-container-runtime", "runtimeArgs": []}},\n'
               '  "default-shm-size": "16G"\n}\n')


def docker_with_runtime_only(root: Sysroot) -> None:
    root.write("/etc/docker/daemon.json", '{\n    "runtimes": {\n        "nvidia": {\n'
               '            "args": [],\n            "path": "nvidia-container-runtime"\n'
               '        }\n    }\n}\n')


def slurm(root: Sysroot) -> None:
    root.write("/etc/slurm/slurm.conf", "ClusterName=gpu\nSlurmctldHost=ctl01\n")
    root.write("/etc/systemd/logind.conf", "[Login]\n#KillUserProcesses=no\n#RemoveIPC=yes\n")


def slurm_remove_ipc_no(root: Sysroot) -> None:
    slurm(root)
    root.write("/etc/systemd/logind.conf.d/slurm.conf", "[Login]\nRemoveIPC=no\n")


def slurm_rhel(root: Sysroot) -> None:
    """RHEL's logind.conf documents its own compiled default: RemoveIPC=no."""
    root.write("/etc/slurm/slurm.conf", "ClusterName=gpu\n")
    root.write("/etc/systemd/logind.conf", "[Login]\n#RemoveIPC=no\n")


def ipc_host(root: Sysroot) -> None:
    """--ipc=host: the host's /dev/shm, a tmpfs without size= (half of RAM)."""
    mounts = root.read("/proc/mounts").replace("size=65536k,", "")
    root.write("/proc/mounts", mounts)


def shm_size_16g(root: Sysroot) -> None:
    root.write("/proc/mounts", root.read("/proc/mounts").replace("size=65536k", "size=16777216k"))


def kubernetes_emptydir(root: Sysroot) -> None:
    root.write("/proc/mounts", root.read("/proc/mounts").replace(
        "tmpfs /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64",
        "tmpfs /dev/shm tmpfs rw,relatime,size=8388608k,inode64"))


CASES = [
    Case("Docker container with 8 GPUs and the 64 MiB default", Status.FAIL,
         base=base(docker_gpu_container, "docker-8gpu")),
    Case("Docker container with 2 of 8 GPUs and the 64 MiB default", Status.FAIL,
         base=base(lambda: docker_gpu_container(gpus=2), "docker-2gpu")),
    Case("Docker container with one GPU: no shared memory between GPUs", Status.PASS,
         base=base(lambda: docker_gpu_container(gpus=1), "docker-1gpu")),
    Case("Docker container run with --ipc=host", Status.PASS, ipc_host,
         base=base(docker_gpu_container, "docker-ipc-host")),
    Case("Docker container run with --shm-size=16g", Status.PASS, shm_size_16g,
         base=base(docker_gpu_container, "docker-16g")),
    Case("Kubernetes pod: an 8 GiB emptyDir on /dev/shm", Status.PASS, kubernetes_emptydir,
         base=base(docker_gpu_container, "k8s")),
    Case("Docker container run with --ipc=none: no /dev/shm", Status.WARN,
         base=base(lambda: docker_gpu_container(shm=None), "docker-ipc-none")),
    Case("Hyper-V VM: /dev/shm is half of 2 TiB", Status.PASS, base=base(hyperv_vm, "hyperv")),
    Case("DGX-class host running Docker without default-shm-size", Status.WARN,
         docker_installed, base=base(dgx_class, "dgx"), fixed=True),
    Case("DGX-class host: daemon.json with the nvidia runtime, no default-shm-size",
         Status.WARN, docker_with_runtime_only, base=base(dgx_class, "dgx"), fixed=True),
    Case("DGX-class host: Docker's default-shm-size is 16G", Status.PASS, docker_default_16g,
         base=base(dgx_class, "dgx")),
    Case("Grace-Blackwell Slurm node: logind's RemoveIPC=yes default", Status.WARN, slurm,
         base=base(grace_blackwell, "gb200"), fixed=True),
    Case("SUSE Slurm node with RemoveIPC=no in a drop-in", Status.PASS, slurm_remove_ipc_no,
         base=base(suse_metal, "sles")),
    Case("RHEL Slurm node: RemoveIPC=no is the distribution's default", Status.PASS,
         slurm_rhel, base=base(rhel_metal, "rhel")),
    Case("capture without /proc/mounts", Status.SKIP, base=capture("h200")),
]
