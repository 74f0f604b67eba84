"""PCI configuration space, decoded: the capability list from 0x34 and the extended list
from 0x100 (walked as the kernel and lspci walk them, bounded, refusing a list that loops
or leaves the bytes read), the PCI Express capability's fields, ACS and Resizable BAR.

Pure functions of the bytes read from sysfs ``config``: :mod:`auditor.checks.lib.pci`
finds the devices and reads those bytes; the checks judge what is decoded here.
"""

from __future__ import annotations

from typing import NamedTuple

#: What an unprivileged read of sysfs ``config`` returns: the standard header only.
UNPRIVILEGED_CONFIG_BYTES = 64

#: Enough for the whole extended config space; the PCIe capability lives in the first 256.
CONFIG_READ_LIMIT = 4096

CAP_ID_PCIE = 0x10

_STATUS_CAP_LIST = 0x10

#: More capabilities than fit in 256 bytes means the list is corrupt (each takes >= 4).
_MAX_CAPS = 48

#: Bytes of the PCI Express capability this module decodes (through Link Status).
_PCIE_CAP_DECODED = 0x14

PORT_TYPES = {
    0x0: "endpoint",
    0x1: "legacy endpoint",
    0x4: "root port",
    0x5: "switch upstream port",
    0x6: "switch downstream port",
    0x7: "PCIe-to-PCI bridge",
    0x8: "PCI-to-PCIe bridge",
    0x9: "root complex integrated endpoint",
    0xA: "root complex event collector",
}

ENDPOINT_PORT_TYPES = frozenset({0x0, 0x1})

#: Link speed codes as Link Capabilities / Link Status encode them, in lspci's spelling.
LINK_SPEEDS = {1: "2.5GT/s", 2: "5GT/s", 3: "8GT/s", 4: "16GT/s", 5: "32GT/s", 6: "64GT/s"}


class ConfigSpaceError(ValueError):
    """The config space bytes cannot be decoded; the message says why."""


class NeedsRoot(ConfigSpaceError):
    """Only the 64-byte header was readable: the capabilities need root."""


class PcieCapability(NamedTuple):
    """The decoded fields of one function's PCI Express capability."""

    offset: int
    version: int
    port_type: int
    mps_supported: int
    mps: int
    mrrs: int
    mrrs_code: int
    max_link_speed: int
    max_link_width: int
    link_speed: int
    link_width: int
    #: Link Control (ASPM Control in bits 1:0: L0s, L1).
    link_control: int = 0
    #: Link Capabilities bits 11:10: the ASPM states the port supports.
    aspm_support: int = 0

    @property
    def port_type_name(self) -> str:
        """Return the device/port type as the spec names it."""
        return PORT_TYPES.get(self.port_type, f"reserved type {self.port_type:#x}")

    @property
    def is_endpoint(self) -> bool:
        """Return whether the function is an endpoint (legacy included)."""
        return self.port_type in ENDPOINT_PORT_TYPES


def _u16(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 2], "little")


def _u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "little")


def config_class(config: bytes) -> int | None:
    """Return the 24-bit class code from the config header, or None if too short."""
    if len(config) < 0x0C:
        return None
    return int.from_bytes(config[0x09:0x0C], "little")


def config_ids(config: bytes) -> tuple[int, int] | None:
    """Return (vendor id, device id) from the config header, or None if too short."""
    if len(config) < 4:
        return None
    return _u16(config, 0), _u16(config, 2)


def find_capability(config: bytes, cap_id: int) -> int | None:
    """Walk the capability list from 0x34; return the offset of ``cap_id`` or None.

    Raise :class:`NeedsRoot` when the list runs past a 64-byte (unprivileged) read
    and :class:`ConfigSpaceError` when it loops or points outside the config space.
    """
    if len(config) < UNPRIVILEGED_CONFIG_BYTES:
        raise ConfigSpaceError(
            f"config space is {len(config)} bytes, shorter than the 64-byte header"
        )
    if not _u16(config, 0x06) & _STATUS_CAP_LIST:
        return None
    header_type = config[0x0E] & 0x7F
    if header_type not in (0, 1):
        raise ConfigSpaceError(f"header type {header_type} has no capability list at 0x34")
    pointer = config[0x34] & 0xFC
    seen: set[int] = set()
    for _ in range(_MAX_CAPS + 1):
        if not pointer:
            return None
        if pointer < UNPRIVILEGED_CONFIG_BYTES or pointer > 0xFC:
            raise ConfigSpaceError(f"capability pointer {pointer:#x} is outside 0x40-0xfc")
        if pointer + 2 > len(config):
            if len(config) <= UNPRIVILEGED_CONFIG_BYTES:
                raise NeedsRoot("config space cut at 64 bytes: the capabilities need root")
            raise ConfigSpaceError(
                f"capability at {pointer:#x} lies past the {len(config)} bytes read"
            )
        if pointer in seen:
            raise ConfigSpaceError(f"capability list loops back to {pointer:#x}")
        seen.add(pointer)
        if config[pointer] == 0xFF:
            # All ones: a function gone from the bus. The kernel's walk ends here
            # (drivers/pci/pci.c, __pci_find_next_cap_ttl), as setpci's does.
            return None
        if config[pointer] == cap_id:
            return pointer
        pointer = config[pointer + 1] & 0xFC
    # Bounded by hops, not by the set alone: no walk of untrusted bytes may run unbounded.
    raise ConfigSpaceError(f"capability list is longer than {_MAX_CAPS} entries")


def decode_pcie_capability(config: bytes) -> PcieCapability | None:
    """Decode the PCI Express capability, or return None if the function has none."""
    offset = find_capability(config, CAP_ID_PCIE)
    if offset is None:
        return None
    if offset + _PCIE_CAP_DECODED > len(config):
        raise ConfigSpaceError(
            f"PCI Express capability at {offset:#x} runs past the {len(config)} bytes read"
        )
    flags = _u16(config, offset + 0x02)
    devcap = _u32(config, offset + 0x04)
    devctl = _u16(config, offset + 0x08)
    linkcap = _u32(config, offset + 0x0C)
    linkctl = _u16(config, offset + 0x10)
    linksta = _u16(config, offset + 0x12)
    mrrs_code = (devctl >> 12) & 0x7
    return PcieCapability(
        offset=offset,
        version=flags & 0xF,
        port_type=(flags >> 4) & 0xF,
        mps_supported=128 << (devcap & 0x7),
        mps=128 << ((devctl >> 5) & 0x7),
        mrrs=128 << mrrs_code,
        mrrs_code=mrrs_code,
        max_link_speed=linkcap & 0xF,
        max_link_width=(linkcap >> 4) & 0x3F,
        link_speed=linksta & 0xF,
        link_width=(linksta >> 4) & 0x3F,
        link_control=linkctl,
        aspm_support=(linkcap >> 10) & 0x3,
    )


def link_speed_name(code: int) -> str:
    """Return a link speed code as lspci spells it (``32GT/s``)."""
    return LINK_SPEEDS.get(code, f"unknown ({code})")

EXT_CAP_START = 0x100

EXT_CAP_ID_AER = 0x0001

EXT_CAP_ID_ACS = 0x000D

EXT_CAP_ID_REBAR = 0x0015

#: The kernel walks at most this many entries (drivers/pci/pci.c
#: ``pci_find_next_ext_capability``: ``ttl = (PCI_CFG_SPACE_EXP_SIZE - PCI_CFG_SPACE_SIZE) / 8``).
_MAX_EXT_CAPS = (CONFIG_READ_LIMIT - EXT_CAP_START) // 8


class ExtendedCapability(NamedTuple):
    """One entry of the extended capability list: its id, version and offset."""

    id: int
    version: int
    offset: int


def extended_capabilities(config: bytes) -> list[ExtendedCapability]:
    """Walk the extended capability list from 0x100 and return its entries in order.

    Walked as the kernel and lspci walk it: a header of 0 or all ones ends the list (a
    function without extended capabilities), the next pointer is bits 31:20 with the low
    two bits masked, and a pointer back into the first 256 bytes ends it. Raise
    :class:`NeedsRoot` when only the 64-byte header was readable and
    :class:`ConfigSpaceError` when the list loops or runs past the bytes read.
    """
    if len(config) <= UNPRIVILEGED_CONFIG_BYTES:
        raise NeedsRoot("config space cut at 64 bytes: the extended capabilities need root")
    if len(config) < EXT_CAP_START + 4:
        # 256 bytes: conventional PCI, or a platform without extended config access.
        return []
    found: list[ExtendedCapability] = []
    seen: set[int] = set()
    offset = EXT_CAP_START
    for _ in range(_MAX_EXT_CAPS):
        if offset + 4 > len(config):
            raise ConfigSpaceError(
                f"extended capability at {offset:#x} lies past the {len(config)} bytes read")
        header = _u32(config, offset)
        if header in (0, 0xFFFFFFFF):
            return found
        if offset in seen:
            raise ConfigSpaceError(f"extended capability list loops back to {offset:#x}")
        seen.add(offset)
        found.append(ExtendedCapability(header & 0xFFFF, (header >> 16) & 0xF, offset))
        offset = (header >> 20) & 0xFFC
        if offset < EXT_CAP_START:
            return found
    raise ConfigSpaceError(f"extended capability list is longer than {_MAX_EXT_CAPS} entries")


def find_extended_capability(config: bytes, cap_id: int) -> int | None:
    """Return the offset of the first extended capability ``cap_id``, or None."""
    for cap in extended_capabilities(config):
        if cap.id == cap_id:
            return cap.offset
    return None

#: ACS Capability / Control bits, in lspci's names (pciutils lib/header.h ``PCI_ACS_*``).
ACS_SOURCE_VALIDATION = 0x01

ACS_TRANSLATION_BLOCKING = 0x02

ACS_REQUEST_REDIRECT = 0x04

ACS_COMPLETION_REDIRECT = 0x08

ACS_UPSTREAM_FORWARDING = 0x10

ACS_EGRESS_CONTROL = 0x20

ACS_DIRECT_TRANSLATED = 0x40

ACS_FLAGS = (
    (ACS_SOURCE_VALIDATION, "SrcValid"),
    (ACS_TRANSLATION_BLOCKING, "TransBlk"),
    (ACS_REQUEST_REDIRECT, "ReqRedir"),
    (ACS_COMPLETION_REDIRECT, "CmpltRedir"),
    (ACS_UPSTREAM_FORWARDING, "UpstreamFwd"),
    (ACS_EGRESS_CONTROL, "EgressCtrl"),
    (ACS_DIRECT_TRANSLATED, "DirectTrans"),
)

#: The bits ``pci=disable_acs_redir=`` clears (drivers/pci/pci.c: PCI_ACS_RR | PCI_ACS_CR |
#: PCI_ACS_EC): the ones that stop peer traffic from being routed directly.
ACS_REDIRECT_BITS = ACS_REQUEST_REDIRECT | ACS_COMPLETION_REDIRECT | ACS_EGRESS_CONTROL


class AcsCapability(NamedTuple):
    """A function's ACS extended capability: where it is, what it offers, what is on."""

    offset: int
    capability: int
    control: int

    @property
    def redirect(self) -> int:
        """Return the redirect and egress bits set in ACS Control."""
        return self.control & ACS_REDIRECT_BITS


def acs_flags(value: int) -> str:
    """Return ACS bits as lspci prints them (``SrcValid+ TransBlk- ReqRedir+ ...``)."""
    return " ".join(f"{name}{'+' if value & bit else '-'}" for bit, name in ACS_FLAGS)


def acs_set_names(value: int) -> list[str]:
    """Return the names of the ACS bits set in ``value``."""
    return [name for bit, name in ACS_FLAGS if value & bit]


def decode_acs(config: bytes) -> AcsCapability | None:
    """Decode the ACS extended capability (0x000d), or return None if there is none."""
    offset = find_extended_capability(config, EXT_CAP_ID_ACS)
    if offset is None:
        return None
    if offset + 8 > len(config):
        raise ConfigSpaceError(f"ACS capability at {offset:#x} runs past the bytes read")
    return AcsCapability(offset, _u16(config, offset + 4), _u16(config, offset + 6))


class ResizableBar(NamedTuple):
    """One BAR of the Resizable BAR capability: its index, current and supported sizes."""

    bar: int
    current_mib: int
    supported_mib: tuple[int, ...]

#: The Resizable BAR capability lists at most six BARs.
_MAX_REBAR_ENTRIES = 6


def decode_rebar(config: bytes) -> list[ResizableBar]:
    """Decode the Resizable BAR capability (0x0015) as lspci's ``cap_rebar`` does.

    Capability register (entry +4): bits 31:4, bit n set = 2^n MiB supported; control
    (entry +8): BAR index 2:0, number of BARs 7:5 (first entry), current size 13:8
    (2^n MiB), more supported sizes 31:16 (bit n = 2^(n+28) MiB).
    """
    offset = find_extended_capability(config, EXT_CAP_ID_REBAR)
    if offset is None:
        return []
    entries: list[ResizableBar] = []
    count = 1
    index = 0
    while index < count:
        where = offset + 4 + 8 * index
        if where + 8 > len(config):
            raise ConfigSpaceError(f"Resizable BAR entry at {where:#x} runs past the bytes read")
        sizes = _u32(config, where) >> 4
        control = _u32(config, where + 4)
        if index == 0:
            count = (control >> 5) & 0x7
            if not 1 <= count <= _MAX_REBAR_ENTRIES:
                raise ConfigSpaceError(f"Resizable BAR capability lists {count} BARs")
        supported = [1 << bit for bit in range(28) if sizes & (1 << bit)]
        supported += [1 << (bit + 28) for bit in range(16) if (control >> 16) & (1 << bit)]
        entries.append(ResizableBar(control & 0x7, 1 << ((control >> 8) & 0x3F),
                                    tuple(supported)))
        index += 1
    return entries
