"""Real pciutils against a sysroot: what ``lspci -vvv`` decodes, and ``setpci`` writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

needs_pciutils = pytest.mark.skipif(
    not (shutil.which("lspci") and shutil.which("setpci")), reason="pciutils not installed"
)


def args(root: Path) -> list[str]:
    return ["-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci"]


def setpci(root: Path, address: str, *writes: str) -> str:
    """Run real setpci on one device of the sysroot; return what it printed."""
    return subprocess.run(["setpci", *args(root), "-s", address, *writes], capture_output=True,
                          text=True, check=True).stdout.strip()


@dataclass
class Decoded:
    """What lspci -vvv printed about one function."""

    text: str
    #: Extended capabilities as lspci names them, by offset.
    extended: dict[int, str] = field(default_factory=dict)
    acs_ctl: str = ""
    acs_cap: str = ""
    uncorrectable: set[str] = field(default_factory=set)
    correctable: set[str] = field(default_factory=set)
    rebar: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    aspm: str = ""


_HEAD = re.compile(r"^([0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ")
_ECAP = re.compile(r"^\tCapabilities: \[([0-9a-f]{3}) v\d+\] (.+)$")
_REBAR = re.compile(r"BAR (\d): current size: (\w+)(?:, supported: (.+))?")


def lspci(root: Path, address: str | None = None) -> dict[str, Decoded]:
    """Run real lspci -vvv on the sysroot; return each function's decoded lines."""
    selector = ["-s", address] if address else []
    out = subprocess.run(["lspci", *args(root), "-D", "-vvv", *selector], capture_output=True,
                         text=True, check=True).stdout
    found: dict[str, Decoded] = {}
    current: Decoded | None = None
    for line in out.splitlines():
        head = _HEAD.match(line)
        if head:
            current = found.setdefault(head.group(1), Decoded(line))
            continue
        if current is None:
            continue
        current.text += "\n" + line
        if match := _ECAP.match(line):
            current.extended[int(match.group(1), 16)] = match.group(2)
        stripped = line.strip()
        if stripped.startswith("ACSCtl:"):
            current.acs_ctl = stripped.partition("\t")[2] or stripped[7:].strip()
        elif stripped.startswith("ACSCap:"):
            current.acs_cap = stripped.partition("\t")[2] or stripped[7:].strip()
        elif stripped.startswith("UESta:"):
            current.uncorrectable = {w[:-1] for w in stripped[6:].split() if w.endswith("+")}
        elif stripped.startswith("CESta:"):
            current.correctable = {w[:-1] for w in stripped[6:].split() if w.endswith("+")}
        elif stripped.startswith("LnkCtl:"):
            current.aspm = stripped[7:].split(";")[0].strip()
        elif match := _REBAR.search(stripped):
            supported = tuple((match.group(3) or "").split())
            current.rebar[int(match.group(1))] = (match.group(2), supported)
    return found
