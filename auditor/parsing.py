"""Small parsers for the formats kernel interfaces use (CPU lists, key-value files)."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list (``0-3,8,10-11``) into sorted CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, _, high = part.partition("-")
            step = 1
            if ":" in high:  # 0-15:2 stride form
                high, _, stride = high.partition(":")
                step = int(stride.split("/")[0])
            cpus.update(range(int(low), int(high) + 1, step))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU numbers as a compact kernel CPU list (``0-63,96-127``)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        ranges.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(ranges)


def kernel_cmdline_params(cmdline: str) -> dict[str, str]:
    """Split a kernel command line into parameters; a bare flag maps to an empty string."""
    params: dict[str, str] = {}
    for token in cmdline.split():
        key, _, value = token.partition("=")
        params[key] = value
    return params


def version_tuple(text: str) -> tuple[int, ...]:
    """Return the leading numeric components of a version (``6.8.0-45-generic`` -> 6, 8, 0)."""
    numbers: list[int] = []
    for part in text.replace("-", ".").replace("+", ".").split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)
