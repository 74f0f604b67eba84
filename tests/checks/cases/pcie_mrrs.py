"""pcie.mrrs: the H200 at 4096, lowered to 512, and a VM without PCIe endpoints."""

from auditor.model import Status
from tests.support.cases import Case, capture, generated
from tests.support.hostgen import HostSpec
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
]
