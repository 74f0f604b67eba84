"""checks/lib/pci: the extended capability walker and its decoders, checked against real
lspci on every generated class of host, and the sysfs readers against hostile files."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.checks.lib import pci, pciconfig
from auditor.hosts import DirectoryHost
from tests.support.hostgen.base import Tree
from tests.support.hostgen.classes import dgx_h100, grace_hopper, kvm_guest, mi300x, pcie_box
from tests.support.pciutils import lspci, needs_pciutils

HOSTS: dict[str, Callable[[], Tree]] = {
    "pcie-box": pcie_box, "dgx-h100": dgx_h100, "mi300x": mi300x, "gh200": grace_hopper,
    "kvm-guest": kvm_guest,
}
ECAP_NAMES = {0x0000: "Null", 0x0001: "Advanced Error Reporting",
              0x000D: "Access Control Services", 0x0015: "Physical Resizable BAR"}


@pytest.fixture(scope="module", params=sorted(HOSTS))
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Path:
    name = request.param
    return HOSTS[name]().write_dir(tmp_path_factory.mktemp(name))


@needs_pciutils
def test_extended_capabilities_and_their_decoding_agree_with_lspci(generated: Path) -> None:
    host = DirectoryHost(str(generated))
    decoded = lspci(generated)
    assert len(decoded) == len(pci.pci_addresses(host))
    judged = 0
    for address, seen in decoded.items():
        config = pci.read_config(host, address)
        assert config is not None and len(config) == 4096
        caps = pciconfig.extended_capabilities(config)
        assert {c.offset: ECAP_NAMES[c.id] for c in caps} == seen.extended, address
        acs = pciconfig.decode_acs(config)
        if acs is None:
            assert not seen.acs_ctl
        else:
            assert pciconfig.acs_flags(acs.control) == seen.acs_ctl, address
            assert pciconfig.acs_flags(acs.capability) == seen.acs_cap, address
            judged += 1
        for entry in pciconfig.decode_rebar(config):
            current, supported = seen.rebar[entry.bar]
            assert current == _lspci_size(entry.current_mib)
            assert supported == tuple(_lspci_size(s) for s in entry.supported_mib)
    # Every class but the guest (QEMU's root ports have no ACS) has ACS on its ports.
    assert (judged > 0) is not generated.name.startswith("kvm")


def _lspci_size(mib: int) -> str:
    return f"{mib >> 10}GB" if mib >= 1024 else f"{mib}MB"


@needs_pciutils
def test_aer_status_bits_follow_the_planted_counters(tmp_path: Path) -> None:
    root = pcie_box().write_dir(tmp_path / "box")
    decoded = lspci(root)
    assert decoded["0000:62:01.0"].uncorrectable == {"SDES"}
    assert decoded["0000:64:00.0"].uncorrectable == {"CmpltTO"}
    assert decoded["0000:44:00.0"].correctable == {"RxErr", "BadTLP"}
    assert decoded["0000:43:00.0"].correctable == set()
    host = DirectoryHost(str(root))
    counters = pci.aer_counters(host, "0000:62:01.0")
    assert counters is not None
    assert counters.counters["fatal"]["SDES"] == 1 and counters.totals["fatal"] == 1
    assert pci.aer_counters(host, "0000:60:01.1") is not None
    assert pci.aer_counters(host, "0000:60:01.1").rootport == {  # type: ignore[union-attr]
        "correctable": 0, "fatal": 1, "nonfatal": 2}


# -- the walker's guards ---------------------------------------------------------------------


def _config(*entries: tuple[int, int, int], size: int = 4096) -> bytes:
    """A config space with extended capability headers (offset, id, next offset)."""
    cfg = bytearray(size)
    for offset, cap_id, following in entries:
        struct.pack_into("<I", cfg, offset, cap_id | 1 << 16 | following << 20)
    return bytes(cfg)


def test_walk_follows_pointers_wherever_they_lead() -> None:
    config = _config((0x100, 0x0000, 0x400), (0x400, 0x000D, 0x200), (0x200, 0x0001, 0))
    assert [(c.offset, c.id) for c in pciconfig.extended_capabilities(config)] == [
        (0x100, 0x0000), (0x400, 0x000D), (0x200, 0x0001)]
    assert pciconfig.find_extended_capability(config, pciconfig.EXT_CAP_ID_ACS) == 0x400
    assert pciconfig.find_extended_capability(config, pciconfig.EXT_CAP_ID_REBAR) is None


@pytest.mark.parametrize(("config", "message"), [
    (_config((0x100, 0x0001, 0x140), (0x140, 0x000D, 0x100)), "loops back to 0x100"),
    (_config((0x100, 0x0001, 0x100)), "loops back to 0x100"),
    (_config((0x100, 0x0001, 0x200), size=0x180), "past the 384 bytes read"),
])
def test_walk_refuses_loops_and_short_reads(config: bytes, message: str) -> None:
    with pytest.raises(pciconfig.ConfigSpaceError, match=message):
        pciconfig.extended_capabilities(config)


def test_walk_ends_where_the_kernel_ends_it() -> None:
    assert pciconfig.extended_capabilities(bytes(4096)) == []  # no extended capabilities
    assert pciconfig.extended_capabilities(b"\xff" * 4096) == []  # config space reads all ones
    assert pciconfig.extended_capabilities(bytes(256)) == []  # no extended config space at all
    # A next pointer back into the first 256 bytes ends the list.
    assert len(pciconfig.extended_capabilities(_config((0x100, 0x0001, 0x0FC)))) == 1
    with pytest.raises(pciconfig.NeedsRoot):
        pciconfig.extended_capabilities(bytes(64))


def test_a_longest_possible_chain_is_walked_and_bounded() -> None:
    offsets = list(range(0x100, 0x1000, 8))
    entries = [(o, 0x0000, offsets[i + 1] if i + 1 < len(offsets) else 0)
               for i, o in enumerate(offsets)]
    assert len(pciconfig.extended_capabilities(_config(*entries))) == len(offsets) == 480


def test_rebar_decoding_refuses_an_impossible_bar_count() -> None:
    cfg = bytearray(_config((0x100, 0x0015, 0)))
    struct.pack_into("<II", cfg, 0x104, 0x10 << 4, 7 << 5)
    with pytest.raises(pciconfig.ConfigSpaceError, match="lists 7 BARs"):
        pciconfig.decode_rebar(bytes(cfg))
    struct.pack_into("<II", cfg, 0x104, 0x3 << 4 | 1 << 31, 1 | 1 << 5 | 3 << 8 | 1 << 16)
    [entry] = pciconfig.decode_rebar(bytes(cfg))
    assert (entry.bar, entry.current_mib) == (1, 8)
    assert entry.supported_mib == (1, 2, 1 << 27, 1 << 28)


# -- sysfs readers ---------------------------------------------------------------------------


def _device(tmp_path: Path, files: dict[str, str | bytes]) -> DirectoryHost:
    directory = tmp_path / "sys/devices/pci0000:00/0000:00:01.0"
    directory.mkdir(parents=True)
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    bus = tmp_path / "sys/bus/pci/devices"
    bus.mkdir(parents=True)
    (bus / "0000:00:01.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0")
    return DirectoryHost(str(tmp_path))


def test_aer_files_of_old_and_new_kernels_and_garbage(tmp_path: Path) -> None:
    host = _device(tmp_path, {
        # 4.19's long names, with a total that is not the sum (one message, several errors).
        "aer_dev_correctable": "Receiver Error 2\nBad TLP 7\nRELAY_NUM Rollover 0\n"
                               "TOTAL_ERR_COR 8\n",
        "aer_dev_fatal": "Undefined 0\nSDES 1\ndev_fatal_errs_bit[27] 4\n$(reboot) 9\n"
                         "no number here\nACSViol 99999999999999999999999\nTOTAL_ERR_FATAL 5\n",
        "aer_dev_nonfatal": "x" * 5000,
    })
    counters = pci.aer_counters(host, "0000:00:01.0")
    assert counters is not None
    assert counters.counters["correctable"] == {"RxErr": 2, "BadTLP": 7, "Rollover": 0}
    assert counters.totals == {"correctable": 8, "fatal": 5, "nonfatal": 0}
    assert counters.counters["fatal"]["SDES"] == 1
    assert counters.counters["fatal"]["dev_fatal_errs_bit_27_"] == 4
    assert "__reboot_" in counters.counters["fatal"]
    assert counters.counters["nonfatal"] == {}


def test_resources_resize_and_numa_reject_malformed_values(tmp_path: Path) -> None:
    host = _device(tmp_path, {
        "resource": "0x0000000000001000 0x0000000000001fff 0x0000000000040200\n"
                    "0x00000000f0000000 0x00000000ffffffff 0x000000000014220c\n",
        "resource1_resize": "00000000000001c0:6\n", "resource0_resize": "zz\n",
        "numa_node": "-1\n", "local_cpulist": "0-3,8-11\n",
        "power/control": "auto\n", "power/runtime_status": "suspended\n",
        "power/runtime_suspended_time": "12345\n", "link/l1_aspm": "1\n", "link/l0s_aspm": "2\n",
    })
    lines = pci.resources(host, "0000:00:01.0")
    assert lines is not None and [r.size for r in lines] == [0x1000, 0x10000000]
    assert pci.resize_sizes(host, "0000:00:01.0", 1) == (64, 128, 256)
    assert pci.resize_sizes(host, "0000:00:01.0", 0) is None
    assert pci.resize_sizes(host, "0000:00:01.0", 2) is None
    assert pci.numa_node(host, "0000:00:01.0") == -1
    assert pci.local_cpulist(host, "0000:00:01.0") == "0-3,8-11"
    assert pci.runtime_pm(host, "0000:00:01.0") == pci.RuntimePm("auto", "suspended", 12345)
    assert pci.link_pm(host, "0000:00:01.0") == {"l1_aspm": "1"}
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/resource").write_text("0x1 0x2\n")
    assert pci.resources(host, "0000:00:01.0") is None
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/local_cpulist").write_text("0-3;rm -rf\n")
    assert pci.local_cpulist(host, "0000:00:01.0") is None


def test_a_fifo_is_never_read(tmp_path: Path) -> None:
    """A FIFO where an attribute should be would block a read forever: it is not opened."""
    host = _device(tmp_path, {})
    directory = tmp_path / "sys/devices/pci0000:00/0000:00:01.0"
    for name in ("config", "numa_node", "aer_dev_correctable", "resource", "class"):
        os.mkfifo(directory / name)
    assert pci.read_config(host, "0000:00:01.0") is None
    assert pci.numa_node(host, "0000:00:01.0") is None
    assert pci.aer_counters(host, "0000:00:01.0") is None
    assert pci.resources(host, "0000:00:01.0") is None
    assert pci.device_class(host, "0000:00:01.0") is None


def test_symlink_loops_and_huge_files_are_bounded(tmp_path: Path) -> None:
    host = _device(tmp_path, {"numa_node": "1" * (1 << 20)})
    directory = tmp_path / "sys/devices/pci0000:00/0000:00:01.0"
    (directory / "config").symlink_to("config")
    (directory / "iommu_group").symlink_to("../../../kernel/iommu_groups/$(id)")
    assert pci.read_config(host, "0000:00:01.0") is None
    assert pci.numa_node(host, "0000:00:01.0") is None
    assert pci.iommu_group(host, "0000:00:01.0") is None
