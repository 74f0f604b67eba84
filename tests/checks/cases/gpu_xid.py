"""gpu.xid: Xids of the kernel log judged by the catalog's resolution classes."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.smi import plant_kmsg

CHECK = "gpu.xid"
BUS = "PCI:0000:00:06"


def xid(code: int, text: str = "") -> str:
    return f"NVRM: Xid ({BUS}): {code}, pid=4242, name=python3, {text}"


CASES = [
    Case("no Xid since boot", Status.PASS,
         plant_kmsg("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04")),
    Case("63 (row remapping event) is catalog-ignorable", Status.PASS,
         plant_kmsg(xid(63, "Row Remapper Error"))),
    Case("92 (high single-bit rate) is catalog-ignorable", Status.PASS,
         plant_kmsg(xid(92, "High single-bit ECC error rate"))),
    Case("one 13 (an application's fault)", Status.PASS,
         plant_kmsg(xid(13, "Graphics Exception"))),
    Case("13 six times", Status.WARN, plant_kmsg(*[xid(13, "Graphics Exception")] * 6)),
    Case("48: double-bit ECC", Status.FAIL, plant_kmsg(xid(48, "DBE (0x1) has been detected"))),
    Case("79: fallen off the bus", Status.FAIL,
         plant_kmsg(xid(79, "GPU has fallen off the bus."))),
    Case("94: contained memory error", Status.FAIL, plant_kmsg(xid(94, "Contained: SM (0x1)"))),
    Case("95: uncontained memory error", Status.FAIL, plant_kmsg(xid(95, "Uncontained"))),
    Case("'GPU has fallen off the bus' without an Xid", Status.FAIL,
         plant_kmsg("NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.")),
    Case("119: GSP RPC timeout (RESET_GPU)", Status.FAIL, plant_kmsg(xid(119, "Timeout"))),
]
