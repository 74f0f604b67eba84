"""numa.placement: a NIC on the wrong node, a GPU without one, one node, guests."""

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.hostgen.classes import (
    PcieBoxSpec,
    base,
    dgx_h100,
    grace_hopper,
    kvm_guest,
    pcie_box,
)

CHECK = "numa.placement"

CASES = [
    Case("8-GPU box: a NIC on another node than its GPUs, a GPU with node -1", Status.WARN,
         base=base(pcie_box, "pcie-box")),
    Case("8-GPU box placed by firmware", Status.PASS,
         base=base(lambda: pcie_box(PcieBoxSpec(numa=False)), "pcie-box-clean")),
    Case("DGX H100", Status.PASS, base=base(dgx_h100, "dgx-h100")),
    Case("GH200: one node with CPUs", Status.SKIP, base=base(grace_hopper, "gh200")),
    Case("KVM guest with two virtual nodes", Status.SKIP, base=base(kvm_guest, "kvm-guest")),
    Case("H200 VM capture", Status.SKIP, base=capture("h200")),
]
