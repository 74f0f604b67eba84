"""numa.balancing: automatic NUMA balancing on a multi-node host, now and at the next boot.

The boot value is computed as the boot sets it, in order (checks/lib/sysctl.py):
the kernel's default or ``numa_balancing=`` (and ``sysctl.kernel.numa_balancing=``) on the
next boot's command line (the loader's configuration every check shares,
checks/lib/bootloader.py ``next_boot``; /proc/cmdline where none is found), then
systemd-sysctl's sysctl.d files (or ``sysctl --system`` without systemd), then a
tuned profile's ``[sysctl]`` (and tuned re-applying /etc/sysctl.d after it), then
local systemd units and root's ``@reboot`` crontab. The finding names what sets it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions
from auditor.checks.lib import bootloader, sysctl, tuned
from auditor.checks.lib.sysctl import Writer
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import kernel_cmdline_params

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy, Step

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
#: ``99-*.conf`` names (``99-sysctl.conf`` among them), so it is applied last.
DROP_IN = "/etc/sysctl.d/99-zz-host-auditor-numa.conf"


def _zeroed(raw: str) -> str:
    """Return a setting line with its value replaced by 0, keeping its key and spacing."""
    left, _, right = raw.partition("=")
    spacing = right[: len(right) - len(right.lstrip())]
    return f"{left}={spacing}0"


class BootState(NamedTuple):
    """What sets kernel.numa_balancing at boot, in order; the last one wins."""

    writers: tuple[Writer, ...]
    #: systemd-sysctl applies sysctls at boot (False: ``sysctl --system``).
    systemd: bool
    #: /etc/sysctl.conf lines for the key that the boot does not read.
    unread: tuple[sysctl.Setting, ...]

    @property
    def effective(self) -> Writer:
        """Return the writer whose value the boot ends with."""
        return self.writers[-1]


def boot_state(host: Host) -> BootState:
    """Return every mechanism that sets kernel.numa_balancing at boot, in boot order."""
    systemd = sysctl.booted_by_systemd(host)
    # The next boot's command line as boot.cmdline and every other check read it (the
    # loader's configuration for the kernel that boots next; /proc/cmdline where none was
    # found): a token the running line has and the configuration dropped is not the boot's.
    nxt = bootloader.next_boot(host)
    params = kernel_cmdline_params(" ".join(nxt.tokens))
    line = (f"the next boot's command line ({nxt.describe()})" if nxt.known
            else "the kernel command line")
    # kernel/sched/core.c setup_numabalancing: "enable" or "disable", nothing else.
    option = params.get("numa_balancing")
    writers: list[Writer] = []
    if option in ("enable", "disable"):
        token = f"numa_balancing={option}"
        writers.append(Writer("cmdline", "1" if option == "enable" else "0",
                              nxt.source(token) or CMDLINE_PATH, f"{token} on {line}"))
    elif default_enabled(host):
        writers.append(Writer("default", "1", "", "the kernel's default (on)"))
    else:
        writers.append(Writer("default", "0", "", "the kernel's build default (off)"))
    # sysctl.<key>=<value> on the command line (5.8+, fs/proc/proc_sysctl.c do_sysctl_args)
    # is applied before init runs, so before systemd-sysctl.
    value = params.get(f"sysctl.{SYSCTL_KEY}") or params.get(
        "sysctl." + SYSCTL_KEY.replace(".", "/"))
    if value is not None and value in MODES:
        token = f"sysctl.{SYSCTL_KEY}={value}"
        writers.append(Writer("cmdline", value, nxt.source(token) or CMDLINE_PATH,
                              f"{token} on {line}"))
    applier = "systemd-sysctl" if systemd else "sysctl --system"
    for setting in sysctl.settings(host, SYSCTL_KEY, systemd=systemd):
        writers.append(Writer("sysctl.d", setting.value, setting.where,
                              f"{_shown(host, setting)} (applied by {applier})", setting))
    by_tuned = sysctl.tuned_writers(host, SYSCTL_KEY)
    if by_tuned:
        writers.extend(by_tuned)
        state = tuned.active(host)
        if state is not None and state.reapply_sysctl:
            # tuned re-applies /run/sysctl.d, /etc/sysctl.d, then /etc/sysctl.conf.
            for path in sysctl.sysctl_files(host, systemd=False,
                                            dirs=("/run/sysctl.d", "/etc/sysctl.d")):
                text = host.read_optional(path) or ""
                for setting in sysctl.settings_in(text, SYSCTL_KEY, path):
                    writers.append(Writer(
                        "sysctl.d", setting.value, setting.where,
                        f"{_shown(host, setting)} (re-applied by tuned after its profile)",
                        setting))
    writers.extend(sysctl.unit_writers(host, SYSCTL_KEY))
    writers.extend(sysctl.cron_writers(host, SYSCTL_KEY))
    unread = tuple(sysctl.unread_sysctl_conf(host, SYSCTL_KEY)) if systemd else ()
    return BootState(tuple(writers), systemd, unread)


def _shown(host: Host, setting: sysctl.Setting) -> str:
    try:
        real = host.resolve(setting.path)
    except OSError:
        real = setting.path
    if real != setting.path:
        return f"{setting.where} (a link to {real})"
    return setting.where


class NumaBalancing(Check[CheckOptions]):
    """Automatic NUMA balancing migrates pages under a pinned inference server."""

    id: ClassVar[str] = "numa.balancing"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        RUNTIME_PATH,
        "/sys/devices/system/node/node*",
        "/sys/devices/system/node/online",
        *sysctl.READS,
        *bootloader.NEXT_BOOT_READS,
        CMDLINE_PATH,
        OSRELEASE_PATH,
        KERNEL_CONFIGS,
        # Process names: a running tuned applies its profile.
        "/proc/[0-9]*/comm",
        *where.READS,
    )
    daemons: ClassVar[frozenset[str]] = frozenset({"tuned"})
    rationale: ClassVar[str] = (
        "With kernel.numa_balancing on, the kernel unmaps pages to sample accesses and migrates "
        "them between nodes. An inference server pins its threads and GPU buffers per socket; "
        "the hinting faults and migrations add latency spikes and steal memory bandwidth from "
        "the host-to-device copies."
    )
    remedy: ClassVar[str] = (
        "sysctl -w kernel.numa_balancing=0 now, and persist it in a file the boot reads: a "
        "/etc/sysctl.d/*.conf that sorts after every other file that sets it (or change the "
        "file that sets it to 1). systemd-sysctl does not read /etc/sysctl.conf unless a "
        "99-sysctl.conf link in /etc/sysctl.d points at it."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        runtime = host.read_optional(RUNTIME_PATH)
        nodes = [p for p in host.glob("/sys/devices/system/node/node*") if p[-1].isdigit()]
        env = where.environment(host)
        evidence = {"nodes": str(len(nodes)), "runtime": runtime or ""}
        if runtime is None:
            yield self.skipped(
                "kernel", f"{RUNTIME_PATH} is missing: the kernel has no NUMA balancing",
                evidence=evidence,
            )
            return
        mode = MODES.get(runtime, f"unknown mode {runtime!r}")
        if env.in_container:
            yield from self._in_container(env, runtime, mode, nodes, evidence)
            return
        boot = boot_state(host)
        effective = boot.effective
        evidence["boot_value"] = effective.value
        evidence["boot_source"] = effective.where
        evidence["boot_mechanism"] = effective.mechanism
        evidence.update(bootloader.next_boot(host).evidence())
        fix = f"sysctl -w {SYSCTL_KEY}=0 and set it to 0 in a file under /etc/sysctl.d"
        if len(nodes) <= 1:
            yield self.passed(
                "kernel",
                f"{len(nodes) or 1} NUMA node: balancing ({mode}) has nothing to migrate; at "
                f"boot {effective.label} sets {effective.value}",
                observed=runtime, expected="0 on multi-node hosts", evidence=evidence,
            )
            return
        unread = self._unread_note(boot)
        if runtime != "0":
            yield self.failed(
                "kernel",
                f"automatic NUMA balancing is {mode} on {len(nodes)} nodes; at boot "
                f"{effective.label} sets {effective.value}{unread}",
                observed=runtime, expected="0", fix=fix, evidence=evidence,
            )
        elif effective.value != "0" and effective.mechanism == "default":
            yield self.warned(
                "kernel",
                f"automatic NUMA balancing is off now on {len(nodes)} nodes, but nothing keeps "
                f"it off at boot: {effective.label} comes back at the next boot{unread}",
                observed="0 (boot: kernel default, on)", expected="0", fix=fix,
                evidence=evidence,
            )
        elif effective.value != "0":
            yield self.failed(
                "kernel",
                f"NUMA balancing is off now on {len(nodes)} nodes, but at boot {effective.label} "
                f"sets it to {effective.value}{unread}",
                observed=f"0 (boot: {effective.value})", expected="0",
                fix=f"set it to 0 in {effective.where}" if effective.mechanism == "sysctl.d"
                else f"make {effective.label} set 0, or remove it",
                evidence=evidence,
            )
        else:
            yield self.passed(
                "kernel",
                f"automatic NUMA balancing is disabled on {len(nodes)} nodes; at boot "
                f"{effective.label} keeps it off{self._starts(effective)}",
                observed=runtime, expected="0", evidence=evidence,
            )

    @staticmethod
    def _starts(effective: Writer) -> str:
        return " (the kernel starts with it off)" if effective.mechanism == "default" else ""

    @staticmethod
    def _unread_note(boot: BootState) -> str:
        if not boot.unread:
            return ""
        setting = boot.unread[-1]
        return (f"; {setting.where} sets {setting.value}, but systemd-sysctl has not read "
                "/etc/sysctl.conf since v207 and no 99-sysctl.conf link in a sysctl.d "
                "directory points at it (only 'sysctl --system' or 'sysctl -p' run by hand "
                "apply it)")

    def _in_container(self, env: where.Environment, runtime: str, mode: str, nodes: list[str],
                      evidence: dict[str, str]) -> Iterable[Finding]:
        evidence = {**evidence, "environment": env.describe()}
        context = (f"read {env.inside()}: /proc/sys/kernel is the host's, and the "
                   "container's own sysctl.d does not set the host's boot value")
        if len(nodes) > 1 and runtime != "0":
            yield self.failed(
                "kernel",
                f"automatic NUMA balancing is {mode} on {len(nodes)} nodes ({context}); the "
                "fix belongs on the host",
                observed=runtime, expected="0",
                fix=f"on the host: sysctl -w {SYSCTL_KEY}=0 and set it to 0 in a file under "
                    "/etc/sysctl.d",
                evidence=evidence,
            )
            return
        yield self.passed(
            "kernel",
            f"automatic NUMA balancing is {mode} on {len(nodes) or 1} node(s) ({context}: "
            "audit the host for what keeps it at boot)",
            observed=runtime, expected="0 on multi-node hosts", evidence=evidence,
        )

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Set kernel.numa_balancing to 0 now and in a file the boot reads."""
        from auditor.remedy import Advice, Remedy, ReplaceLine, SetValue, WriteFile
        if not findings:
            return []
        env = where.environment(host)
        if env.in_container:
            # /proc/sys is the host's and read-only here: nothing to write in the container.
            return [Remedy(
                check=self.id, subject="kernel",
                title="disable automatic NUMA balancing on the host",
                advice=(Advice(
                    f"on the host, not in this {env.describe()}: sysctl -w {SYSCTL_KEY}=0 and "
                    f"'{SYSCTL_KEY} = 0' in a file under /etc/sysctl.d"),),
            )]
        runtime: tuple[Step, ...] = ()
        current = host.read_optional(RUNTIME_PATH)
        if current is not None and current != "0":
            runtime = (SetValue(RUNTIME_PATH, "0", sysctl=SYSCTL_KEY),)
        boot = boot_state(host)
        persistent: list[Step] = []
        notes: list[str] = []
        setters = [w.setting for w in boot.writers
                   if w.mechanism == "sysctl.d" and w.setting is not None]
        seen: set[tuple[str, int]] = set()
        masks: dict[str, str] = {}
        # When the boot already ends with 0 (a later file, or the command line), the lines
        # it overrides are left alone: rewriting them, or a drop-in, would duplicate a
        # setting the next boot applies anyway. /etc/sysctl.conf, which it does not read,
        # is still set for 'sysctl --system' run by hand.
        settled = boot.effective.value == "0"
        for setting in [*([] if settled else setters), *boot.unread]:
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
        if boot.unread and any(s.value != "0" for s in boot.unread):
            notes.append("/etc/sysctl.conf is not read at boot here; it is set to 0 too, for "
                         "'sysctl --system' and 'sysctl -p' run by hand")
        if settled:
            notes.append(f"at boot {boot.effective.label} sets 0 already")
        elif not setters:
            # Nothing sets it in a file the boot reads, so boot keeps the kernel's default
            # (or the command line's): a drop-in in /etc/sysctl.d sets it after those.
            persistent.append(WriteFile(DROP_IN, f"{SYSCTL_KEY} = 0\n"))
        advice: list[Advice] = []
        for writer in boot.writers:
            if writer.mechanism in ("tuned", "unit", "cron") and writer.value != "0":
                # Another mechanism's file is not this fix's to rewrite: name it.
                advice.append(Advice(f"{writer.label} sets it to {writer.value} later at boot, "
                                     "after every sysctl.d file: make it set 0, or remove it"))
        if not runtime and not persistent and not advice:
            return []
        return [
            Remedy(
                check=self.id,
                subject="kernel",
                title="disable automatic NUMA balancing",
                runtime=runtime,
                persistent=tuple(persistent),
                notes=tuple(notes),
                advice=tuple(advice),
            )
        ]
