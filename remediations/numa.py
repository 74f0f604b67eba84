"""numa.balancing: turn automatic NUMA balancing off now and at every boot."""

from __future__ import annotations

from collections.abc import Sequence

from auditor.hosts.base import Host
from auditor.model import Finding
from checks.numa_balancing import RUNTIME_PATH, SYSCTL_KEY, sysctl_files
from remediations.base import Context, Remedy, ReplaceLine, SetValue, Step, WriteFile

#: The drop-in written when no file sets the key: it sorts after the usual
#: ``99-*.conf`` names. /etc/sysctl.conf is applied after every drop-in, so a
#: line there is changed instead of being outvoted.
DROP_IN = "/etc/sysctl.d/99-zz-host-auditor-numa.conf"

READS: tuple[str, ...] = ()


def _setting_lines(text: str) -> list[tuple[int, str, str]]:
    """Return (line number, raw line, value) of every line that sets the key."""
    found: list[tuple[int, str, str]] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        if sep and name.strip().lstrip("-").replace("/", ".") == SYSCTL_KEY:
            found.append((number, raw, value.strip()))
    return found


def _zeroed(raw: str) -> str:
    """Return a setting line with its value replaced by 0, keeping its key and spacing."""
    left, _, right = raw.partition("=")
    spacing = right[: len(right) - len(right.lstrip())]
    return f"{left}={spacing}0"


def remediate(host: Host, findings: Sequence[Finding], context: Context) -> list[Remedy]:
    """Set kernel.numa_balancing to 0 now and in the boot configuration."""
    if not findings:
        return []
    runtime: tuple[Step, ...] = ()
    current = host.read_optional(RUNTIME_PATH)
    if current is not None and current != "0":
        runtime = (SetValue(RUNTIME_PATH, "0", sysctl=SYSCTL_KEY),)
    persistent: list[Step] = []
    notes: list[str] = []
    setters: list[tuple[str, int, str, str]] = []
    for path in sysctl_files(host):
        try:
            text = host.read_text(path)
        except OSError:
            continue
        setters.extend((path, n, raw, value) for n, raw, value in _setting_lines(text))
    seen: set[tuple[str, int]] = set()
    masks: dict[str, str] = {}
    for path, number, raw, value in setters:
        if value == "0":
            continue
        if "\ufffd" in raw:
            notes.append(f"{path}:{number} is not valid UTF-8: set it to 0 by hand")
            continue
        real = host.resolve(path)
        if real.startswith("/etc/"):
            if (real, number) not in seen:
                seen.add((real, number))
                persistent.append(ReplaceLine(real, number, raw, _zeroed(raw)))
        else:
            # A vendor file (/usr/lib, /run) is masked by a same-named file in /etc/sysctl.d.
            name = path.rsplit("/", 1)[1]
            masks[name] = masks.get(name) or host.read_text(path)
    for name, text in masks.items():
        lines = text.split("\n")
        for number, raw, value in _setting_lines(text):
            if value != "0":
                lines[number - 1] = _zeroed(raw)
        persistent.append(WriteFile(f"/etc/sysctl.d/{name}", "\n".join(lines)))
        notes.append(f"/etc/sysctl.d/{name} masks the vendor file of that name")
    if not setters:
        # Nothing sets it, so boot keeps the kernel's default (on for NUMA machines).
        persistent.append(WriteFile(DROP_IN, f"{SYSCTL_KEY} = 0\n"))
    if not runtime and not persistent:
        return []
    return [
        Remedy(
            check="numa.balancing",
            subject="kernel",
            title="disable automatic NUMA balancing",
            runtime=runtime,
            persistent=tuple(persistent),
            notes=tuple(notes),
        )
    ]
