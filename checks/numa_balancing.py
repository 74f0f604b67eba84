"""numa.balancing: automatic NUMA balancing on a multi-node host."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from auditor.check import Check, CheckOptions
from auditor.checks.lib import sysctl
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import kernel_cmdline_params
from auditor.remediations.steps import FixContext, Remedy, ReplaceLine, SetValue, Step, WriteFile

SYSCTL_KEY = "kernel.numa_balancing"
RUNTIME_PATH = "/proc/sys/kernel/numa_balancing"
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


#: The drop-in written when no file sets the key: it sorts after the usual
#: ``99-*.conf`` names. /etc/sysctl.conf is applied after every drop-in, so a
#: line there is changed instead of being outvoted.
DROP_IN = "/etc/sysctl.d/99-zz-host-auditor-numa.conf"


def _zeroed(raw: str) -> str:
    """Return a setting line with its value replaced by 0, keeping its key and spacing."""
    left, _, right = raw.partition("=")
    spacing = right[: len(right) - len(right.lstrip())]
    return f"{left}={spacing}0"


class NumaBalancing(Check[CheckOptions]):
    """Automatic NUMA balancing migrates pages under a pinned inference server."""

    id: ClassVar[str] = "numa.balancing"
    severity: ClassVar[Severity] = Severity.HIGH
    reads: ClassVar[tuple[str, ...]] = (
        RUNTIME_PATH,
        "/sys/devices/system/node/node*",
        "/sys/devices/system/node/online",
        *sysctl.READS,
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
        setting = sysctl.boot_value(host, SYSCTL_KEY)
        boot = (setting.value, setting.where) if setting is not None else None
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

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Set kernel.numa_balancing to 0 now and in the boot configuration."""
        if not findings:
            return []
        runtime: tuple[Step, ...] = ()
        current = host.read_optional(RUNTIME_PATH)
        if current is not None and current != "0":
            runtime = (SetValue(RUNTIME_PATH, "0", sysctl=SYSCTL_KEY),)
        persistent: list[Step] = []
        notes: list[str] = []
        setters = sysctl.settings(host, SYSCTL_KEY)
        seen: set[tuple[str, int]] = set()
        masks: dict[str, str] = {}
        for setting in setters:
            if setting.value == "0":
                continue
            if "\ufffd" in setting.raw:
                notes.append(f"{setting.where} is not valid UTF-8: set it to 0 by hand")
                continue
            real = host.resolve(setting.path)
            if real.startswith("/etc/"):
                if (real, setting.line) not in seen:
                    seen.add((real, setting.line))
                    persistent.append(ReplaceLine(real, setting.line, setting.raw,
                                                  _zeroed(setting.raw)))
            else:
                # A vendor file (/usr/lib, /run) is masked by a same-named file in /etc/sysctl.d.
                name = setting.path.rsplit("/", 1)[1]
                masks[name] = masks.get(name) or host.read_text(setting.path)
        for name, text in masks.items():
            lines = text.split("\n")
            for found in sysctl.settings_in(text, SYSCTL_KEY):
                if found.value != "0":
                    lines[found.line - 1] = _zeroed(found.raw)
            persistent.append(WriteFile(f"/etc/sysctl.d/{name}", "\n".join(lines)))
            notes.append(f"/etc/sysctl.d/{name} masks the vendor file of that name")
        if not setters:
            # Nothing sets it, so boot keeps the kernel's default (on for NUMA machines).
            persistent.append(WriteFile(DROP_IN, f"{SYSCTL_KEY} = 0\n"))
        if not runtime and not persistent:
            return []
        return [
            Remedy(
                check=self.id,
                subject="kernel",
                title="disable automatic NUMA balancing",
                runtime=runtime,
                persistent=tuple(persistent),
                notes=tuple(notes),
            )
        ]
