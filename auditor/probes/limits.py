"""The physical limit of a PCIe link, and the verdict of a measured figure against it.

A link's *payload limit* is its transfer rate times its width times the share of the bits
that carry data after line encoding:

- 2.5 and 5 GT/s (Gen1, Gen2): 8b/10b, 80%;
- 8, 16 and 32 GT/s (Gen3 to Gen5): 128b/130b, 98.46% (PCI Express Base Specification
  3.0, 4.2.2): Gen5 x16 is 32 x 16 x 128/130 / 8 = 63.0 GB/s per direction;
- 64 GT/s (Gen6) and 128 GT/s (Gen7): PAM4 signalling in FLIT mode, no line encoding
  (one transfer carries the bits it says), but every 256-byte flit holds 236 bytes of
  TLPs beside 6 of data-link payload, 8 of CRC and 6 of FEC (PCI Express Base
  Specification 6.0, 4.2.3.1 "Flit Mode"; PCI-SIG's "PCIe 6.0 Specification Webinar Q&A:
  FLIT Mode, PAM4 and FEC", https://pcisig.com/node/10944; G. Lockwood's summary
  https://glennklockwood.com/garden/PCIe-Gen6 works the same 236/256: 118 GB/s for
  Gen6 x16). Gen6 is held to those 236/256, so its limit counts what TLPs can use,
  where the figures of Gen1 to Gen5 count every bit past encoding.

What is left below that limit is protocol: TLP headers (12-16 bytes), framing, LCRC and
sequence numbers (8 bytes) per packet of at most MaxPayload bytes (256 on most hosts),
flow-control and ACK DLLPs, and a DMA read's request/completion turnaround. A healthy
Gen5 x16 GPU moves 55.5 GB/s of pinned copies, 88% of the 63.0 GB/s (measured on an
H200; nvbandwidth's README shows 26.0 GB/s = 82.5% of Gen4 x16), so a measured figure is
judged as a share of the payload limit: below 80% warns, below 50% fails (a link trained
at half its width or one generation down measures at most 50%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from auditor.model import Status

#: Encoding efficiency and the generation of each transfer rate sysfs can report (GT/s).
#: ``current_link_speed`` spells them "2.5 GT/s PCIe", "8.0 GT/s PCIe", "64.0 GT/s PCIe"
#: (drivers/pci/pci-sysfs.c, pci_speed_string()).
RATES: dict[Fraction, tuple[int, Fraction, str]] = {
    Fraction(5, 2): (1, Fraction(8, 10), "8b/10b"),
    Fraction(5): (2, Fraction(8, 10), "8b/10b"),
    Fraction(8): (3, Fraction(128, 130), "128b/130b"),
    Fraction(16): (4, Fraction(128, 130), "128b/130b"),
    Fraction(32): (5, Fraction(128, 130), "128b/130b"),
    Fraction(64): (6, Fraction(236, 256), "PAM4 FLIT, 236 TLP bytes a 256-byte flit"),
    Fraction(128): (7, Fraction(236, 256), "PAM4 FLIT, 236 TLP bytes a 256-byte flit"),
}
#: Widths a PCIe link can train at (x32 was specified and never built; allowed).
WIDTHS = (1, 2, 4, 8, 12, 16, 32)
_SPEED = re.compile(r"([0-9]{1,3})(?:\.([0-9]{1,2}))?\s*GT/s")

#: Defaults of the verdict: a share of the payload limit.
WARN_BELOW = 0.80
FAIL_BELOW = 0.50


def parse_speed(text: str | None) -> Fraction | None:
    """Return a link speed in GT/s from sysfs's spelling, or None (``Unknown``, garbage)."""
    if not text:
        return None
    match = _SPEED.search(text[:64])
    if match is None:
        return None
    whole, part = match.group(1), match.group(2) or "0"
    rate = Fraction(int(whole)) + Fraction(int(part), 10 ** len(part))
    return rate if rate in RATES else None


def parse_width(text: str | None) -> int | None:
    """Return a link width from sysfs (``16``, or ``x16`` as lspci writes it), or None."""
    if not text:
        return None
    value = text.strip().lower().removeprefix("x")
    if not value.isdigit() or len(value) > 3:
        return None
    width = int(value)
    return width if width in WIDTHS else None


@dataclass(frozen=True, order=True)
class Link:
    """A link's transfer rate (GT/s) and width (lanes)."""

    rate: Fraction
    width: int

    @property
    def generation(self) -> int:
        return RATES[self.rate][0]

    @property
    def encoding(self) -> str:
        return RATES[self.rate][2]

    @property
    def payload_gbps(self) -> float:
        """Return the payload limit per direction in GB/s (10^9 bytes a second)."""
        return payload_gbps(self.rate, self.width)

    @property
    def label(self) -> str:
        return f"Gen{self.generation} x{self.width}"

    @property
    def spelled(self) -> str:
        """Return the link as sysfs's speed and the width: ``32 GT/s x16``."""
        return f"{float(self.rate):g} GT/s x{self.width}"

    @classmethod
    def of_generation(cls, generation: object, width: object) -> Link | None:
        """Return the link of a generation number and a width (NVML reports these)."""
        if isinstance(generation, bool) or isinstance(width, bool):
            return None
        if not isinstance(generation, int) or not isinstance(width, int):
            return None
        rate = next((r for r, (g, _, _) in RATES.items() if g == generation), None)
        if rate is None or width not in WIDTHS:
            return None
        return cls(rate, width)

    @classmethod
    def parse(cls, speed: str | None, width: str | None) -> Link | None:
        rate, lanes = parse_speed(speed), parse_width(width)
        if rate is None or lanes is None:
            return None
        return cls(rate, lanes)


def payload_gbps(rate: Fraction, width: int) -> float:
    """Return rate (GT/s) x width x encoding efficiency / 8 bits: GB/s per direction."""
    _, efficiency, _ = RATES[rate]
    return float(rate * width * efficiency / 8)


def expected_link(gpu_max: Link | None, port_max: Link | None) -> Link | None:
    """Return the link the GPU should train at: the lower speed and width of both ends.

    Without the port above (a VM's GPU hangs off a virtual bridge, or the port is not
    known), the GPU's own maximum.
    """
    if gpu_max is None:
        return None
    if port_max is None:
        return gpu_max
    return Link(min(gpu_max.rate, port_max.rate), min(gpu_max.width, port_max.width))


def verdict(fraction: float, warn_below: float = WARN_BELOW,
            fail_below: float = FAIL_BELOW) -> Status:
    """Return the status of a figure measured at ``fraction`` of its physical limit."""
    if fraction < fail_below:
        return Status.FAIL
    if fraction < warn_below:
        return Status.WARN
    return Status.PASS
