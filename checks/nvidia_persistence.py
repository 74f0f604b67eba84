"""nvidia.persistence: the persistence daemon runs, keeps persistence on, and starts at boot.

Without persistence the driver tears a GPU's state down when its last client exits; the next
start of an inference server pays the re-initialisation, and NVML can wedge in containers.
``nvidia-persistenced`` keeps every GPU initialised unless it runs with
``--no-persistence-mode``, which some distribution units pass (it then only answers
``nvidia-smi -pm`` requests). Ubuntu's unit has no [Install] section: a udev rule starts it
when the nvidia module loads, so a missing ``.wants`` link is not "disabled" there.

Read through the daemon's pid file: only that pid's ``comm`` (cut to 15 characters by the
kernel: ``nvidia-persiste``) and ``cmdline``, never another process's. Where the command line
was not collected, the unit's ExecStart says what it was started with.

Legacy persistence (``nvidia-smi -pm 1`` without the daemon) cannot be seen in files: the
mode is judged on what the driver reports (NVML or ``nvidia-smi -q -x``, see
auditor.checks.lib.gpustate). Either signal saying "on" is on (NVML reported 0 while the
daemon held every GB200, leptonai/gpud#1322); on with no daemon is "on now, set by hand, not
kept across a reboot": the driver logs "Persistence mode is deprecated and will be removed in
a future release. Please use nvidia-persistenced instead." when nvidia-smi -pm sets it (the
lent H200's kernel log, tests/fixtures/hosts/h200-lent-vm.kmsg), and nothing sets it again
at boot. Off with no daemon is the case where GPUs deinitialise between jobs.

A daemon that is down because its package is of another driver version than the loaded module
will refuse again when started: its libnvidia-cfg talks to the module through the RM API,
which refuses a client of another version ("NVRM: API mismatch: the client has the version
..., but this kernel module has the version ...", kernel-open/nvidia/nv.c). The finding names
that cause (and an ``apt-mark hold`` that kept the package behind), and the fix releases the
hold and installs the package at the module's version before starting it, as
nvidia.fabricmanager does; it never only enables or restarts it. The daemon ships in
``nvidia-compute-utils-<branch>[-server]`` (Ubuntu's archive and NVIDIA's repository), whose
version is the driver's; Debian's separately built ``nvidia-persistenced`` follows its own
release numbers and is not compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import nvidia, packages, pci, units
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts import gpufiles
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy, Step

UNIT = "nvidia-persistenced.service"
PIDFILES = ("/run/nvidia-persistenced/nvidia-persistenced.pid",
            "/var/run/nvidia-persistenced/nvidia-persistenced.pid")
COMM = "nvidia-persistenced"
FLAG = "--no-persistence-mode"
DROP_IN = f"/etc/systemd/system/{UNIT}.d/host-auditor-persistence.conf"
#: The packages that ship the daemon at the driver's version (branch, server or not).
_PACKAGE = lazy_re(r"nvidia-compute-utils-([0-9]{3,4})(-server)?")
_DEB_VERSION = lazy_re(r"(?:[0-9]+:)?([0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)")
#: Where the driver's own state was not read: persistence set by hand cannot be told.
_LEGACY = ("whether persistence was set by hand (nvidia-smi -pm 1, lost at reboot) cannot be "
           "told without the driver's state")
#: The driver logs "NVRM: Persistence mode is deprecated and will be removed in a future
#: release. Please use nvidia-persistenced instead." when nvidia-smi -pm sets it.
_BY_HAND = ("set by hand (nvidia-smi -pm 1, a mode the driver deprecates in favour of "
            "nvidia-persistenced) and not kept across a reboot")


def drop_in_text(argv: Sequence[str]) -> str:
    """Return a drop-in that restarts the daemon's ExecStart without ``--no-persistence-mode``."""
    import shlex

    kept = [a for a in argv if a != FLAG]
    return ("# Written by host-auditor: keep persistence mode on.\n[Service]\nExecStart=\n"
            f"ExecStart={shlex.join(kept)}\n")


def daemon_package(host: Host) -> tuple[packages.Package, str] | None:
    """Return the installed package that ships the daemon and its driver-style version."""
    for package in packages.dpkg_packages(host).installed("nvidia-compute-utils-"):
        if _PACKAGE.fullmatch(package.name):
            match = _DEB_VERSION.match(package.version)
            if match:
                return package, match.group(1)
    return None


def _effective(host: Host) -> str | None:
    """Return the persistence mode the driver reports: on, off, partly, or None (unknown)."""
    from auditor.checks.lib import gpustate

    state = gpustate.state(host)
    if state is None or state.error is not None:
        return None
    modes = [g.persistence_mode for g in state.gpus if g.error is None]
    known = [m for m in modes if m is not None]
    if not known:
        return None
    if all(known):
        return "on"
    return "off" if not any(known) else "partly"


class NvidiaPersistence(Check[CheckOptions]):
    """nvidia-persistenced must run with persistence on, or GPUs re-initialise between jobs."""

    id: ClassVar[str] = "nvidia.persistence"
    severity: ClassVar[Severity] = Severity.LOW
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *PIDFILES,
        "/proc/[0-9]*/comm",
        "/proc/[0-9]*/cmdline",
        *nvidia.OWNER_READS,
        "/proc/1/ns/pid",
        *units.reads(UNIT),
        *units.UNIT_DIRS,
        "/run",
        *units.UDEV_RULES,
        *packages.DPKG_READS,
        *nvidia.DRIVER_READS,
        *pci.DEVICE_READS,
        *ENVIRONMENT_READS,
        *gpufiles.READS,
    )
    rationale: ClassVar[str] = (
        "Without persistence the driver deinitialises a GPU when its last client exits: the "
        "next inference server start pays seconds of re-initialisation, and NVML in "
        "containers can hang ('Unknown Error'). DCGM flags it (DCGM_FR_PERSISTENCE_MODE); "
        "nvidia-persistenced keeps every GPU initialised unless it runs with "
        "--no-persistence-mode."
    )
    remedy: ClassVar[str] = (
        "Run nvidia-persistenced without --no-persistence-mode (a systemd drop-in that "
        "resets ExecStart), started at boot (its unit enabled, or the driver's udev rule); "
        "nvidia-smi -pm 1 turns persistence on until the next reboot."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE})
    #: A snapshot keeps the daemon's /proc entries (owner, cgroup, namespace) to replay it.
    daemons: ClassVar[frozenset[str]] = frozenset({COMM[:15]})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self._judge(host)

    def _judge(self, host: Host) -> Finding:
        env = environment(host)
        if env.in_container:
            return self.skipped(COMM, f"inside a {env.describe()}: persistence is the host's "
                                "(the driver often reports it off inside containers); audit "
                                "the host")
        gpus = [g for g in nvidia.gpus(host) if g.driver not in nvidia.PASSTHROUGH_DRIVERS]
        driver = nvidia.loaded_driver(host)
        if driver is None and not gpus:
            return self.skipped(COMM, "no NVIDIA driver loaded and no NVIDIA GPU")
        unit = units.read_unit(host, UNIT)
        # Its pid file's process counts only as the system's (its unit's cgroup, or root).
        process = next((p for p in (nvidia.daemon(host, f, COMM, UNIT) for f in PIDFILES)
                        if p), None)
        udev = units.udev_starts(host, UNIT)
        ev: dict[str, str] = {"unit": unit.path, "exec_start": " ".join(unit.exec_start),
                              "exec_start_at": unit.exec_start_at,
                              "enabled_by": " ".join(unit.enabled_by), "udev_rule": udev}
        at_boot = bool(unit.enabled_by or udev)
        effective = _effective(host)
        if effective is not None:
            ev["driver_persistence"] = effective
        if process is None:
            if not unit.installed and not host.exists("/run") and not any(
                    host.exists(d) for d in units.UNIT_DIRS):
                if effective == "on":
                    return self.passed(
                        COMM, "persistence is on (the driver reports it enabled on every "
                        "GPU); whether nvidia-persistenced keeps it across reboots cannot be "
                        "told (no /run or systemd unit directory in this capture)",
                        observed="on", evidence=ev)
                return self.skipped(
                    COMM, "neither /run nor a systemd unit directory was read (a capture "
                    "without them): whether nvidia-persistenced runs cannot be told",
                    evidence=ev)
            where = ("not installed" if not unit.installed else "not running"
                     + ("" if at_boot else " and nothing starts it at boot"))
            mismatch = self._mismatch(host, driver, unit.installed, ev)
            if mismatch:
                return self.warned(
                    COMM, f"nvidia-persistenced is not running: {mismatch}; started again it "
                    "refuses again, and nothing keeps the GPUs initialised",
                    observed=f"not running ({ev['package_version']})",
                    expected=f"{ev['package']} at {ev['driver']}", evidence=ev,
                    fix=(f"apt-mark unhold {ev['package']}; " if "package_held" in ev else "")
                    + f"install {ev['package_for_driver']} at {ev['driver']}, hold it, then "
                    f"start {UNIT}")
            if effective == "on":
                return self.warned(
                    COMM, "persistence is on now (the driver reports it enabled on every "
                    f"GPU), but {_BY_HAND}: nvidia-persistenced is {where}",
                    observed="on, set by hand", expected="nvidia-persistenced running",
                    evidence=ev)
            if effective in ("off", "partly"):
                return self.warned(
                    COMM, f"persistence is {effective} (the driver's own state) and "
                    f"nvidia-persistenced is {where}: the driver deinitialises a GPU when its "
                    "last client exits, and the next start pays its re-initialisation",
                    observed=f"{effective}, no daemon", expected="running", evidence=ev)
            return self.warned(
                COMM, f"nvidia-persistenced is {where}: nothing keeps the GPUs initialised "
                f"across reboots; {_LEGACY}", observed=where.split(" and")[0],
                expected="running", evidence=ev)
        ev["pid"] = process.pid
        if not process.vouched:
            return self.skipped(
                COMM, f"a process named {COMM} runs (pid {process.pid}) but its "
                "/proc/<pid>/status was not read: whether it is the system's daemon cannot be "
                "told", evidence=ev)
        if process.argv is not None:
            argv, source = process.argv, f"/proc/{process.pid}/cmdline"
        else:
            argv, source = unit.exec_start, f"{unit.exec_start_at} (its command line was not "\
                "collected)"
        ev["argv"] = " ".join(argv)[:1024]
        ev["argv_from"] = source
        if FLAG in argv and process.argv is not None and unit.exec_start and \
                FLAG not in unit.exec_start:
            return self.warned(
                COMM, f"nvidia-persistenced runs with {FLAG} ({source}), which "
                f"{unit.exec_start_at} no longer passes: restart it (systemctl restart "
                f"{UNIT}) to keep the GPUs initialised", observed=FLAG,
                expected="persistence mode on", evidence=ev,
                fix=f"systemctl restart {UNIT}")
        if FLAG in argv:
            return self.warned(
                COMM, f"nvidia-persistenced runs with {FLAG} ({source}): it keeps no GPU "
                "initialised, so GPUs deinitialise between jobs",
                observed=FLAG, expected="persistence mode on", evidence=ev,
                fix="a drop-in that resets ExecStart without the flag; nvidia-smi -pm 1 now")
        if not at_boot:
            return self.warned(
                COMM, "nvidia-persistenced runs now, but neither an enabled unit nor a udev "
                "rule starts it at boot", observed="not enabled", expected="started at boot",
                evidence=ev)
        return self.passed(
            COMM, f"nvidia-persistenced runs (pid {process.pid}) with persistence on, started "
            f"at boot by {'the udev rule ' + udev if udev else ', '.join(unit.enabled_by)}",
            observed="running", evidence=ev)

    def _mismatch(self, host: Host, driver: nvidia.LoadedDriver | None, installed: bool,
                  ev: dict[str, str]) -> str:
        """Return why the daemon cannot run against the loaded module ("" if no such cause)."""
        found = daemon_package(host)
        if driver is None or not installed or found is None:
            return ""
        package, version = found
        if version == driver.version:
            return ""
        branch = driver.version.split(".")[0]
        match = _PACKAGE.fullmatch(package.name)
        # A branch package never carries another branch's versions: the driver's branch has
        # its own (nvidia-compute-utils-580-server for 580.x).
        for_driver = package.name if match is None or match.group(1) == branch else \
            f"nvidia-compute-utils-{branch}{match.group(2) or ''}"
        ev.update(package=package.name, package_version=package.version[:64],
                  driver=driver.version, package_for_driver=for_driver)
        held = ""
        if package.held:
            ev["package_held"] = package.name
            held = "; the package is held (apt-mark hold), so the driver's upgrade left it behind"
        return (f"its package {package.name} is {version} and the loaded driver is "
                f"{driver.version}: the daemon's NVIDIA libraries refuse a kernel module of "
                f"another version (NVRM: API mismatch){held}")

    # -- the fix ------------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Drop --no-persistence-mode with a drop-in; enable the unit where it can be enabled."""
        from auditor.remedy import Advice, MakeSymlink, Remedy, RunCommand, WriteFile, evidence
        remedies: list[Remedy] = []
        unit = units.read_unit(host, UNIT)
        for finding in findings:
            ev = evidence(finding)
            steps: list[Step] = []
            advice: list[Advice] = []
            notes: list[str] = []
            argv = unit.exec_start
            if FLAG in argv or FLAG in ev.get("argv", "").split():
                if not argv:
                    argv = tuple(ev.get("argv", "").split())
                steps.append(WriteFile(DROP_IN, drop_in_text(argv)))
            if unit.installed and not unit.enabled_by and "multi-user.target" in unit.wanted_by \
                    and not ev.get("udev_rule"):
                steps.append(MakeSymlink(
                    f"/etc/systemd/system/multi-user.target.wants/{UNIT}", unit.path))
            if steps:
                steps.append(RunCommand(("systemctl", "daemon-reload"),
                                        after=tuple(range(len(steps))),
                                        undo=("systemctl", "daemon-reload"), optional=True))
            if ev.get("package_for_driver") and ev.get("driver"):
                # The cause found drives the fix: starting it before the versions match
                # fails again (nvidia.fabricmanager does the same for its daemon).
                advice.extend(_match_driver(ev))
            elif not unit.installed:
                advice.append(Advice("install the driver's nvidia-persistenced (the "
                                     "nvidia-compute-utils package on Ubuntu)"))
            else:
                advice.append(Advice("restart the daemon with the new settings",
                                     ("systemctl", "restart", UNIT)))
            if not ev.get("package_for_driver"):
                advice.append(Advice("or turn persistence on until the next reboot",
                                     ("nvidia-smi", "-pm", "1")))
            if unit.installed and not unit.wanted_by and not ev.get("udev_rule"):
                notes.append(f"{UNIT} has no [Install] section and no udev rule starts it: "
                             "start it from the driver's udev rule or a unit of your own")
            remedies.append(Remedy(
                check=self.id, subject=finding.subject,
                title="run nvidia-persistenced with persistence mode on",
                persistent=tuple(steps), advice=tuple(advice), notes=tuple(notes),
            ))
        return remedies


def _match_driver(ev: dict[str, str]) -> list[Advice]:
    """Return the steps by hand that bring the daemon's package to the loaded driver's version."""
    from auditor.checks.nvidia_fabricmanager import pinned_version
    from auditor.remedy import Advice

    name, driver = ev["package_for_driver"], ev["driver"]
    upstream = _DEB_VERSION.match(ev.get("package_version", ""))
    pinned = pinned_version(ev.get("package_version", ""), upstream.group(1), driver) \
        if upstream else ""
    advice: list[Advice] = []
    if ev.get("package_held"):
        advice.append(Advice("release the hold that kept it at the old version",
                             ("apt-mark", "unhold", ev["package_held"])))
    advice.append(Advice(f"install {name} at version {driver}, the loaded driver's (apt-cache "
                         f"policy {name} lists the versions; or reboot into the driver the "
                         "package is of, which nvidia.driver reports)",
                         ("apt-get", "install", f"{name}={pinned}" if pinned else name)))
    advice.append(Advice("hold it with the driver so they upgrade together",
                         ("apt-mark", "hold", name)))
    advice.append(Advice("then start it (it refuses to start before the versions match)",
                         ("systemctl", "start", UNIT)))
    return advice
