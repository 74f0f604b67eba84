"""PCI devices as sysfs shows them, and a defensive decoder of their config space.

Shared by the checks that look at PCI devices and the paths between them (``pcie.*``,
``iommu.mode``, ``numa.placement``, ``kernel.version``).
Everything here reads through the :class:`~auditor.hosts.base.Host` seam and treats
what it reads as untrusted: a sysroot may hold names that are not PCI addresses,
config files cut short, and capability lists that point anywhere or loop.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from auditor.checks.lib.pciconfig import CONFIG_READ_LIMIT, config_class, config_ids
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

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
_ADDRESS = lazy_re(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]", re.ASCII)


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


class PciDevice(NamedTuple):
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


def read_file(host: Host, path: str, limit: int = 4096) -> str | None:
    """Return a regular file's text (at most ``limit`` bytes), or None.

    None also for what is not a regular file: the host seam reads no FIFO or device node
    of a sysroot, capture or remote host (a FIFO would block the read forever), and
    sysfs attributes, procfs files and captures' files are all regular.
    """
    try:
        return host.read_text(path, limit)
    except OSError:
        return None


def read_hex(host: Host, path: str) -> int | None:
    """Return a sysfs hex value (``0x030200``), or None if missing or not hex."""
    text = (read_file(host, path) or "").strip()
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


def by_address(host: Host) -> dict[str, PciDevice]:
    """Return :func:`devices` keyed by address."""
    return {device.address: device for device in devices(host)}


# -- sysfs attributes beside config -----------------------------------------------------

#: Each reader's sysfs pattern: a check lists those it uses in its ``reads``.
#: Network functions' link speeds (Mb/s), under their network interfaces.
NET_SPEED_READS = (f"{PCI_DEVICES}/*/net/*/speed",)
#: Drivers of NICs built for the data path: 25 GbE and faster Ethernet, RoCE, InfiniBand and
#: the cloud providers' accelerated NICs. Onboard 1/2.5/10 GbE (igb, igc, e1000e, r8169,
#: tg3, ixgbe...), Wi-Fi and management ports carry no GPU traffic.
DATA_PATH_DRIVERS = frozenset({
    "mlx5_core", "mlx4_core", "bnxt_en", "ice", "i40e", "idpf", "irdma", "qede", "cxgb4",
    "ionic", "nfp", "sfc", "gve", "ena", "mana", "efa", "hfi1", "enic", "octeon_ep",
})
#: The slowest link speed (Mb/s) that makes an Ethernet function a data-path NIC.
DATA_PATH_MBPS = 25000
#: Ethernet and InfiniBand; "other network" (0x0280) is Wi-Fi and the like.
_DATA_PATH_CLASSES = frozenset({0x0200, INFINIBAND_CLASS})


def is_data_path_nic(host: Host, device: PciDevice) -> bool:
    """Return whether a network function carries GPU traffic: RDMA-capable, or high-speed.

    RDMA-capable (InfiniBand class, or an RDMA device of its own) or an Ethernet function
    of a data-path driver or one that reports 25 Gb/s or more. Onboard 1/2.5/10 GbE, Wi-Fi
    and management ports are not one: their MaxReadReq, placement and link power carry no
    GPU traffic (reads :data:`NET_SPEED_READS`).
    """
    if not device.is_network:
        return False
    if device.is_rdma_nic:
        return True
    if device.class_code is None or device.class_code >> 8 not in _DATA_PATH_CLASSES:
        return False
    if device.driver in DATA_PATH_DRIVERS:
        return True
    for path in host.glob(f"{device_path(device.address)}/net/*/speed")[:16]:
        speed = read_file(host, path, 64)
        if speed is not None and speed.strip().isdigit() and \
                int(speed.strip()[:9]) >= DATA_PATH_MBPS:
            return True
    return False


CONFIG_READS = (f"{PCI_DEVICES}/*/config",)
NUMA_READS = (f"{PCI_DEVICES}/*/numa_node", f"{PCI_DEVICES}/*/local_cpulist")
RESOURCE_READS = (f"{PCI_DEVICES}/*/resource", f"{PCI_DEVICES}/*/resource[0-5]_resize")
LINK_PM_READS = (f"{PCI_DEVICES}/*/link/*",)
RUNTIME_PM_READS = (f"{PCI_DEVICES}/*/power/control", f"{PCI_DEVICES}/*/power/runtime_status",
                    f"{PCI_DEVICES}/*/power/runtime_suspended_time")
AER_READS = (f"{PCI_DEVICES}/*/aer_dev_correctable", f"{PCI_DEVICES}/*/aer_dev_fatal",
             f"{PCI_DEVICES}/*/aer_dev_nonfatal", f"{PCI_DEVICES}/*/aer_rootport_total_err_*")
IOMMU_GROUP_READS = (f"{PCI_DEVICES}/*/iommu_group",)

#: Small sysfs attributes are a line; nothing here needs more.
_ATTRIBUTE_LIMIT = 4096
_NUMBER = lazy_re(r"-?[0-9]{1,19}", re.ASCII)


def read_attribute(host: Host, address: str, name: str) -> str | None:
    """Return a device attribute's text, stripped (at most 4 KiB), or None if unreadable."""
    text = read_file(host, f"{device_path(address)}/{name}", _ATTRIBUTE_LIMIT)
    return text.strip() if text is not None else None


def read_int(host: Host, address: str, name: str) -> int | None:
    """Return a device attribute holding a decimal integer, or None."""
    text = read_attribute(host, address, name)
    return int(text) if text is not None and _NUMBER.fullmatch(text) else None


def numa_node(host: Host, address: str) -> int | None:
    """Return the device's ``numa_node`` (-1 when firmware gave none), or None if unreadable."""
    return read_int(host, address, "numa_node")


_CPULIST = lazy_re(r"[0-9]{1,5}(?:-[0-9]{1,5})?(?:,[0-9]{1,5}(?:-[0-9]{1,5})?){0,1023}",
                   re.ASCII)


def local_cpulist(host: Host, address: str) -> str | None:
    """Return the device's ``local_cpulist`` when it is a well-formed CPU list, else None."""
    text = read_attribute(host, address, "local_cpulist")
    return text if text is not None and _CPULIST.fullmatch(text) else None


class Resource(NamedTuple):
    """One line of sysfs ``resource``: a BAR's start, end and flags."""

    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        """Return the size in bytes (0 for an unused BAR)."""
        return self.end - self.start + 1 if self.end > self.start else 0


#: BARs 0-5, the ROM, then bridge windows or SR-IOV BARs: never more than 17 lines.
_MAX_RESOURCE_LINES = 17
_RESOURCE_LINE = lazy_re(r"0x([0-9a-f]{1,16}) 0x([0-9a-f]{1,16}) 0x([0-9a-f]{1,16})", re.ASCII)


def resources(host: Host, address: str) -> list[Resource] | None:
    """Return the device's ``resource`` lines in order, or None if unreadable or malformed."""
    text = read_file(host, f"{device_path(address)}/resource", _ATTRIBUTE_LIMIT)
    if text is None:
        return None
    found: list[Resource] = []
    for line in text.splitlines()[:_MAX_RESOURCE_LINES]:
        match = _RESOURCE_LINE.fullmatch(line.strip())
        if match is None:
            return None
        found.append(Resource(*(int(group, 16) for group in match.groups())))
    return found


def resize_sizes(host: Host, address: str, bar: int) -> tuple[int, ...] | None:
    """Return the sizes (MiB) ``resource<bar>_resize`` offers, or None without the file.

    The file (kernel 6.1+) holds a hex bitmap: bit n set = 2^n MiB is supported
    (Documentation/ABI/testing/sysfs-bus-pci).
    """
    text = read_attribute(host, address, f"resource{bar}_resize")
    if text is None:
        return None
    bitmap = text.partition(":")[0].removeprefix("0x")
    if not bitmap or len(bitmap) > 16 or not all(c in "0123456789abcdefABCDEF" for c in bitmap):
        return None
    value = int(bitmap, 16)
    return tuple(1 << bit for bit in range(64) if value & (1 << bit))


#: ASPM link attributes (drivers/pci/pcie/aspm.c ``aspm_ctrl_attrs``): present on the
#: device at the lower end of a link, and on a downstream port for the link below it,
#: only for the states the link supports.
LINK_ASPM_STATES = ("l0s_aspm", "l1_aspm", "l1_1_aspm", "l1_2_aspm", "l1_1_pcipm", "l1_2_pcipm",
                    "clkpm")


def link_pm(host: Host, address: str) -> dict[str, str]:
    """Return the device's ``link/*`` ASPM attributes that read ``0`` or ``1``."""
    found: dict[str, str] = {}
    for name in LINK_ASPM_STATES:
        value = read_attribute(host, address, f"link/{name}")
        if value in ("0", "1"):
            found[name] = value
    return found


class RuntimePm(NamedTuple):
    """A device's runtime power management: who controls it and how long it slept."""

    control: str
    status: str
    suspended_ms: int | None


_WORD = lazy_re(r"[a-z][a-z_-]{0,31}", re.ASCII)


def runtime_pm(host: Host, address: str) -> RuntimePm | None:
    """Return ``power/control``, ``runtime_status`` and ``runtime_suspended_time``."""
    control = read_attribute(host, address, "power/control")
    if control is None or not _WORD.fullmatch(control):
        return None
    status = read_attribute(host, address, "power/runtime_status") or ""
    return RuntimePm(control, status if _WORD.fullmatch(status) else "",
                     read_int(host, address, "power/runtime_suspended_time"))


def iommu_group(host: Host, address: str) -> str | None:
    """Return the number of the device's IOMMU group, or None if it has none."""
    target = host.readlink(f"{device_path(address)}/iommu_group")
    if not target:
        return None
    name = target.rstrip("/").rsplit("/", 1)[-1]
    return name if name.isascii() and name.isdigit() and len(name) <= 6 else None


# -- AER statistics ------------------------------------------------------------------------

#: The kernel's names for the AER counters (drivers/pci/pcie/aer.c
#: ``aer_correctable_error_string`` / ``aer_uncorrectable_error_string``, 5.x and later),
#: keyed by the long names 4.19's files printed (the ABI document's sample output).
AER_LONG_NAMES = {
    "Receiver Error": "RxErr", "Bad TLP": "BadTLP", "Bad DLLP": "BadDLLP",
    "RELAY_NUM Rollover": "Rollover", "Replay Timer Timeout": "Timeout",
    "Advisory Non-Fatal": "NonFatalErr", "Corrected Internal Error": "CorrIntErr",
    "Header Log Overflow": "HeaderOF", "Data Link Protocol": "DLP",
    "Surprise Down Error": "SDES", "Poisoned TLP": "TLP", "Flow Control Protocol": "FCP",
    "Completion Timeout": "CmpltTO", "Completer Abort": "CmpltAbrt",
    "Unexpected Completion": "UnxCmplt", "Receiver Overflow": "RxOF", "Malformed TLP": "MalfTLP",
    "Unsupported Request": "UnsupReq", "ACS Violation": "ACSViol",
    "Uncorrectable Internal Error": "UncorrIntErr", "MC Blocked TLP": "BlockedTLP",
    "AtomicOp Egress Blocked": "AtomicOpBlocked", "TLP Prefix Blocked Error": "TLPBlockedErr",
}
AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal",
             "fatal": "aer_dev_fatal"}
_AER_MAX_LINES = 64


class AerCounters(NamedTuple):
    """One device's AER statistics since boot, by severity then counter name."""

    counters: dict[str, dict[str, int]]
    totals: dict[str, int]
    #: ``aer_rootport_total_err_*`` of a root port (messages from its whole hierarchy).
    rootport: dict[str, int]


def _aer_name(raw: str) -> str:
    name = AER_LONG_NAMES.get(raw, raw)
    return re.sub(r"[^A-Za-z0-9_]", "_", name[:48])


def aer_counters(host: Host, address: str) -> AerCounters | None:
    """Return the device's AER counters, or None when it has no ``aer_dev_*`` files."""
    counters: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for severity, name in AER_FILES.items():
        text = read_file(host, f"{device_path(address)}/{name}", _ATTRIBUTE_LIMIT)
        if text is None:
            continue
        values: dict[str, int] = {}
        for line in text.splitlines()[:_AER_MAX_LINES]:
            head, _, tail = line.strip().rpartition(" ")
            key = head.strip()
            if not (key and tail.isascii() and tail.isdigit() and len(tail) <= 20):
                continue
            count = int(tail)
            if key.startswith("TOTAL_ERR_"):
                totals[severity] = count
            else:
                values[_aer_name(key)] = count
        counters[severity] = values
        if severity not in totals:
            totals[severity] = sum(values.values())
    if not counters:
        return None
    rootport: dict[str, int] = {}
    for severity, suffix in (("correctable", "cor"), ("fatal", "fatal"),
                             ("nonfatal", "nonfatal")):
        value = read_int(host, address, f"aer_rootport_total_err_{suffix}")
        if value is not None and value >= 0:
            rootport[severity] = value
    return AerCounters(counters, totals, rootport)
