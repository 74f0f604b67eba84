"""nvidia.fabricmanager: on NVSwitch systems, fabric manager runs and matches the driver.

On HGX/DGX baseboards the GPUs reach each other through NVSwitches that fabric manager
(``nv-fabricmanager``) trains and registers; until it has, CUDA initialisation fails with
"system not yet initialized" (802; wilicc/gpu-burn#133, DCGM's ``checkFabricManager``), and
fabric manager refuses to run against a driver of another version (NVIDIA Fabric Manager
User Guide: the versions must match exactly).

NVSwitches are NVIDIA functions of class 0x0680, or ``/dev/nvidia-nvswitchN`` nodes
(``/dev/nvidia-nvswitchctl`` alone exists on hosts without any). GB200 NVL72 compute trays
see no local NVSwitch (the switches sit in their own trays): they are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import nvidia, packages, pci, units
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, MakeSymlink, Remedy, RunCommand

UNIT = "nvidia-fabricmanager.service"
COMM = "nv-fabricmanager"
PIDFILES = ("/run/nvidia-fabricmanager/nv-fabricmanager.pid",
            "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid")
NVSWITCH_NODES = "/dev/nvidia-nvswitch[0-9]*"
_PACKAGE = lazy_re(r"nvidia-fabricmanager(?:-([0-9]{3,4}))?")
_DEB_VERSION = lazy_re(r"(?:[0-9]+:)?([0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)")


def package_version(host: Host) -> tuple[str, str] | None:
    """Return (package, driver-style version) of the installed fabric manager package."""
    found = installed_package(host)
    return (found[0].name, found[1]) if found else None


def installed_package(host: Host) -> tuple[packages.Package, str] | None:
    """Return the installed fabric manager package and its driver-style version."""
    for package in packages.dpkg_packages(host).installed("nvidia-fabricmanager"):
        if _PACKAGE.fullmatch(package.name):
            match = _DEB_VERSION.match(package.version)
            if match:
                return package, match.group(1)
    return None


def pinned_version(deb_version: str, upstream: str, driver: str) -> str:
    """Return the package version of ``driver``'s release, shaped as the installed one.

    ``550.90.07-1`` -> ``550.127.05-1``: NVIDIA's repositories and Ubuntu's archive keep the
    revision scheme across driver versions; "" where the version cannot be shaped so.
    """
    epoch, sep, rest = deb_version.rpartition(":")
    if not rest.startswith(upstream) or not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,4}){1,2}",
                                                         driver):
        return ""
    pinned = (f"{epoch}{sep}" if sep else "") + driver + rest[len(upstream):]
    return pinned if re.fullmatch(r"[0-9A-Za-z.+~:-]{1,64}", pinned) else ""


class NvidiaFabricmanager(Check[CheckOptions]):
    """NVSwitch systems need fabric manager at the driver's version, or CUDA cannot start."""

    id: ClassVar[str] = "nvidia.fabricmanager"
    severity: ClassVar[Severity] = Severity.CRITICAL
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        NVSWITCH_NODES,
        *PIDFILES,
        "/proc/[0-9]*/comm",
        *nvidia.OWNER_READS,
        "/proc/1/ns/pid",
        *units.reads(UNIT),
        *packages.DPKG_READS,
        *nvidia.DRIVER_READS,
        nvidia.OPERATOR_ROOT,
        *pci.DEVICE_READS,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "On NVSwitch baseboards (HGX/DGX A100, H100, H200, B200) fabric manager trains the "
        "NVLink fabric and registers every GPU with it; until it has, CUDA fails with 'system "
        "not yet initialized', and it will not run against a driver of another version."
    )
    remedy: ClassVar[str] = (
        "Install the fabric manager package of exactly the driver's version, enable and start "
        "nvidia-fabricmanager, and hold both packages so they upgrade together."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.PCI})
    #: A snapshot keeps the daemon's /proc entries (owner, cgroup, namespace) to replay it.
    daemons: ClassVar[frozenset[str]] = frozenset({COMM[:15]})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        yield self._judge(host)

    def _judge(self, host: Host) -> Finding:
        switches = nvidia.nvswitches(host)
        nodes = host.glob(NVSWITCH_NODES)[:64]
        ev: dict[str, str] = {"nvswitches": " ".join(s.address for s in switches),
                              "nodes": " ".join(nodes)}
        if not switches and not nodes:
            return self.skipped("fabricmanager", "no NVSwitch (no NVIDIA function of class "
                                "0x0680, no /dev/nvidia-nvswitchN): fabric manager is not "
                                "needed", evidence=ev)
        env = environment(host)
        if env.in_container:
            return self.skipped("fabricmanager", f"inside a {env.describe()}: fabric manager "
                                "is the host's; audit the host", evidence=ev)
        count = len(switches) or len(nodes)
        driver = nvidia.loaded_driver(host)
        # A process of that name proves nothing by its name: it counts when it is the
        # system's (its unit's cgroup, or root in the host's PID namespace).
        seen = nvidia.sightings(host, COMM, PIDFILES, UNIT)
        pid = next((s.pid for s in seen if s.verdict), None)
        unit = units.read_unit(host, UNIT)
        found = installed_package(host)
        installed = (found[0].name, found[1]) if found else None
        operator = host.exists(nvidia.OPERATOR_ROOT)
        ev.update(unit=unit.path, enabled_by=" ".join(unit.enabled_by), pid=pid or "",
                  driver=driver.version if driver else "",
                  package=f"{installed[0]} {installed[1]}" if installed else "")
        if found:
            ev["package_version"] = found[0].version[:64]
            if found[0].held:
                ev["package_held"] = found[0].name
        ignored = [s for s in seen if s.verdict is False]
        if ignored:
            ev["ignored"] = "; ".join(f"pid {s.pid} {s.why}" for s in ignored)[:512]
        unknown = next((s for s in seen if s.verdict is None), None)
        if pid is None and unknown is not None:
            return self.skipped(
                "fabricmanager", f"a process named {COMM} runs (pid {unknown.pid}) but "
                f"{unknown.why}: whether fabric manager runs cannot be told", evidence=ev)
        if pid is None and driver is not None and installed and installed[1] != driver.version:
            # The cause is known: it refuses to start against another driver version.
            # Starting it again would fail again; the package must match first.
            held = ("; the package is held (apt-mark hold), so upgrades left it behind"
                    if found and found[0].held else "")
            return self.failed(
                "fabricmanager", f"{count} NVSwitch(es) but fabric manager is not running: its "
                f"package {installed[0]} is {installed[1]} and the loaded driver is "
                f"{driver.version}; fabric manager refuses to start against another driver "
                f"version{held}, and CUDA fails with 'system not yet initialized'",
                observed=f"not running ({installed[1]})", expected=driver.version,
                evidence=ev, fix=(f"apt-mark unhold {installed[0]}; " if held else "")
                + f"install {installed[0]} {driver.version}, then start it")
        if pid is None:
            missing = "not installed" if not (unit.installed or installed or operator) else \
                "not running"
            return self.failed(
                "fabricmanager", f"{count} NVSwitch(es) but fabric manager is {missing}: CUDA "
                "initialisation fails with 'system not yet initialized' until it has trained "
                "the fabric" + (f" (a process of that name proves nothing: {ev['ignored']})"
                                if ignored else ""),
                observed=missing, expected="nv-fabricmanager running",
                evidence=ev, fix=f"systemctl enable --now {UNIT.removesuffix('.service')}")
        if driver is None:
            return self.passed("fabricmanager", f"fabric manager runs (pid {pid}); no NVIDIA "
                               "module is loaded to compare its version with", evidence=ev)
        if installed is None:
            where = ("the GPU Operator runs it in its driver container" if operator else
                     "no dpkg package records it (RPM or runfile install)")
            return self.passed(
                "fabricmanager", f"fabric manager runs (pid {pid}) on {count} NVSwitch(es); its "
                f"version cannot be read from files ({where}): compare nv-fabricmanager "
                f"--version with driver {driver.version} by hand", evidence=ev)
        name, version = installed
        if version != driver.version:
            return self.failed(
                "fabricmanager", f"fabric manager {version} ({name}) runs against driver "
                f"{driver.version}: the versions must match, or fabric manager exits and CUDA "
                "cannot initialise", observed=version, expected=driver.version, evidence=ev,
                fix=f"install {name} {driver.version} and restart it")
        if not unit.enabled_by:
            return self.warned(
                "fabricmanager", f"fabric manager {version} runs (pid {pid}) but {UNIT} is not "
                "enabled: after a reboot CUDA fails until someone starts it",
                observed="not enabled", expected="enabled", evidence=ev)
        return self.passed("fabricmanager", f"fabric manager {version} runs (pid {pid}) at the "
                           f"driver's version on {count} NVSwitch(es)", evidence=ev)

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Enable the unit where it is installed; say which package and version to install."""
        from auditor.remedy import Advice, MakeSymlink, Remedy, RunCommand, evidence
        remedies: list[Remedy] = []
        unit = units.read_unit(host, UNIT)
        for finding in findings:
            ev = evidence(finding)
            advice: list[Advice] = []
            steps: list[MakeSymlink | RunCommand] = []
            if unit.installed and not unit.enabled_by and "multi-user.target" in unit.wanted_by:
                steps.append(MakeSymlink(
                    f"/etc/systemd/system/multi-user.target.wants/{UNIT}", unit.path))
                steps.append(RunCommand(("systemctl", "daemon-reload"), after=(0,),
                                        undo=("systemctl", "daemon-reload"), optional=True))
            driver = ev.get("driver", "")
            package = ev.get("package", "").split()
            if driver and (not package or package[1:] != [driver]):
                branch = driver.split(".")[0]
                name = package[0] if package else f"nvidia-fabricmanager-{branch}"
                old = name
                if _PACKAGE.fullmatch(name) and name != "nvidia-fabricmanager" and \
                        not name.endswith(f"-{branch}"):
                    # Branch packages (nvidia-fabricmanager-570) never carry another
                    # branch's versions: the driver's branch has its own package.
                    name = f"nvidia-fabricmanager-{branch}"
                if ev.get("package_held"):
                    advice.append(Advice("release the hold that kept it at the old version",
                                         ("apt-mark", "unhold", old)))
                pinned = pinned_version(ev.get("package_version", ""), package[1], driver) \
                    if len(package) == 2 else ""
                advice.append(Advice(f"install {name} at version {driver}, the driver's "
                                     f"(apt-cache policy {name} lists the versions)",
                                     ("apt-get", "install", f"{name}={pinned}" if pinned
                                      else name)))
                advice.append(Advice("hold it with the driver so they upgrade together",
                                     ("apt-mark", "hold", name)))
                advice.append(Advice("then start it (it refuses to start before the versions "
                                     "match)", ("systemctl", "start", UNIT)))
            else:
                advice.append(Advice("start it now", ("systemctl", "start", UNIT)))
            remedies.append(Remedy(check=self.id, subject=finding.subject,
                                   title="run fabric manager at the driver's version",
                                   persistent=tuple(steps), advice=tuple(advice)))
        return remedies
