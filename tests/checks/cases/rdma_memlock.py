"""rdma.memlock: logins without a memlock line (DGX-class, a Hyper-V VM's 8 MiB), RHEL's
shipped rdma.conf, serving units with and without LimitMEMLOCK (Grace-Blackwell, SUSE with
slurmd), systemd's DefaultLimitMEMLOCK, Docker's default-ulimits, a running server's own
limit, Docker containers given RDMA NICs, and a host without one."""

from auditor.model import Status
from tests.support.cases import Case
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

CHECK = "rdma.memlock"
UNLIMITED = "* soft memlock unlimited\n* hard memlock unlimited\n"
VLLM = ("[Unit]\nDescription=vLLM\n\n[Service]\nUser=vllm\nExecStart=/opt/vllm/bin/vllm serve "
        "/models/llama\n{extra}\n[Install]\nWantedBy=multi-user.target\n")


def cloud_image_8m(root: Sysroot) -> None:
    root.write("/etc/security/limits.d/90-cloud.conf", "*    soft    memlock    8192\n"
               "*    hard    memlock    8192\n")


def logins_unlimited(root: Sysroot) -> None:
    root.write("/etc/security/limits.conf", "# /etc/security/limits.conf\n#*  soft  core  0\n")
    root.write("/etc/security/limits.d/rdma.conf", UNLIMITED)


def vllm_unit(root: Sysroot) -> None:
    logins_unlimited(root)
    root.write("/etc/systemd/system/vllm.service", VLLM.format(extra=""))


def vllm_unit_unlimited(root: Sysroot) -> None:
    logins_unlimited(root)
    root.write("/etc/systemd/system/vllm.service", VLLM.format(extra="LimitMEMLOCK=infinity\n"))


def vllm_default_unlimited(root: Sysroot) -> None:
    vllm_unit(root)
    root.write("/etc/systemd/system.conf", "[Manager]\n#DefaultLimitMEMLOCK=8M\n")
    root.write("/etc/systemd/system.conf.d/rdma.conf", "[Manager]\nDefaultLimitMEMLOCK=infinity\n")


def slurmd_unit(root: Sysroot) -> None:
    root.write("/usr/lib/systemd/system/slurmd.service",
               "[Unit]\nDescription=Slurm node daemon\n\n[Service]\nType=notify\n"
               "ExecStart=/usr/sbin/slurmd --systemd $SLURMD_OPTIONS\nLimitNOFILE=131072\n"
               "LimitMEMLOCK=infinity\nLimitSTACK=infinity\nDelegate=yes\n")


def slurm_node(root: Sysroot) -> None:
    logins_unlimited(root)
    slurmd_unit(root)


def docker_without_ulimits(root: Sysroot) -> None:
    logins_unlimited(root)
    root.write("/usr/bin/dockerd", "#!/bin/false\n")
    root.write("/etc/docker/daemon.json", '{"default-runtime": "nvidia", "runtimes": '
               '{"nvidia": {"path": "nvidia-container-runtime"}}}\n')


def triton_running_8m(root: Sysroot) -> None:
    logins_unlimited(root)
    root.write("/proc/4242/comm", "tritonserver\n")
    root.write("/proc/4242/limits",
               "Limit                     Soft Limit           Hard Limit           Units     \n"
               "Max open files            1048576              1048576              files     \n"
               "Max locked memory         8388608              8388608              bytes     \n")


def container_limit(value: str):  # type: ignore[no-untyped-def]
    def plant(root: Sysroot) -> None:
        root.write("/proc/1/limits",
                   "Limit                     Soft Limit           Hard Limit           Units\n"
                   f"Max locked memory         {value:<20} {value:<20} bytes\n")
    return plant


CASES = [
    Case("host without an RDMA NIC", Status.SKIP,
         base=base(lambda: dgx_class(rdma_nics=0), "dgx-no-ib")),
    Case("DGX-class: no memlock line for logins", Status.WARN, base=base(dgx_class, "dgx"),
         fixed=True),
    Case("Hyper-V VM: the cloud image limits logins to 8 MiB", Status.WARN, cloud_image_8m,
         base=base(hyperv_vm, "hyperv"), fixed=True),
    Case("RHEL: rdma-core's limits.d/rdma.conf", Status.PASS, base=base(rhel_metal, "rhel")),
    Case("Grace-Blackwell: vllm.service without LimitMEMLOCK", Status.WARN, vllm_unit,
         base=base(grace_blackwell, "gb200"), fixed=True),
    Case("Grace-Blackwell: vllm.service with LimitMEMLOCK=infinity", Status.PASS,
         vllm_unit_unlimited, base=base(grace_blackwell, "gb200")),
    Case("DefaultLimitMEMLOCK=infinity in system.conf.d", Status.PASS, vllm_default_unlimited,
         base=base(grace_blackwell, "gb200")),
    Case("SUSE Slurm node: slurmd.service with LimitMEMLOCK=infinity, logins unlimited",
         Status.PASS, slurm_node,
         base=base(suse_metal, "sles")),
    Case("DGX-class running Docker without default-ulimits", Status.WARN,
         docker_without_ulimits, base=base(dgx_class, "dgx"), fixed=True),
    Case("a running tritonserver has 8 MiB", Status.FAIL, triton_running_8m,
         base=base(dgx_class, "dgx")),
    Case("Docker container with RDMA NICs and a 64 MiB limit", Status.FAIL,
         container_limit("67108864"),
         base=base(lambda: docker_gpu_container(rdma_nics=8), "docker-ib")),
    Case("Docker container run with --ulimit memlock=-1", Status.PASS,
         container_limit("unlimited"),
         base=base(lambda: docker_gpu_container(rdma_nics=8), "docker-ib")),
]
