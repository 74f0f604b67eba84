"""nccl.env: NCCL workarounds in /etc/nccl.conf, a user's ~/.nccl.conf, profile.d, serving
units and their EnvironmentFile; an image's baked-in P2P/IB disable inside a Docker
container; NCCL_IB_DISABLE without RDMA NICs; NCCL_P2P_LEVEL=NVL with and without
NVSwitch; vLLM's P2P cache saying false."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    hyperv_vm,
    rhel_metal,
)
from tests.support.sysroot import Sysroot

CHECK = "nccl.env"


def debug_only(root: Sysroot) -> None:
    root.write("/etc/nccl.conf", "NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=eth0\n")


def p2p_disabled(root: Sysroot) -> None:
    root.write("/etc/nccl.conf", "NCCL_DEBUG=WARN\nNCCL_P2P_DISABLE=1\n")


def image_workarounds(root: Sysroot) -> None:
    """TrelisResearch/one-click-llms PR #18, as an image's /etc/nccl.conf."""
    root.write("/etc/nccl.conf", "NCCL_P2P_DISABLE=1\nNCCL_IB_DISABLE=1\n")


def unit_environment(root: Sysroot) -> None:
    root.write("/etc/systemd/system/vllm.service",
               "[Unit]\nDescription=vLLM\n\n[Service]\nEnvironment=\"NCCL_P2P_DISABLE=1\" "
               "\"HF_HOME=/models\"\nExecStart=/opt/vllm/bin/vllm serve /models/llama\n")


def environment_file(root: Sysroot) -> None:
    root.write("/etc/systemd/system/sglang.service",
               "[Service]\nEnvironmentFile=-/etc/default/sglang\nExecStart=/usr/bin/true\n")
    root.write("/etc/default/sglang", "# sglang\nNCCL_SHM_DISABLE=1\nMODEL=/models/x\n")


def ib_disabled(root: Sysroot) -> None:
    root.write("/root/.nccl.conf", "NCCL_IB_DISABLE=1\n")


def level_nvl(root: Sysroot) -> None:
    root.write("/etc/nccl.conf", "NCCL_P2P_LEVEL=NVL\n")


def profile_export(root: Sysroot) -> None:
    root.write("/etc/profile.d/nccl.sh", "# workaround for hangs\nexport NCCL_P2P_DISABLE=1\n")


def vllm_cache(root: Sysroot) -> None:
    root.write("/home/svc/.cache/vllm/gpu_p2p_access_cache_for_0,1,2,3.json",
               '{"0->1": false, "0->2": false, "1->0": false, "2->3": true}\n')


CASES = [
    Case("no NCCL setting at all", Status.PASS, base=base(dgx_class, "dgx")),
    Case("/etc/nccl.conf with debug settings only", Status.PASS, debug_only,
         base=base(dgx_class, "dgx")),
    Case("/etc/nccl.conf disables P2P", Status.WARN, p2p_disabled,
         base=base(dgx_class, "dgx"), fixed=True),
    Case("Docker container: the image's nccl.conf disables P2P and IB", Status.WARN,
         image_workarounds, base=base(lambda: docker_gpu_container(rdma_nics=8), "docker"),
         fixed=True),
    Case("vllm.service Environment= with another variable on the line", Status.WARN,
         unit_environment, base=base(dgx_class, "dgx")),
    Case("sglang's EnvironmentFile disables SHM", Status.WARN, environment_file,
         base=base(rhel_metal, "rhel"), fixed=True),
    Case("root's ~/.nccl.conf disables IB on a host with RDMA NICs", Status.WARN, ib_disabled,
         base=base(hyperv_vm, "hyperv"), fixed=True),
    Case("NCCL_IB_DISABLE on a host without RDMA NICs", Status.PASS, ib_disabled,
         base=base(lambda: dgx_class(rdma_nics=0), "dgx-no-ib")),
    Case("NCCL_P2P_LEVEL=NVL with NVSwitches", Status.PASS, level_nvl,
         base=base(dgx_class, "dgx")),
    Case("NCCL_P2P_LEVEL=NVL on a PCIe-only RHEL host", Status.WARN, level_nvl,
         base=base(rhel_metal, "rhel"), fixed=True),
    Case("profile.d exports NCCL_P2P_DISABLE", Status.WARN, profile_export,
         base=base(hyperv_vm, "hyperv"), fixed=True),
    Case("vLLM's P2P cache says false", Status.WARN, vllm_cache, base=base(dgx_class, "dgx")),
]
