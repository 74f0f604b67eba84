"""pcie.bar1: a GPU's peer-mapping aperture (NVIDIA BAR1, AMD's VRAM BAR) left small.

Peer-to-peer mappings and GPUDirect RDMA reach a GPU's memory through its large BAR
(BAR1 on NVIDIA GPUs, BAR0 on AMD Instinct). With Resizable BAR off or "Above 4G
decoding" off in the BIOS, firmware leaves it at 256 MiB, and P2P between GPUs or NIC
to GPU crawls or fails (ROCm requires a large BAR for peer access). The size comes from
sysfs ``resource`` (line N: start, end, flags); the sizes the device offers from
``resourceN_resize`` (kernel 6.1+: bit n = 2^n MiB, Documentation/ABI/testing/
sysfs-bus-pci) or, as root, from its Resizable BAR extended capability (0x0015).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor import environment
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import pci, pciconfig
from auditor.checks.lib.gpupath import PEER_READS, peers
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

NVIDIA_PARAMS = "/proc/driver/nvidia/params"
NVIDIA_INFO = "/proc/driver/nvidia/gpus/*/information"
MODPROBE_FILE = "/etc/modprobe.d/zz-host-auditor-nvidia-rebar.conf"
SMALL_MIB = 256
MIB = 1 << 20
#: Which BAR is the memory aperture, by vendor.
APERTURE_BAR = {pci.NVIDIA: 1, pci.AMD_GPU: 0}
#: Memory (GiB) of data-centre and workstation GPUs, by (vendor, device): enough to know
#: a 256 MiB BAR is small where the GPU offers no Resizable BAR sizes to compare with.
GPU_MEMORY_GIB = {
    (pci.NVIDIA, 0x20B0): 40, (pci.NVIDIA, 0x20B2): 80, (pci.NVIDIA, 0x20B5): 80,
    (pci.NVIDIA, 0x20F1): 40, (pci.NVIDIA, 0x2330): 80, (pci.NVIDIA, 0x2331): 80,
    (pci.NVIDIA, 0x2321): 94, (pci.NVIDIA, 0x2335): 141, (pci.NVIDIA, 0x2901): 180,
    (pci.NVIDIA, 0x26B5): 48, (pci.NVIDIA, 0x26B9): 48, (pci.NVIDIA, 0x27B8): 24,
    (pci.AMD_GPU, 0x74A1): 192, (pci.AMD_GPU, 0x74A5): 256, (pci.AMD_GPU, 0x740C): 128,
}
_MODEL_GB = lazy_re(r"\b([0-9]{2,3}) ?GB\b", re.ASCII)


class Bar1Options(CheckOptions):
    """Options of ``pcie.bar1``."""

    min_bar_gib: int = option(
        0, minimum=0, maximum=4096,
        help="warn when the aperture is below this many GiB (0: only a small or "
             "not-resized BAR is a problem)")


#: sysfs ``resource`` flags (include/linux/ioport.h): a memory BAR, prefetchable, 64-bit.
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000


def aperture_bar(lines: Sequence[pci.Resource], vendor: int) -> int | None:
    """Return the register index of a GPU's memory aperture, found by its register.

    A BAR's sysfs line is its register's index (BAR n at config offset 0x10 + 4n), and a
    64-bit BAR takes two registers, the upper one's line left empty. The aperture is the
    first prefetchable memory BAR: BAR1 on a discrete NVIDIA GPU (after the 32-bit register
    BAR0), BAR2 on a Grace-attached one (its BAR0 is 64-bit), BAR0 on AMD Instinct. Lines
    without flags (hand-made trees) fall back to the vendor's usual index.
    """
    flagged = [(i, r) for i, r in enumerate(lines[:6]) if r.size and r.flags]
    for index, line in flagged:
        if line.flags & IORESOURCE_MEM and line.flags & IORESOURCE_PREFETCH:
            return index
    if flagged:
        return None
    usual = APERTURE_BAR.get(vendor)
    return usual if usual is not None and len(lines) > usual and lines[usual].size else None


def _mib(size: int) -> str:
    return f"{size // MIB} MiB" if size < 1 << 30 else f"{size / (1 << 30):g} GiB"


def _model_memory(host: Host, address: str) -> int | None:
    text = pci.read_file(host, f"/proc/driver/nvidia/gpus/{address}/information") or ""
    for line in text.splitlines()[:32]:
        if line.startswith("Model:"):
            found = _MODEL_GB.search(line[:120])
            return int(found.group(1)) if found else None
    return None


def _rebar_enabled(host: Host) -> str:
    text = pci.read_file(host, NVIDIA_PARAMS, 1 << 16) or ""
    for line in text.splitlines()[:256]:
        key, _, value = line.partition(":")
        if key.strip() == "EnableResizableBar":
            return value.strip()[:8]
    return ""


class PcieBar1(Check[Bar1Options]):
    """A GPU's peer aperture (NVIDIA BAR1) must not be left at 256 MiB when it can be larger."""

    id: ClassVar[str] = "pcie.bar1"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *PEER_READS,
        NVIDIA_PARAMS,
        NVIDIA_INFO,
        *pci.DEVICE_READS,
        *pci.RESOURCE_READS,
        *pci.CONFIG_READS,
        *environment.READS,
    )
    rationale: ClassVar[str] = (
        "Peer mappings between GPUs and GPUDirect RDMA reach GPU memory through its large BAR "
        "(NVIDIA BAR1). Firmware without Resizable BAR or Above 4G decoding leaves it at 256 "
        "MiB, which cripples P2P on 16 GB+ GPUs; with Re-Size BAR on, BAR1 covers the whole "
        "memory."
    )
    remedy: ClassVar[str] = (
        "In the BIOS: Above 4G Decoding on, Re-Size BAR Support on, CSM off. For NVIDIA, "
        "options nvidia NVreg_EnableResizableBar=1 in /etc/modprobe.d (rebuild the initramfs "
        "if the driver loads from it), then reboot. No runtime resize: it needs the driver "
        "unbound."
    )
    options_type: ClassVar[type[CheckOptions]] = Bar1Options

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment.environment(host)
        if env.in_container or env.vm:
            where = f"inside a {env.describe()}" if env.in_container else env.describe()
            yield self.skipped("pcie", f"{where}: BAR sizes are set by the host's firmware (and "
                               "for a guest by the hypervisor's); audit the host",
                               evidence={"environment": env.describe()})
            return
        found = peers(host)
        gpus = [d for d in found.gpus if d.vendor in APERTURE_BAR]
        if not gpus:
            yield self.skipped("pcie", "no NVIDIA or AMD GPU")
            return
        rebar_param = _rebar_enabled(host)
        for device in gpus:
            yield self._judge(host, device, found.traffic, found.describe(), rebar_param)

    def _judge(self, host: Host, device: pci.PciDevice, traffic: bool, who: str,
               rebar_param: str) -> Finding:
        what = f"{pci.vendor_name(device.vendor)} GPU"
        lines = pci.resources(host, device.address)
        found = aperture_bar(lines, device.vendor or 0) if lines is not None else None
        if lines is None or found is None:
            return self.skipped(device.address, f"{what}: sysfs resource lists no "
                                "prefetchable memory BAR (the peer aperture)")
        bar = found
        name = f"BAR{bar}"
        size = lines[bar].size
        supported = list(pci.resize_sizes(host, device.address, bar) or ())
        source = f"resource{bar}_resize" if supported else ""
        if not supported:
            config = pci.read_config(host, device.address)
            try:
                entries = pciconfig.decode_rebar(config) if config else []
            except pciconfig.ConfigSpaceError:
                entries = []
            for entry in entries:
                if entry.bar == bar:
                    supported, source = list(entry.supported_mib), "Resizable BAR capability"
        largest = max(supported) * MIB if supported else 0
        memory = GPU_MEMORY_GIB.get((device.vendor or 0, device.device or 0)) or \
            _model_memory(host, device.address)
        ev = {"bar": name, "size": _mib(size), "size_bytes": str(size),
              "supported": " ".join(_mib(s * MIB) for s in supported[-8:]),
              "supported_from": source, "memory_gib": str(memory or ""),
              "peers": who, "device": f"{device.device or 0:#06x}", "driver": device.driver}
        if device.vendor == pci.NVIDIA:
            ev["EnableResizableBar"] = rebar_param
        big = (memory or 0) >= 16 or largest >= 16 << 30
        small = size <= SMALL_MIB * MIB
        grow = f"; the device offers up to {_mib(largest)}" if largest > size else ""
        if small and big and traffic:
            return self.failed(
                device.address,
                f"{what}: {name} is {_mib(size)} on a "
                + (f"{memory} GB " if memory else "") + f"GPU with peer traffic ({who}){grow}: "
                "peer mappings and GPUDirect RDMA go through this aperture",
                observed=_mib(size), expected="the GPU's memory size (Resizable BAR)",
                evidence={**ev, "problem": "small"})
        if largest > size:
            return self.warned(
                device.address, f"{what}: {name} is {_mib(size)}{grow} ({source}): Resizable "
                "BAR is available but not applied",
                observed=_mib(size), expected=_mib(largest),
                evidence={**ev, "problem": "not-resized"})
        if self.options.min_bar_gib and size < self.options.min_bar_gib << 30:
            return self.warned(
                device.address, f"{what}: {name} is {_mib(size)}, below the policy's "
                f"{self.options.min_bar_gib} GiB", observed=_mib(size),
                expected=f">= {self.options.min_bar_gib} GiB",
                evidence={**ev, "problem": "below-policy"})
        return self.passed(device.address, f"{what}: {name} is {_mib(size)}"
                           + (" (the largest size it offers)" if largest and largest == size
                              else ""), observed=_mib(size), evidence=ev)

    # -- the fix --------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Name the BIOS settings; have the NVIDIA driver resize BAR1 at its next load."""
        from auditor.remedy import Advice, Remedy, RunCommand, WriteFile, evidence
        if not findings:
            return []
        nvidia = [f for f in findings if "EnableResizableBar" in evidence(f)]
        advice = [Advice("in the BIOS: Above 4G Decoding on, Re-Size BAR Support on, CSM off "
                         "(workstation cards: the NVIDIA Display Mode Selector set to a "
                         "headless mode); then reboot")]
        steps: list[Step] = []
        notes = ["a BIOS reset or update, CSM turned back on, or added devices that exhaust "
                 "the 64-bit MMIO window bring the small BAR back"]
        if nvidia and _rebar_enabled(host) != "1":
            steps.append(WriteFile(MODPROBE_FILE, "# Written by host-auditor: let the NVIDIA "
                                   "driver resize BAR1 to the GPU's memory.\noptions nvidia "
                                   "NVreg_EnableResizableBar=1\n"))
            ids = {context.os_release.get("ID", ""),
                   *context.os_release.get("ID_LIKE", "").split()}
            if ids & {"debian", "ubuntu"}:
                steps.append(RunCommand(("update-initramfs", "-u", "-k", "all"), after=(0,),
                                        undo=("update-initramfs", "-u", "-k", "all"),
                                        optional=True))
            elif ids & {"rhel", "fedora", "centos", "rocky", "almalinux"}:
                steps.append(RunCommand(("dracut", "-f", "--regenerate-all"), after=(0,),
                                        undo=("dracut", "-f", "--regenerate-all"),
                                        optional=True))
            notes.append("NVreg_EnableResizableBar takes effect when the nvidia module loads "
                         "next (reboot), and only if the BIOS offers Resizable BAR")
        elif nvidia:
            notes.append("NVreg_EnableResizableBar is already 1: the BIOS or the MMIO window "
                         "keeps BAR1 small")
        return [Remedy(
            check=self.id, subject="pcie",
            title="a full-size BAR1 (Resizable BAR)",
            persistent=tuple(steps), notes=tuple(notes), advice=tuple(advice), reboot=True,
        )]
