"""The ``pci=`` kernel parameter: its options, and which devices a device string matches.

``pci=`` takes comma-separated options and may appear several times; each occurrence is
parsed in order (drivers/pci/pci.c ``pci_setup``). ``disable_acs_redir=`` and
``config_acs=`` keep a pointer to their value, so only the last of each counts. Their
values are device strings separated by ``;`` (a ``,`` would end the option), each in one
of the forms ``pci_dev_str_match`` accepts:

- ``[<domain>:]<bus>:<device>.<func>[/<device>.<func>]*`` (a path below a bridge);
- ``pci:<vendor>:<device>[:<subvendor>:<subdevice>]``, where 0 matches any value.

``config_acs=`` prefixes each device with the ACS bits to force: seven characters of
``0``, ``1`` or ``x`` (keep), the rightmost being bit 0, then ``@``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from auditor.checks.lib import pci
from auditor.parsing import lazy_re

#: The value of one option may be long (a list of devices), but not unbounded.
_MAX_ITEMS = 256
_ADDRESS = lazy_re(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\."
                   r"([0-7])", re.ASCII)
_STEP = lazy_re(r"([0-9a-fA-F]{1,2})\.([0-7])", re.ASCII)
_IDS = lazy_re(r"pci:([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4})"
               r"(?::([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4}))?", re.ASCII)
_FLAGS = lazy_re(r"[01xX]{1,7}", re.ASCII)


def pci_options(tokens: Iterable[str]) -> list[str]:
    """Return every option of every ``pci=`` token, in command-line order."""
    found: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if key == "pci" and sep:
            found.extend(item for item in value.split(",") if item)
    return found[:_MAX_ITEMS]


def last_option(options: Sequence[str], name: str) -> str | None:
    """Return the value of the last ``name=`` option (the one the kernel keeps), or None."""
    value = None
    for option in options:
        if option.startswith(name + "="):
            value = option[len(name) + 1:]
    return value


def split_devices(value: str) -> list[str]:
    """Split a device list at ``;`` (GRUB configurations escape it as ``\\;``)."""
    return [item for item in value.replace("\\;", ";").split(";") if item][:_MAX_ITEMS]


class DeviceIds(NamedTuple):
    """What a ``pci:`` device string compares: ids from config space and sysfs."""

    vendor: int | None
    device: int | None
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None


def matches(spec: str, address: str, ancestors: Sequence[str], ids: DeviceIds) -> bool | None:
    """Return whether a device string matches the device (None: the kernel cannot parse it).

    ``ancestors`` are the bridges above the device, nearest first (for the path form).
    """
    spec = spec.strip()
    if spec.startswith("pci:"):
        found = _IDS.fullmatch(spec)
        if found is None:
            return None
        wanted = [int(g, 16) if g is not None else 0 for g in found.groups()]
        have = [ids.vendor, ids.device, ids.subsystem_vendor, ids.subsystem_device]
        return all(w == 0 or w == h for w, h in zip(wanted, have, strict=True))
    first, *steps = spec.split("/")
    head = _ADDRESS.fullmatch(first)
    if head is None or len(steps) > 32:
        return None
    parsed_steps = [_STEP.fullmatch(step) for step in steps]
    if any(step is None for step in parsed_steps):
        return None
    chain = [address, *ancestors]
    if len(steps) >= len(chain):
        return False
    # The last step names the device, each step before it the bridge above.
    for index, step in enumerate(reversed(parsed_steps)):
        assert step is not None
        if not _same_devfn(chain[index], int(step.group(1), 16), int(step.group(2))):
            return False
    top = chain[len(steps)]
    domain, bus, slot, func = head.groups()
    want = (int(domain, 16) if domain else 0, int(bus, 16), int(slot, 16), int(func))
    return _parts(top) == want


def _parts(address: str) -> tuple[int, int, int, int]:
    domain, bus, rest = address.split(":")
    slot, func = rest.split(".")
    return int(domain, 16), int(bus, 16), int(slot, 16), int(func)


def _same_devfn(address: str, slot: int, func: int) -> bool:
    _, _, have_slot, have_func = _parts(address)
    return (have_slot, have_func) == (slot, func)


def match_list(value: str | None, address: str, ancestors: Sequence[str], ids: DeviceIds,
               *, flags: bool = False) -> tuple[bool, str, bool]:
    """Return (matched, the flags of the match, whether parsing stopped early).

    Walked as ``__pci_config_acs`` walks it: the first match wins, and a string the kernel
    cannot parse stops the walk ("PCI: Can't parse ACS command line parameter").
    """
    if not value:
        return False, "", False
    for item in split_devices(value):
        bits = ""
        if flags:
            bits, sep, item = item.partition("@")
            if not sep or not _FLAGS.fullmatch(bits):
                return False, "", True
        result = matches(item, address, ancestors, ids)
        if result is None:
            return False, "", True
        if result:
            return True, bits, False
    return False, "", False


def config_acs_effect(bits: str, control: int) -> int:
    """Return ACS Control after ``config_acs=`` flags: ``0`` clears, ``1`` sets, ``x`` keeps."""
    for position, char in enumerate(reversed(bits)):
        if char == "0":
            control &= ~(1 << position)
        elif char == "1":
            control |= 1 << position
    return control


def device_ids(device: pci.PciDevice, subsystem: Mapping[str, int | None]) -> DeviceIds:
    """Return what a ``pci:`` string compares for one device."""
    return DeviceIds(device.vendor, device.device, subsystem.get("vendor"),
                     subsystem.get("device"))
