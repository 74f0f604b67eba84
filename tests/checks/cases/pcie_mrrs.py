"""pcie.mrrs: the H200 at 4096, lowered to 512, a VM without PCIe endpoints, the path."""

from auditor.model import Status
from tests.support.cases import Case, capture, generated
from tests.support.hostgen import HostSpec
from tests.support.hostgen.classes import (
    PcieBoxSpec,
    base,
    dgx_h100,
    grace_hopper,
    kvm_guest,
    mi300x,
    pcie_box,
)
from tests.support.plant import plant_mrrs

CHECK = "pcie.mrrs"

CASES = [
    Case("H200 at MaxReadReq 4096", Status.PASS),
    Case("H200 lowered to 512", Status.FAIL, plant_mrrs, fixed=True),
    Case("virtio devices only", Status.SKIP, base=capture("virtio")),
    Case("8 GPUs at 512 on the generated node", Status.FAIL,
         base=generated(HostSpec(cpus=16, bad_governor=False, deep_cstates=False,
                                 numa_balancing=False, old_kernel=False,
                                 stale_lxc_major=False)),
         fixed=True),
    Case("8-GPU box: a switch uplink trained at x8", Status.WARN,
         base=base(pcie_box, "pcie-box")),
    Case("8-GPU box with full uplinks", Status.PASS,
         base=base(lambda: pcie_box(PcieBoxSpec(degraded_uplink=False)), "pcie-box-clean")),
    Case("DGX H100 (VFs of the host not judged)", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("8x MI300X", Status.PASS, base=base(mi300x, "mi300x")),
    # The NVLink-C2C GPU is a skip, the NIC passes: the roll-up is the skip.
    Case("GH200: the GPU's host traffic is NVLink-C2C", Status.SKIP,
         base=base(grace_hopper, "gh200")),
    Case("KVM guest: VFs and emulated NICs not judged", Status.PASS,
         base=base(kvm_guest, "kvm-guest")),
]
