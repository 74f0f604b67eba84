"""numa.balancing: automatic NUMA balancing on a multi-node host."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from auditor.check import Check
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import kernel_cmdline_params

SYSCTL_KEY = "kernel.numa_balancing"
RUNTIME_PATH = "/proc/sys/kernel/numa_balancing"
#: Directories systemd-sysctl reads, in priority order: a file name in an earlier
#: directory masks the same name in a later one.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
CMDLINE_PATH = "/proc/cmdline"
OSRELEASE_PATH = "/proc/sys/kernel/osrelease"
#: The kernel's build configuration, which says whether balancing starts on.
KERNEL_CONFIGS = "/boot/config-*"

MODES = {
    "0": "disabled",
    "1": "enabled (NUMA_BALANCING_NORMAL)",
    "2": "memory tiering (NUMA_BALANCING_MEMORY_TIERING)",
    "3": "enabled with memory tiering",
}


def sysctl_files(host: Host) -> list[str]:
    """Return the sysctl files boot applies, in the order they are applied."""
    chosen: dict[str, str] = {}
    for directory in SYSCTL_DIRS:
        for path in host.glob(f"{directory}/*.conf"):
            chosen.setdefault(path.rsplit("/", 1)[1], path)
    ordered = [chosen[name] for name in sorted(chosen)]
    if host.exists(SYSCTL_CONF):
        ordered.append(SYSCTL_CONF)
    return ordered


def default_enabled(host: Host) -> bool:
    """Return whether the running kernel turns balancing on at boot on a NUMA machine.

    Distribution kernels build with ``CONFIG_NUMA_BALANCING_DEFAULT_ENABLED=y``; only a
    kernel config saying otherwise makes the default off.
    """
    release = (host.read_optional(OSRELEASE_PATH) or "").strip()
    if not release or "/" in release:
        return True
    config = host.read_optional(f"/boot/config-{release}")
    return config is None or "# CONFIG_NUMA_BALANCING_DEFAULT_ENABLED is not set" not in config


def boot_value(host: Host, key: str) -> tuple[str, str] | None:
    """Return (value, file:line) that boot would apply last for a sysctl key, or None."""
    result: tuple[str, str] | None = None
    wanted = key.replace("/", ".")
    for path in sysctl_files(host):
        text = host.read_optional(path)
        if text is None:
            continue
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            name, sep, value = line.partition("=")
            if not sep:
                continue
            name = name.strip().lstrip("-").replace("/", ".")
            if name == wanted:
                result = (value.strip(), f"{path}:{number}")
    return result


class NumaBalancing(Check):
    """Automatic NUMA balancing migrates pages under a pinned inference server."""

    id: ClassVar[str] = "numa.balancing"
    severity: ClassVar[Severity] = Severity.HIGH
    reads: ClassVar[tuple[str, ...]] = (
        RUNTIME_PATH,
        "/sys/devices/system/node/node*",
        "/sys/devices/system/node/online",
        *(f"{d}/*.conf" for d in SYSCTL_DIRS),
        SYSCTL_CONF,
        CMDLINE_PATH,
        OSRELEASE_PATH,
        KERNEL_CONFIGS,
    )
    rationale: ClassVar[str] = (
        "With kernel.numa_balancing on, the kernel unmaps pages to sample accesses and migrates "
        "them between nodes. An inference server pins its threads and GPU buffers per socket; "
        "the hinting faults and migrations add latency spikes and steal memory bandwidth from "
        "the host-to-device copies."
    )
    remedy: ClassVar[str] = (
        "sysctl -w kernel.numa_balancing=0 now, and persist it in a sysctl.d file that sorts "
        "after every other file that sets it (or change the file that sets it to 1)."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        runtime = host.read_optional(RUNTIME_PATH)
        nodes = [p for p in host.glob("/sys/devices/system/node/node*") if p[-1].isdigit()]
        boot = boot_value(host, SYSCTL_KEY)
        evidence = {"nodes": str(len(nodes)), "runtime": runtime or ""}
        if boot is not None:
            evidence["boot_value"] = boot[0]
            evidence["boot_source"] = boot[1]
        if runtime is None:
            yield self.skipped(
                "kernel", f"{RUNTIME_PATH} is missing: the kernel has no NUMA balancing",
                evidence=evidence,
            )
            return
        mode = MODES.get(runtime, f"unknown mode {runtime!r}")
        boot_note = f"; boot applies {boot[0]} from {boot[1]}" if boot else ""
        fix = "sysctl -w kernel.numa_balancing=0 and set it to 0 in /etc/sysctl.d"
        if len(nodes) <= 1:
            yield self.passed(
                "kernel",
                f"{len(nodes) or 1} NUMA node: balancing ({mode}) has nothing to migrate"
                f"{boot_note}",
                observed=runtime, expected="0 on multi-node hosts", evidence=evidence,
            )
            return
        if runtime != "0":
            yield self.failed(
                "kernel",
                f"automatic NUMA balancing is {mode} on {len(nodes)} nodes{boot_note}",
                observed=runtime, expected="0", fix=fix, evidence=evidence,
            )
        elif boot is not None and boot[0] != "0":
            yield self.failed(
                "kernel",
                f"NUMA balancing is off now but {boot[1]} sets it to {boot[0]} at boot",
                observed=f"0 (boot: {boot[0]})", expected="0", fix=f"set it to 0 in {boot[1]}",
                evidence=evidence,
            )
        else:
            kept = boot_note
            if boot is None:
                params = kernel_cmdline_params(host.read_optional(CMDLINE_PATH) or "")
                if params.get("numa_balancing") in ("disable", "0"):
                    kept = "; the boot command line keeps it off"
                elif not default_enabled(host):
                    kept = "; the kernel starts with it off"
                else:
                    yield self.warned(
                        "kernel",
                        f"automatic NUMA balancing is off now on {len(nodes)} nodes, but no "
                        "sysctl file keeps it off: the kernel's default (on) comes back at "
                        "the next boot",
                        observed="0 (boot: kernel default, on)", expected="0", fix=fix,
                        evidence=evidence,
                    )
                    return
            yield self.passed(
                "kernel", f"automatic NUMA balancing is disabled on {len(nodes)} nodes{kept}",
                observed=runtime, expected="0", evidence=evidence,
            )
