"""PCIe topologies for generated hosts: root ports, switches, endpoints and VFs as sysfs has them.

A :class:`Function` is one PCI function with what the kernel shows of it: a 4096-byte
config space with a real capability list (Power Management, MSI, PCI Express) and
extended capabilities walked from 0x100 (AER, ACS, Resizable BAR, and a Null entry as
real GPUs carry), and beside it the sysfs attributes (``class``, ``resource``,
``resourceN_resize``, ``numa_node``, ``local_cpulist``, ``link/*_aspm``, ``power/*``,
``aer_dev_*``, ``iommu_group``, ``physfn``, ``driver``). :func:`write_topology` lays the
functions out as the kernel does: nested directories under ``/sys/devices/pciDDDD:BB``,
``/sys/bus/pci/devices/*`` symlinks into them, IOMMU groups with their ``type`` and
``devices`` links, and ``/sys/class/infiniband`` entries for RDMA functions. Real
``lspci -vvv`` decodes it and real ``setpci`` writes it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.support.hostgen.base import SPEEDS, Tree

ROOT_PORT, UPSTREAM, DOWNSTREAM, ENDPOINT = 0x4, 0x5, 0x6, 0x0
BRIDGE_CLASS = 0x060400
#: ACS Capability of a typical root or switch downstream port: SrcValid TransBlk ReqRedir
#: CmpltRedir UpstreamFwd EgressCtrl (no DirectTrans).
ACS_CAP = 0x003F
#: What the kernel writes when an IOMMU requests ACS (pci_std_enable_acs): SrcValid,
#: ReqRedir, CmpltRedir, UpstreamFwd (ACSCtl 0x001d, as in NVIDIA/nccl#2079).
ACS_KERNEL_ON = 0x001D

AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                   "CorrIntErr", "HeaderOF")
AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                     "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                     "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                     "PoisonTLPBlocked", "DMWrReqBlocked", "IDECheck", "MisIDETLP",
                     "PCRC_CHECK", "TLPXlatBlocked")
#: Status register bits of the AER capability, by counter name (pciutils lib/header.h).
_UNCORRECTABLE_BITS = {"DLP": 4, "SDES": 5, "TLP": 12, "FCP": 13, "CmpltTO": 14,
                       "CmpltAbrt": 15, "UnxCmplt": 16, "RxOF": 17, "MalfTLP": 18, "ECRC": 19,
                       "UnsupReq": 20, "ACSViol": 21, "UncorrIntErr": 22}
_CORRECTABLE_BITS = {"RxErr": 0, "BadTLP": 6, "BadDLLP": 7, "Rollover": 8, "Timeout": 12,
                     "NonFatalErr": 13, "CorrIntErr": 14, "HeaderOF": 15}
_MRRS_CODE = {128: 0, 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
MIB = 1 << 20


@dataclass
class Function:
    """One PCI function and everything sysfs shows of it."""

    address: str
    vendor: int
    device: int
    class_code: int
    port_type: int = ENDPOINT
    driver: str = ""
    subsystem: tuple[int, int] = (0, 0)
    #: Link Capabilities (max) and Link Status (current) speed code and width.
    speed: int = 5
    width: int = 16
    current_speed: int | None = None
    current_width: int | None = None
    mrrs: int = 4096
    mps: int = 256
    #: ASPM states the link supports (Link Capabilities 11:10) and has on (Link Control).
    aspm_support: int = 0x2
    aspm_control: int = 0
    #: ACS Control, or None for a function without the ACS capability.
    acs: int | None = None
    acs_cap: int = ACS_CAP
    #: AER capability and counters (counter name -> count) by severity.
    aer: bool = True
    aer_correctable: dict[str, int] = field(default_factory=dict)
    aer_nonfatal: dict[str, int] = field(default_factory=dict)
    aer_fatal: dict[str, int] = field(default_factory=dict)
    #: Write the aer_dev_* files (the kernel does when it owns AER).
    aer_files: bool = True
    #: A leading Null extended capability, as NVIDIA GPUs have.
    null_ecap: bool = False
    #: BAR sizes in bytes by index (0-5); a 64-bit BAR takes the next index too.
    bars: dict[int, int] = field(default_factory=dict)
    #: Resizable BAR: index -> supported sizes in MiB (the current size is the BAR's).
    rebar: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: Write resourceN_resize files for the Resizable BARs (kernel 6.1+).
    resize_files: bool = True
    numa_node: int | None = 0
    local_cpulist: str = ""
    iommu_group: int | None = None
    #: ``link/*`` attributes (name -> "0"/"1"), written as given.
    link: dict[str, str] = field(default_factory=dict)
    #: ``power/control``, ``runtime_status``, ``runtime_suspended_time`` (ms).
    power: tuple[str, str, int] | None = None
    #: The physical function's address, for an SR-IOV VF seen from the host.
    physfn: str | None = None
    #: An RDMA device name (``/sys/class/infiniband/<name>``).
    rdma: str = ""
    #: More attributes, by path below the device's directory.
    extra: dict[str, str] = field(default_factory=dict)
    children: list[Function] = field(default_factory=list)

    def add(self, child: Function) -> Function:
        self.children.append(child)
        return child

    def walk(self) -> Iterator[Function]:
        yield self
        for child in self.children:
            yield from child.walk()

    @property
    def bridge(self) -> bool:
        return self.class_code >> 8 == BRIDGE_CLASS >> 8

    @property
    def bus(self) -> int:
        return int(self.address[5:7], 16)


def _header(cap_id: int, version: int, following: int) -> int:
    return cap_id | version << 16 | following << 20


def config_space(fn: Function) -> bytes:
    """Return the function's 4096-byte config space."""
    cfg = bytearray(4096)
    struct.pack_into("<HH", cfg, 0, fn.vendor, fn.device)
    struct.pack_into("<HH", cfg, 0x04, 0x0406, 0x0010)  # Mem+ BusMaster+; capability list
    cfg[0x08] = 0xA1
    cfg[0x09:0x0C] = fn.class_code.to_bytes(3, "little")
    if fn.bridge:
        cfg[0x0E] = 0x01
        buses = sorted({d.bus for child in fn.children for d in child.walk()})
        if buses:
            cfg[0x18:0x1B] = bytes([fn.bus, buses[0], buses[-1]])
    else:
        struct.pack_into("<HH", cfg, 0x2C, *fn.subsystem)
    cfg[0x34] = 0x40
    cfg[0x40:0x42] = bytes([0x01, 0x50])
    struct.pack_into("<H", cfg, 0x42, 0x0003)
    cfg[0x50:0x52] = bytes([0x05, 0x70])
    exp = 0x70
    cfg[exp:exp + 2] = bytes([0x10, 0x00])
    slot = 0x0100 if fn.port_type in (ROOT_PORT, DOWNSTREAM) else 0
    struct.pack_into("<H", cfg, exp + 0x02, 0x0002 | fn.port_type << 4 | slot)
    struct.pack_into("<I", cfg, exp + 0x04, 0x00008000 | 0x5)
    control = _MRRS_CODE[fn.mrrs] << 12 | _MRRS_CODE[fn.mps] << 5 | 0x0010
    struct.pack_into("<H", cfg, exp + 0x08, control)
    struct.pack_into("<I", cfg, exp + 0x0C, fn.aspm_support << 10 | fn.width << 4 | fn.speed)
    struct.pack_into("<H", cfg, exp + 0x10, fn.aspm_control)
    active = 0x2000 if fn.port_type in (ROOT_PORT, DOWNSTREAM) else 0
    status = (fn.current_width or fn.width) << 4 | (fn.current_speed or fn.speed) | active
    struct.pack_into("<H", cfg, exp + 0x12, status)
    _extended(cfg, fn)
    return bytes(cfg)


def _extended(cfg: bytearray, fn: Function) -> None:
    """Lay the extended capabilities out from 0x100, each pointing at the next."""
    entries: list[tuple[int, int, bytes]] = []
    if fn.null_ecap:
        entries.append((0x0000, 0, b""))
    if fn.aer:
        entries.append((0x0001, 2, _aer_body(fn)))
    if fn.acs is not None:
        entries.append((0x000D, 1, struct.pack("<HH", fn.acs_cap, fn.acs)))
    if fn.rebar:
        entries.append((0x0015, 1, _rebar_body(fn)))
    offset = 0x100
    layout: list[tuple[int, int, int, bytes]] = []
    for cap_id, version, body in entries:
        layout.append((offset, cap_id, version, body))
        offset += (4 + len(body) + 0x17) & ~0x7  # room, aligned
    for index, (where, cap_id, version, body) in enumerate(layout):
        following = layout[index + 1][0] if index + 1 < len(layout) else 0
        struct.pack_into("<I", cfg, where, _header(cap_id, version, following))
        cfg[where + 4:where + 4 + len(body)] = body


def _aer_body(fn: Function) -> bytes:
    uncorrectable = 0
    for counts in (fn.aer_nonfatal, fn.aer_fatal):
        for name, count in counts.items():
            if count and name in _UNCORRECTABLE_BITS:
                uncorrectable |= 1 << _UNCORRECTABLE_BITS[name]
    correctable = 0
    for name, count in fn.aer_correctable.items():
        if count and name in _CORRECTABLE_BITS:
            correctable |= 1 << _CORRECTABLE_BITS[name]
    # Status, mask, severity (the spec's defaults), correctable status and mask (Advisory
    # Non-Fatal masked), capabilities and control, header log.
    body = struct.pack("<IIIIII", uncorrectable, 0x00100000, 0x00462030, correctable, 0x2000,
                       0x000000A0) + bytes(16)
    if fn.port_type == ROOT_PORT:
        body += struct.pack("<III", 0x7, 0, 0)
    return body


def _rebar_body(fn: Function) -> bytes:
    body = b""
    for index, (bar, sizes) in enumerate(sorted(fn.rebar.items())):
        supported = 0
        extended = 0
        for mib in sizes:
            bit = mib.bit_length() - 1
            if bit < 28:
                supported |= 1 << bit
            else:
                extended |= 1 << (bit - 28)
        current = max((fn.bars.get(bar, MIB) // MIB).bit_length() - 1, 0)
        count = len(fn.rebar) if index == 0 else 0
        body += struct.pack("<II", supported << 4, bar | count << 5 | current << 8
                            | extended << 16)
    return body


def _resource_lines(fn: Function) -> str:
    lines = []
    base = 0x38000000000 + (int(fn.address[5:7], 16) << 36)
    for index in range(13):
        size = fn.bars.get(index, 0)
        if size:
            flags = 0x14220C if size > 1 << 32 or index in (1, 3) else 0x40200
            lines.append(f"0x{base:016x} 0x{base + size - 1:016x} 0x{flags:016x}")
            base += max(size, 1 << 20)
        else:
            lines.append("0x" + "0" * 16 + " 0x" + "0" * 16 + " 0x" + "0" * 16)
    return "\n".join(lines) + "\n"


def _aer_file(counts: dict[str, int], names: tuple[str, ...], total: str) -> str:
    lines = [f"{name} {counts.get(name, 0)}" for name in names]
    lines.append(f"TOTAL_ERR_{total} {sum(counts.values())}")
    return "\n".join(lines) + "\n"


def write_topology(tree: Tree, roots: list[Function], *, group_types: dict[int, str] | None
                   = None) -> None:
    """Write root ports and everything below them into the tree, as the kernel lays sysfs."""
    groups: dict[int, list[tuple[str, str]]] = {}
    for root in roots:
        domain = f"/sys/devices/pci{root.address[:4]}:{root.address[5:7]}"
        tree.put(f"{domain}/power/control", "auto\n")
        _write(tree, root, domain, groups)
    for number, members in groups.items():
        kind = (group_types or {}).get(number, "identity")
        tree.put(f"/sys/kernel/iommu_groups/{number}/type", kind + "\n")
        for address, directory in members:
            tree.links[f"/sys/kernel/iommu_groups/{number}/devices/{address}"] = (
                "../../../.." + directory.removeprefix("/sys"))


def _write(tree: Tree, fn: Function, parent: str, groups: dict[int, list[tuple[str, str]]]
           ) -> None:
    directory = f"{parent}/{fn.address}"
    up = "../" * (directory.count("/") - 1)
    tree.put(f"{directory}/config", config_space(fn))
    for name, value in (("class", f"0x{fn.class_code:06x}"), ("vendor", f"0x{fn.vendor:04x}"),
                        ("device", f"0x{fn.device:04x}"),
                        ("subsystem_vendor", f"0x{fn.subsystem[0]:04x}"),
                        ("subsystem_device", f"0x{fn.subsystem[1]:04x}"),
                        ("irq", "0"), ("enable", "1"),
                        ("max_link_speed", SPEEDS.get(fn.speed, "Unknown")),
                        ("max_link_width", str(fn.width)),
                        ("current_link_speed", SPEEDS.get(fn.current_speed or fn.speed,
                                                          "Unknown")),
                        ("current_link_width", str(fn.current_width or fn.width))):
        tree.put(f"{directory}/{name}", value + "\n")
    tree.put(f"{directory}/resource", _resource_lines(fn))
    if fn.numa_node is not None:
        tree.put(f"{directory}/numa_node", f"{fn.numa_node}\n")
    if fn.local_cpulist:
        tree.put(f"{directory}/local_cpulist", fn.local_cpulist + "\n")
    if fn.resize_files:
        for bar, sizes in fn.rebar.items():
            bitmap = sum(1 << (mib.bit_length() - 1) for mib in sizes)
            tree.put(f"{directory}/resource{bar}_resize", f"{bitmap:016x}\n")
    for name, value in fn.extra.items():
        tree.put(f"{directory}/{name}", value)
    for name, value in fn.link.items():
        tree.put(f"{directory}/link/{name}", value + "\n")
    if fn.power is not None:
        control, status, suspended = fn.power
        tree.put(f"{directory}/power/control", control + "\n")
        tree.put(f"{directory}/power/runtime_status", status + "\n")
        tree.put(f"{directory}/power/runtime_suspended_time", f"{suspended}\n")
    if fn.aer and fn.aer_files:
        tree.put(f"{directory}/aer_dev_correctable",
                 _aer_file(fn.aer_correctable, AER_CORRECTABLE, "COR"))
        tree.put(f"{directory}/aer_dev_nonfatal",
                 _aer_file(fn.aer_nonfatal, AER_UNCORRECTABLE, "NONFATAL"))
        tree.put(f"{directory}/aer_dev_fatal",
                 _aer_file(fn.aer_fatal, AER_UNCORRECTABLE, "FATAL"))
        if fn.port_type == ROOT_PORT:
            below = [f for child in fn.children for f in child.walk()] + [fn]
            for suffix, attr in (("cor", "aer_correctable"), ("nonfatal", "aer_nonfatal"),
                                 ("fatal", "aer_fatal")):
                total = sum(sum(getattr(f, attr).values()) for f in below)
                tree.put(f"{directory}/aer_rootport_total_err_{suffix}", f"{total}\n")
    if fn.driver:
        tree.links[f"{directory}/driver"] = f"{up}bus/pci/drivers/{fn.driver}"
    if fn.physfn:
        tree.links[f"{directory}/physfn"] = f"../{fn.physfn}"
    if fn.iommu_group is not None:
        tree.links[f"{directory}/iommu_group"] = f"{up}kernel/iommu_groups/{fn.iommu_group}"
        groups.setdefault(fn.iommu_group, []).append((fn.address, directory))
    if fn.rdma:
        tree.links[f"/sys/class/infiniband/{fn.rdma}/device"] = (
            "../../.." + directory.removeprefix("/sys"))
    tree.links[f"/sys/bus/pci/devices/{fn.address}"] = "../../.." + directory.removeprefix(
        "/sys")
    for child in fn.children:
        _write(tree, child, directory, groups)


def root_port(address: str, *, vendor: int = 0x1022, device: int = 0x14AB, **kw: object
              ) -> Function:
    """Return a root port (AMD EPYC's by default)."""
    return Function(address, vendor, device, BRIDGE_CLASS, port_type=ROOT_PORT,
                    driver="pcieport", mrrs=512, **kw)  # type: ignore[arg-type]


def switch(parent: Function, upstream: str, downstream: list[str], *, vendor: int = 0x1000,
           device: int = 0xC030, **kw: object) -> list[Function]:
    """Add a PCIe switch (Broadcom PEX89xxx by default) below ``parent``; return its
    downstream ports."""
    up = parent.add(Function(upstream, vendor, device, BRIDGE_CLASS, port_type=UPSTREAM,
                             driver="pcieport", mrrs=512, **kw))  # type: ignore[arg-type]
    return [up.add(Function(address, vendor, device, BRIDGE_CLASS, port_type=DOWNSTREAM,
                            driver="pcieport", mrrs=512, **kw))  # type: ignore[arg-type]
            for address in downstream]



# -- a host of single-peer ports ---------------------------------------------------------------

_H100 = (0x10DE, 0x2330, 0x030200)
_NVME = (0x144D, 0xA80A, 0x010802)


def single_peer_ports(*, paired: bool = True) -> Tree:
    """Build an EPYC host with three root ports, ACS redirect on as the kernel sets it: one
    GPU alone below a root port, two GPUs below one switch (``paired``; else that root port
    is empty), and a switch with one GPU and an NVMe drive (no peer beside the GPU)."""
    from tests.support.hostgen.classes import HostFiles

    tree = Tree()
    release = "6.8.0-60-generic"
    HostFiles("acs-01", "amd", 64, ["0-31", "32-63"], release,
              f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/sda1 ro iommu=pt",
              iommu_units=["ivhd0"]).write(tree)
    alone = root_port("0000:00:01.1", acs=ACS_KERNEL_ON)
    alone.add(Function("0000:01:00.0", *_H100, driver="nvidia"))
    pair = root_port("0000:40:01.1", acs=ACS_KERNEL_ON)
    if paired:
        for port, gpu in zip(switch(pair, "0000:41:00.0", ["0000:42:00.0", "0000:42:01.0"],
                                    acs=ACS_KERNEL_ON), ("0000:43:00.0", "0000:44:00.0"),
                             strict=True):
            port.add(Function(gpu, *_H100, driver="nvidia"))
    mixed = root_port("0000:80:01.1", acs=ACS_KERNEL_ON)
    ports = switch(mixed, "0000:81:00.0", ["0000:82:00.0", "0000:82:01.0"], acs=ACS_KERNEL_ON)
    ports[0].add(Function("0000:83:00.0", *_H100, driver="nvidia"))
    ports[1].add(Function("0000:84:00.0", *_NVME, driver="nvme"))
    write_topology(tree, [alone, pair, mixed])
    return tree
