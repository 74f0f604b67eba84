"""The paths of the GPU state's virtual files (see :mod:`auditor.hosts.gpustate`).

Only constants: checks declare these in ``reads`` at import, and a run that never reads
them must not pay for the collector or the parser.
"""

#: The directory of the virtual files, in the host's (or the capture's) root.
STATE_DIR = "/host-auditor"
SMI_XML = f"{STATE_DIR}/nvidia-smi.xml"
SMI_STATUS = f"{STATE_DIR}/nvidia-smi.status"
NVML_JSON = f"{STATE_DIR}/nvml.json"
KMSG = f"{STATE_DIR}/kmsg"
#: The GPU state's files, as a check declares them in ``reads`` (the kernel log aside).
READS: tuple[str, ...] = (NVML_JSON, SMI_XML, SMI_STATUS)
