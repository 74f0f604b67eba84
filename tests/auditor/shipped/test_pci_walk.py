"""The PCI capability walk of the sysroot fixer, pinned against the check's decoder and
against real ``setpci`` (the booted machine's fixer) on one table of config spaces.

A fix writes a register where the walk says it is: where ``checks/lib/pci.py`` finds
the PCI Express or ACS capability, the sysroot engine (``auditor/shipped/sysroot_fix.py``)
and pciutils find it at the same offset; where the check finds none or refuses the list
(it loops, points into the header, runs past the bytes read), the fixer finds none, and
writes nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.checks.lib.pciconfig import (
    ConfigSpaceError,
    NeedsRoot,
    find_capability,
    find_extended_capability,
)
from auditor.shipped.sysroot_fix import capability_offset, extended_capability_offset
from tests.support.pciutils import args, needs_pciutils

EXP, ACS = 0x10, 0x0D
ADDRESS = "0000:00:01.0"


def config(size: int = 4096, *, header: int = 0, caps: bool = True, first: int = 0x40,
           chain: tuple[tuple[int, int, int], ...] = (), ext: tuple[tuple[int, int, int], ...]
           = (), cardbus: int = 0) -> bytes:
    """Build a config space: ``chain`` holds (offset, id, next) of the capability list,
    ``ext`` (offset, id, next) of the extended list; each capability's registers are
    filled with a pattern that names its offset, so a read says where it landed."""
    data = bytearray(max(size, 0x100))
    data[0:4] = (0x10DE | 0x2335 << 16).to_bytes(4, "little")
    data[0x06] = 0x10 if caps else 0
    data[0x0E] = header
    data[0x34] = first
    data[0x14] = cardbus  # where a CardBus bridge keeps its list
    for offset, cap_id, following in chain:
        for i in range(2, 0x3C):
            if offset + i < min(size, 0x100):
                data[offset + i] = (offset + i) & 0xFF
        data[offset], data[offset + 1] = cap_id, following
    for offset, cap_id, following in ext:
        for i in range(4, 0x40):
            if offset + i < len(data):
                data[offset + i] = (offset + i) & 0xFF
        data[offset:offset + 4] = (cap_id | 1 << 16 | following << 20).to_bytes(4, "little")
    return bytes(data[:size])


PCIE = ((0x40, 0x01, 0x50), (0x50, 0x05, 0x60), (0x60, EXP, 0x00))
#: (name, config space): every shape the walk must agree on.
TABLE: list[tuple[str, bytes]] = [
    ("PM, MSI, then PCI Express", config(chain=PCIE)),
    ("PCI Express first", config(first=0x80, chain=((0x80, EXP, 0x00),))),
    ("a bridge's list", config(header=1, chain=PCIE)),
    ("a multi-function device's header", config(header=0x80, chain=PCIE)),
    ("low bits of the pointers set", config(first=0x43, chain=(
        (0x40, 0x01, 0x53), (0x50, EXP, 0x00)))),
    ("no capability list bit", config(caps=False, chain=PCIE)),
    ("no PCI Express capability", config(chain=((0x40, 0x01, 0x50), (0x50, 0x05, 0x00)))),
    ("a list that loops", config(chain=((0x40, 0x01, 0x50), (0x50, 0x05, 0x40)))),
    ("a list that loops after PCI Express",
     config(chain=((0x40, 0x01, 0x60), (0x60, EXP, 0x40)))),
    ("a pointer into the header", config(first=0x10, chain=((0x10, EXP, 0x00),))),
    ("a next pointer into the header",
     config(chain=((0x40, 0x01, 0x20), (0x20, EXP, 0x00)))),
    ("a removed device's 0xff", config(chain=((0x40, 0xFF, 0x60), (0x60, EXP, 0x00)))),
    ("a CardBus bridge", config(header=2, chain=PCIE)),
    ("a CardBus bridge's own pointer", config(header=2, first=0x00, chain=PCIE,
                                              cardbus=0x40)),
    ("cut at 64 bytes (read without root)", config(64, chain=PCIE)),
    ("256 bytes, no extended space", config(256, chain=PCIE)),
    ("ACS first in extended space", config(chain=PCIE, ext=((0x100, ACS, 0x000),))),
    ("ACS after AER", config(chain=PCIE, ext=((0x100, 0x01, 0x148), (0x148, ACS, 0x000)))),
    ("AER only", config(chain=PCIE, ext=((0x100, 0x01, 0x000),))),
    ("an extended list that loops",
     config(chain=PCIE, ext=((0x100, 0x01, 0x148), (0x148, 0x0B, 0x100)))),
    ("an extended pointer back under 0x100",
     config(chain=PCIE, ext=((0x100, 0x01, 0x0C0), (0x148, ACS, 0x000)))),
    ("an empty extended header", config(chain=PCIE)),
]


def checked(find: Callable[[bytes, int], int | None], data: bytes, cap: int
            ) -> int | str | None:
    """Return what the check's decoder says: an offset, None, or "refused"."""
    try:
        return find(data, cap)
    except (ConfigSpaceError, NeedsRoot):
        return "refused"


@pytest.mark.parametrize(("name", "data"), TABLE, ids=[name for name, _ in TABLE])
def test_the_fixer_walks_the_list_as_the_check_does(name: str, data: bytes) -> None:
    for cap, check_walk, fixer_walk in (
            (EXP, find_capability, capability_offset),
            (ACS, find_extended_capability, extended_capability_offset)):
        found = checked(check_walk, data, cap)
        fixer = fixer_walk(data, cap)
        if isinstance(found, int):
            assert fixer == found, (name, hex(cap))
        else:  # none, or a list the check refuses: the fixer finds nothing to write
            assert fixer is None, (name, hex(cap), found, fixer)


@needs_pciutils
@pytest.mark.parametrize(("name", "data"), TABLE, ids=[name for name, _ in TABLE])
def test_setpci_reads_where_the_fixer_walks(name: str, data: bytes, tmp_path: Path) -> None:
    """Real setpci on the config space as a sysroot's sysfs holds it reads the register
    the fixer's walk names, wherever the fixer finds the capability."""
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / ADDRESS
    device.mkdir(parents=True)
    (device / "config").write_bytes(data)
    for cap, register, fixer_walk, offset in ((EXP, "CAP_EXP+08.w", capability_offset, 8),
                                              (ACS, "ECAP_ACS+06.w", extended_capability_offset,
                                               6)):
        base = fixer_walk(data, cap)
        if base is None:
            continue  # nothing written: pciutils' own answer is not the fixer's concern
        read = subprocess.run(["setpci", *args(tmp_path), "-s", ADDRESS, register],
                              capture_output=True, text=True, timeout=30, check=False)
        assert read.returncode == 0, (name, register, read.stderr)
        assert int(read.stdout.strip(), 16) == int.from_bytes(
            data[base + offset:base + offset + 2], "little"), (name, register)
