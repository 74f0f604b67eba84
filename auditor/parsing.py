"""Small parsers for the formats kernel interfaces use (CPU lists, key-value files)."""

from __future__ import annotations

from collections.abc import Iterable

#: The highest CPU number a CPU list may name (Linux's NR_CPUS is at most 8192 today).
MAX_CPU = 65535
#: The most CPU numbers one list may spell out, counting repeats: a real list names each
#: CPU once; a hostile one repeating ``0-65535`` must not cost minutes.
MAX_CPULIST_WORK = 1 << 17
#: The longest CPU list read (a list of every one of 65536 CPUs, one by one, is ~400 KB).
MAX_CPULIST_TEXT = 1 << 19


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list (``0-3,8,10-11``) into sorted CPU numbers.

    Raise ValueError for what is not one: a number past MAX_CPU, a range backwards, a
    stride below 1, or a list that spells out more than MAX_CPULIST_WORK numbers.
    """
    if len(text) > MAX_CPULIST_TEXT:
        raise ValueError("CPU list too long")
    cpus: set[int] = set()
    work = 0
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low_text, _, high_text = part.partition("-")
            step = 1
            if ":" in high_text:  # 0-15:2 stride form
                high_text, _, stride = high_text.partition(":")
                step = int(stride.split("/")[0])
            low, high = int(low_text), int(high_text)
        else:
            low = high = int(part)
            step = 1
        if not 0 <= low <= high <= MAX_CPU or step < 1:
            raise ValueError(f"not a CPU range: {part[:40]!r}")
        work += (high - low) // step + 1
        if work > MAX_CPULIST_WORK:
            raise ValueError("CPU list names too many CPUs")
        cpus.update(range(low, high + 1, step))
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
