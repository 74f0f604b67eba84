"""gpu.pcie_live: the link the driver trained: width at any time, generation under load, a slot
that caps the GPU."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.smi import H200_NVML, SmiGpu, a100, plant_nvml, plant_smi

CHECK = "gpu.pcie_live"

CASES = [
    Case("the lent H200: Gen5 x16", Status.PASS, plant_smi("580")),
    Case("NVML's state of the lent H200", Status.PASS, plant_nvml(H200_NVML)),
    Case("Gen1 at idle: not judged", Status.PASS,
         plant_smi("580", [SmiGpu(gen=(1, 5, 5), util=0)])),
    Case("x8 of x16", Status.FAIL, plant_smi("580", [SmiGpu(width=(8, 16))])),
    Case("Gen3 under load", Status.FAIL, plant_smi("535", [a100(gen=(3, 4, 4), util=97)])),
    Case("the slot caps a Gen5 GPU at Gen4", Status.WARN,
         plant_smi("580", [SmiGpu(gen=(4, 4, 5))])),
]
