"""gpu.memory: ECC, row remapping, retired pages and the recovery action of nvidia-smi's XML of
branches 470 to 580 and of NVML's state; the GPU state's failures, which this check owns."""

import copy

from auditor.model import Status
from tests.support.cases import Case, capture
from tests.support.hostgen.smi import (
    H200_NVML,
    SmiGpu,
    a100,
    both,
    plant_nvml,
    plant_smi,
    plant_status,
    rtx,
    v100,
)
from tests.support.sysroot import Sysroot

CHECK = "gpu.memory"


def lost() -> dict[str, object]:
    document = copy.deepcopy(H200_NVML)
    document["gpus"] = [{"index": 0, "bus_id": "0000:00:06.0",
                         "error": {"kind": "gpu_lost", "message": "GPU is lost"}}]
    return document


def in_container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "docker\n")


CASES = [
    Case("the lent H200 (R580): ECC on, nothing remapped", Status.PASS, plant_smi("580")),
    Case("NVML's state of the lent H200", Status.PASS, plant_nvml(H200_NVML)),
    Case("a V100 on R470: pages retired below the limit", Status.PASS,
         plant_smi("470", [v100(retired=(3, 1, "No"))])),
    Case("an A100 on R535, healthy", Status.PASS, plant_smi("535", [a100()])),
    Case("a consumer GPU without ECC", Status.PASS, plant_smi("580", [rtx()])),
    Case("uncorrectable ECC errors since the driver loaded (R535)", Status.FAIL,
         plant_smi("535", [a100(unc_volatile=2, unc_aggregate=2)])),
    Case("aggregate uncorrectable errors only: not judged", Status.PASS,
         plant_smi("550", [a100(unc_aggregate=3)])),
    Case("a row remapping failed", Status.FAIL,
         plant_smi("580", [SmiGpu(remap=(0, 4, "No", "Yes"))])),
    Case("the driver asks for a reset (recovery action)", Status.FAIL,
         plant_smi("580", [SmiGpu(recovery="Reset")])),
    Case("64 retired pages on a V100", Status.FAIL,
         plant_smi("470", [v100(retired=(60, 4, "No"))])),
    Case("a row remapping pending a reset", Status.WARN,
         plant_smi("580", [SmiGpu(remap=(0, 1, "Yes", "No"))])),
    Case("ECC turned off, pending a reset", Status.WARN,
         plant_smi("550", [a100(ecc=("Enabled", "Disabled"))])),
    Case("MIG turned on, pending a reset", Status.WARN,
         plant_smi("580", [SmiGpu(mig=("Disabled", "Enabled"))])),
    Case("ECC off on a data-center GPU", Status.WARN,
         plant_smi("535", [a100(ecc=("Disabled", "Disabled"))])),
    Case("ECC off on a data-center GPU, required by policy", Status.FAIL,
         plant_smi("535", [a100(ecc=("Disabled", "Disabled"))]), options=(("ecc", "required"),)),
    Case("NVML: the GPU is lost", Status.FAIL, plant_nvml(lost())),
    Case("nvidia-smi: the driver does not answer", Status.FAIL, plant_status(
        "exit 9\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n")),
    Case("nvidia-smi not installed: nvidia.driver judges", Status.SKIP,
         plant_status("exit 127\nnvidia-smi: command not found\n")),
    Case("version mismatch: nvidia.driver judges", Status.SKIP, plant_status(
        "exit 18\nFailed to initialize NVML: Driver/library version mismatch\n")),
    Case("no permission", Status.SKIP, plant_status(
        "exit 4\nFailed to initialize NVML: Insufficient Permissions\n")),
    Case("'Unknown Error' inside a container: the lost device cgroup", Status.FAIL,
         both(in_container, plant_status("exit 255\nFailed to initialize NVML: Unknown Error\n"))),
    Case("the GPU state was not collected", Status.SKIP, base=capture("h200")),
]
