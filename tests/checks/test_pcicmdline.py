"""The pci= kernel parameter: options, device strings as pci_dev_str_match reads them."""

from __future__ import annotations

import pytest

from auditor.checks.lib.pcicmdline import (
    DeviceIds,
    config_acs_effect,
    last_option,
    match_list,
    matches,
    pci_options,
    split_devices,
)

SWITCH_PORT = ("0000:42:01.0", ["0000:41:00.0", "0000:40:01.1"])
BROADCOM = DeviceIds(0x1000, 0xC030, 0x1000, 0xA064)


def test_options_of_every_pci_token_in_order() -> None:
    tokens = ["quiet", "pci=realloc,disable_acs_redir=0000:40:01.1;pci:1000:c030", "pci=noaer",
              "pcie_aspm=off", "pci=", "pci=disable_acs_redir=0000:60:01.1"]
    options = pci_options(tokens)
    assert options == ["realloc", "disable_acs_redir=0000:40:01.1;pci:1000:c030", "noaer",
                       "disable_acs_redir=0000:60:01.1"]
    # pci_setup keeps a pointer to the last value: the earlier list does nothing.
    assert last_option(options, "disable_acs_redir") == "0000:60:01.1"
    assert last_option(options, "config_acs") is None
    assert split_devices("0000:40:01.1\\;pci:1000:c030;;") == ["0000:40:01.1", "pci:1000:c030"]


@pytest.mark.parametrize(("spec", "expected"), [
    ("0000:42:01.0", True),
    ("42:01.0", True),  # the domain defaults to 0
    ("0001:42:01.0", False),
    ("0000:42:01.1", False),
    ("0000:40:01.1/00.0/01.0", True),  # root port, then the switch's ports by device.function
    ("0000:40:01.1/00.0/02.0", False),
    ("0000:40:01.2/00.0/01.0", False),
    ("0000:40:01.1/00.0/01.0/00.0", False),  # deeper than the device is
    ("pci:1000:c030", True),
    ("pci:1000:0", True),  # 0 matches any value
    ("pci:0:0", True),
    ("pci:10de:0", False),
    ("pci:1000:c030:1000:a064", True),
    ("pci:1000:c030:1000:a065", False),
    ("pci:1000", None),
    ("0000:42:01", None),
    ("$(reboot)", None),
    ("0000:40:01.1/zz.0", None),
])
def test_device_strings(spec: str, expected: bool | None) -> None:
    assert matches(spec, *SWITCH_PORT, BROADCOM) is expected


def test_lists_stop_where_the_kernel_stops() -> None:
    assert match_list("0000:60:01.1;0000:42:01.0", *SWITCH_PORT, BROADCOM) == (True, "", False)
    # An unparsable string ends the walk: what follows it is never compared.
    assert match_list("bogus;0000:42:01.0", *SWITCH_PORT, BROADCOM) == (False, "", True)
    assert match_list(None, *SWITCH_PORT, BROADCOM) == (False, "", False)
    matched = match_list("xx110x1@0000:42:01.0", *SWITCH_PORT, BROADCOM, flags=True)
    assert matched == (True, "xx110x1", False)
    assert match_list("0000:42:01.0", *SWITCH_PORT, BROADCOM, flags=True)[2] is True


def test_config_acs_flags_count_from_the_right() -> None:
    # NVIDIA's GB300 switch ports: SrcValid on, ReqRedir off, CmpltRedir and UpstreamFwd on.
    assert config_acs_effect("xx110x1", 0x0000) == 0x0019
    assert config_acs_effect("xx110x1", 0x001D) == 0x0019
    assert config_acs_effect("0000000", 0x007F) == 0x0000
    assert config_acs_effect("xxxxxxx", 0x002C) == 0x002C
