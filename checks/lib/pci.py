"""PCI devices as sysfs shows them, and a defensive decoder of their config space.

Shared by the checks that look at PCI devices (``pcie.mrrs``, ``kernel.version``).
Everything here reads through the :class:`~auditor.hosts.base.Host` seam and treats
what it reads as untrusted: a sysroot may hold names that are not PCI addresses,
config files cut short, and capability lists that point anywhere or loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from auditor.hosts.base import Host

PCI_DEVICES = "/sys/bus/pci/devices"
INFINIBAND = "/sys/class/infiniband"
#: What :func:`devices` reads: a check that uses it lists these in its ``reads``.
DEVICE_READS: tuple[str, ...] = (
    f"{PCI_DEVICES}/*",
    f"{PCI_DEVICES}/*/class",
    f"{PCI_DEVICES}/*/vendor",
    f"{PCI_DEVICES}/*/device",
    f"{PCI_DEVICES}/*/driver",
    f"{PCI_DEVICES}/*/physfn",
    f"{INFINIBAND}/*",
    f"{INFINIBAND}/*/device",
)

NVIDIA = 0x10DE
AMD_GPU = 0x1002
#: Base class / sub-class pairs (the upper 16 bits of the class code) of GPUs and
#: accelerators: VGA (0x0300), 3D controller (0x0302, data-centre NVIDIA parts), other
#: display controller (0x0380, AMD Instinct MI200) and processing accelerator (0x1200,
#: AMD Instinct MI300, Habana Gaudi).
GPU_CLASSES = frozenset({0x0300, 0x0302, 0x0380, 0x1200})
#: Vendors whose display or accelerator functions are GPUs an inference server uses. A
#: server's BMC display (ASPEED 0x1a03, Matrox 0x102b) and a VM's emulated display
#: (QEMU/Bochs 0x1234, Red Hat virtio 0x1af4, VMware 0x15ad, Cirrus 0x1013) share the
#: class codes and are not GPUs.
GPU_VENDORS = frozenset({NVIDIA, AMD_GPU, 0x1DA3, 0x8086})  # 0x1da3 Habana, 0x8086 Intel
#: Base class of network controllers; 0x0207 is InfiniBand.
NETWORK_BASE_CLASS = 0x02
INFINIBAND_CLASS = 0x0207
#: NVIDIA "bridge, other" functions are NVSwitches.
NVSWITCH_CLASS = 0x0680
BRIDGE_PCI_CLASS = 0x0604

#: ``domain:bus:device.function``; the domain has more than four digits behind
#: Intel VMD. Anything else in the directory is ignored, never interpolated.
_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]", re.ASCII)

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

VENDORS = {
    0x10DE: "NVIDIA",
    0x15B3: "Mellanox",
    0x8086: "Intel",
    0x14E4: "Broadcom",
    0x1002: "AMD",
    0x1022: "AMD",
    0x1AF4: "Red Hat (virtio)",
    0x1D0F: "Amazon",
}


class ConfigSpaceError(ValueError):
    """The config space bytes cannot be decoded; the message says why."""


class NeedsRoot(ConfigSpaceError):
    """Only the 64-byte header was readable: the capabilities need root."""


@dataclass(frozen=True)
class PcieCapability:
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

    @property
    def port_type_name(self) -> str:
        """Return the device/port type as the spec names it."""
        return PORT_TYPES.get(self.port_type, f"reserved type {self.port_type:#x}")

    @property
    def is_endpoint(self) -> bool:
        """Return whether the function is an endpoint (legacy included)."""
        return self.port_type in ENDPOINT_PORT_TYPES


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as sysfs shows it (no config space: that needs root past 64 bytes)."""

    address: str
    class_code: int | None
    vendor: int | None
    device: int | None
    driver: str
    #: An SR-IOV virtual function seen from the host (it has a ``physfn`` link).
    virtual_function: bool
    #: Its canonical sysfs path (``/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0``),
    #: "" when the entry is not a link (trees built by hand).
    path: str
    #: It has an RDMA device (``/sys/class/infiniband/*/device`` points at it).
    rdma: bool = False

    @property
    def is_gpu(self) -> bool:
        """Return whether the function is a GPU or accelerator an inference server uses.

        Judged by class and vendor: a BMC's or a VM's emulated display shares the class.
        """
        return (self.class_code is not None and (self.class_code >> 8) in GPU_CLASSES
                and self.vendor in GPU_VENDORS
                and not (self.vendor == 0x8086 and (self.class_code >> 8) != 0x1200))

    @property
    def is_nvidia_gpu(self) -> bool:
        """Return whether the function is an NVIDIA GPU."""
        return self.is_gpu and self.vendor == NVIDIA

    @property
    def is_network(self) -> bool:
        """Return whether the function is a network controller (Ethernet, InfiniBand, ...)."""
        return self.class_code is not None and self.class_code >> 16 == NETWORK_BASE_CLASS

    @property
    def is_rdma_nic(self) -> bool:
        """Return whether the function is an RDMA-capable NIC (InfiniBand class, or RoCE)."""
        return self.is_network and (self.rdma or (self.class_code or 0) >> 8 == INFINIBAND_CLASS)

    @property
    def is_nvswitch(self) -> bool:
        """Return whether the function is an NVIDIA NVSwitch."""
        return (self.vendor == NVIDIA and self.class_code is not None
                and self.class_code >> 8 == NVSWITCH_CLASS)

    @property
    def is_bridge(self) -> bool:
        """Return whether the function is a PCI-to-PCI bridge (a root or switch port)."""
        return self.class_code is not None and self.class_code >> 8 == BRIDGE_PCI_CLASS

    def ancestors(self) -> list[str]:
        """Return the addresses of the bridges above the function, nearest first."""
        parts = [p for p in self.path.split("/") if is_pci_address(p)]
        return list(reversed(parts[:-1])) if parts and parts[-1] == self.address else []


def _rdma_addresses(host: Host) -> set[str]:
    found: set[str] = set()
    try:
        names = host.listdir(INFINIBAND)
    except OSError:
        return found
    for name in names[:1024]:
        try:
            target = host.resolve(f"{INFINIBAND}/{name}/device")
        except OSError:
            continue
        last = target.rstrip("/").rsplit("/", 1)[-1]
        if is_pci_address(last):
            found.add(last)
    return found


def _read_devices(host: Host) -> tuple[PciDevice, ...]:
    rdma = _rdma_addresses(host)
    found: list[PciDevice] = []
    for address in pci_addresses(host):
        base = device_path(address)
        ids = device_ids(host, address, b"")
        try:
            resolved = host.resolve(base) if host.readlink(base) is not None else ""
        except OSError:
            resolved = ""
        found.append(PciDevice(
            address=address,
            class_code=device_class(host, address, b""),
            vendor=ids[0] if ids else None,
            device=ids[1] if ids else None,
            driver=driver_name(host, address),
            virtual_function=is_virtual_function(host, address),
            path=resolved if resolved.startswith("/sys/devices/") else "",
            rdma=address in rdma,
        ))
    return tuple(found)


def devices(host: Host) -> tuple[PciDevice, ...]:
    """Return every PCI function of the host as sysfs shows it, read once per host."""
    return host.fact("pci.devices", _read_devices)


def is_pci_address(name: str) -> bool:
    """Return whether a name is a PCI address such as ``0000:41:00.0``."""
    return _ADDRESS.fullmatch(name) is not None


def pci_addresses(host: Host) -> list[str]:
    """Return the PCI addresses under /sys/bus/pci/devices, ignoring any other name."""
    try:
        names = host.listdir(PCI_DEVICES)
    except OSError:
        return []
    return [name for name in names if is_pci_address(name)]


def device_path(address: str) -> str:
    """Return the sysfs path of a device by address."""
    return f"{PCI_DEVICES}/{address}"


def read_hex(host: Host, path: str) -> int | None:
    """Return a sysfs hex value (``0x030200``), or None if missing or not hex."""
    text = host.read_optional(path)
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def read_config(host: Host, address: str) -> bytes | None:
    """Return a device's config space bytes, or None if the file cannot be read."""
    try:
        return host.read_bytes(f"{device_path(address)}/config", CONFIG_READ_LIMIT)
    except OSError:
        return None


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


def device_class(host: Host, address: str, config: bytes | None = None) -> int | None:
    """Return the class code from sysfs ``class``, falling back to the config header."""
    value = read_hex(host, f"{device_path(address)}/class")
    if value is not None and 0 <= value <= 0xFFFFFF:
        return value
    if config is None:
        config = read_config(host, address)
    return config_class(config) if config else None


def device_ids(host: Host, address: str, config: bytes | None = None) -> tuple[int, int] | None:
    """Return (vendor id, device id) from sysfs, falling back to the config header."""
    base = device_path(address)
    vendor, device = read_hex(host, f"{base}/vendor"), read_hex(host, f"{base}/device")
    if vendor is not None and device is not None:
        return vendor & 0xFFFF, device & 0xFFFF
    if config is None:
        config = read_config(host, address)
    return config_ids(config) if config else None


def driver_name(host: Host, address: str) -> str:
    """Return the name of the driver bound to a device, or an empty string."""
    target = host.readlink(f"{device_path(address)}/driver")
    if not target:
        return ""
    name = target.rstrip("/").rsplit("/", 1)[-1]
    # The name ends up in messages and evidence: keep it printable.
    return name if name.isprintable() else repr(name)


def is_virtual_function(host: Host, address: str) -> bool:
    """Return whether a device is an SR-IOV virtual function (it has a ``physfn`` link)."""
    return host.readlink(f"{device_path(address)}/physfn") is not None


def vendor_name(vendor: int | None) -> str:
    """Return a short vendor name for messages, or the hex id."""
    if vendor is None:
        return "unknown vendor"
    return VENDORS.get(vendor, f"vendor {vendor:#06x}")


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
    )


def link_speed_name(code: int) -> str:
    """Return a link speed code as lspci spells it (``32GT/s``)."""
    return LINK_SPEEDS.get(code, f"unknown ({code})")
