"""container.cdi: NVIDIA CDI specs that still describe the previous driver or the previous GPUs.

Docker, Podman, containerd and CRI-O (and the NVIDIA container toolkit in ``cdi`` mode) inject
GPUs into containers from CDI specs. ``nvidia-ctk cdi generate`` writes the driver's files into
the spec by version (``libcuda.so.580.95.05``, ``/lib/firmware/nvidia/580.95.05``) and the GPUs
present then (``/dev/nvidia0``...): after a driver upgrade or a GPU change, container creation
fails ("error stat'ing file") or CUDA fails inside the container
(NVIDIA/nvidia-container-toolkit#856, containers/podman#26233). This is the Docker/Podman/
Kubernetes twin of the LXC stale-major story (``lxc.device_majors``).

Judged per spec file: unparsable specs (runtimes skip them), devices defined twice in one
directory (the runtime drops both), versioned driver files of another version than the loaded
module, device nodes that no longer exist, and a GPU set that differs from the host's. Host
paths are checked for existence where a collection carries them (device nodes and firmware
directories); versioned files are judged by their version, so a snapshot judges alike.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import cdi, files, nvidia, units
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

#: Host paths whose existence a collection carries (device entries, firmware directories).
CHECKABLE = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/nvidia-caps-imex-channels/*",
             "/dev/dri/*", "/lib/firmware/nvidia/*", "/usr/lib/firmware/nvidia/*")
GPU_NODES = "/dev/nvidia[0-9]*"
GPU_INFORMATION = "/proc/driver/nvidia/gpus/*/information"
REFRESH_UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
NVIDIA_VENDORS = ("nvidia.com", "management.nvidia.com")
_VERSIONED = lazy_re(r"\.so\.([0-9]{3,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)$")
_FIRMWARE = lazy_re(r"/firmware/nvidia/([0-9]{3,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)(?:/|$)")
_GPU_NODE = lazy_re(r"/dev/nvidia([0-9]{1,3})")
_UUID = lazy_re(r"GPU UUID:\s*(GPU-[0-9a-fA-F-]{36})")
_MODE = lazy_re(r'^\s*mode\s*=\s*"([a-z-]{1,16})"')


def checkable(path: str) -> bool:
    """Return whether a collection carries a host path, so its absence can be judged."""
    parts = path.strip("/").split("/")
    for pattern in CHECKABLE:
        wanted = pattern.strip("/").split("/")
        if len(parts) == len(wanted) and all(
                fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True)):
            return True
    return False


def driver_version_of(path: str) -> str:
    """Return the driver version a host path carries in its name (a library, firmware), or ""."""
    name = path.rsplit("/", 1)[-1]
    match = _VERSIONED.search(name)
    if match and ("nvidia" in name or "cuda" in name or name.startswith("libnv")):
        return match.group(1)
    firmware = _FIRMWARE.search(path)
    return firmware.group(1) if firmware else ""


def gpu_uuids(host: Host) -> set[str]:
    """Return the UUIDs of the GPUs the driver reports (/proc/driver/nvidia/gpus/*)."""
    found: set[str] = set()
    for path in host.glob(GPU_INFORMATION)[:256]:
        match = _UUID.search((files.read_optional(host, path) or "")[:4096])
        if match:
            found.add(match.group(1))
    return found


class ContainerCdi(Check[CheckOptions]):
    """An NVIDIA CDI spec left from a previous driver or GPU set breaks container GPUs."""

    id: ClassVar[str] = "container.cdi"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *cdi.READS,
        *CHECKABLE,
        GPU_INFORMATION,
        TOOLKIT_CONFIG,
        *(p for unit in REFRESH_UNITS for p in units.reads(unit)),
        *nvidia.DRIVER_READS,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "CDI specs name the driver's files by version and the GPUs present when they were "
        "generated. After a driver upgrade, a GPU added or removed, or a MIG change, a spec "
        "that was not regenerated makes container creation fail or leaves CUDA in the "
        "container without its GPUs or with the previous driver's libraries."
    )
    remedy: ClassVar[str] = (
        "Regenerate the spec (nvidia-ctk cdi generate --output=<spec>), let the toolkit's "
        "nvidia-cdi-refresh.path regenerate it after driver changes (toolkit 1.18+), and "
        "recreate the containers."
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.GPU_NODE})

    def evaluate(self, host: Host) -> Iterable[Finding]:
        specs = [s for s in cdi.read_specs(host) if s.error or s.vendor in NVIDIA_VENDORS]
        if not specs:
            yield self.skipped("cdi", "no NVIDIA CDI spec in /etc/cdi or /var/run/cdi")
            return
        env = environment(host)
        if env.in_container:
            yield self.skipped("cdi", f"inside a {env.describe()}: CDI specs are read by the "
                               "host's container runtime; audit the host")
            return
        driver = nvidia.loaded_driver(host)
        nodes = {n for n in host.glob(GPU_NODES)[:256] if _GPU_NODE.fullmatch(n)}
        uuids = gpu_uuids(host)
        clashes = cdi.conflicts([s for s in specs if not s.error])
        shadowed = self._shadowed(specs)
        for spec in specs:
            yield self._judge(host, spec, driver, nodes, uuids, clashes, shadowed)
        if any(not s.error for s in specs):
            yield self._refresh(host)

    @staticmethod
    def _shadowed(specs: list[cdi.Spec]) -> dict[str, str]:
        """Return devices of a spec that a higher-priority spec redefines: device -> winner."""
        best: dict[str, cdi.Spec] = {}
        for spec in specs:
            for name in spec.devices:
                key = f"{spec.kind}={name}"
                if key not in best or spec.priority > best[key].priority:
                    best[key] = spec
        return {f"{s.path}|{s.kind}={n}": best[f"{s.kind}={n}"].path for s in specs
                for n in s.devices if best[f"{s.kind}={n}"].path != s.path}

    def _judge(self, host: Host, spec: cdi.Spec, driver: nvidia.LoadedDriver | None,
               nodes: set[str], uuids: set[str], clashes: dict[str, list[str]],
               shadowed: dict[str, str]) -> Finding:
        ev: dict[str, str] = {"kind": spec.kind, "cdi_version": spec.version,
                              "devices": " ".join(spec.devices)[:1024]}
        if spec.error:
            return self.warned(spec.path, f"the CDI spec cannot be read ({spec.error}): "
                               "container runtimes skip it, and its devices are missing",
                               observed="unparsable", expected="a CDI spec", evidence=ev)
        live = [d for d in spec.devices if f"{spec.path}|{spec.kind}={d}" not in shadowed]
        if not live:
            winner = next(iter(shadowed.values()), "")
            return self.passed(spec.path, f"every device of this spec is redefined by {winner}, "
                               "which takes precedence", evidence=ev)
        fails: list[str] = []
        warns: list[str] = []
        if driver is not None:
            ev["driver"] = driver.version
            stale = sorted({(p.path, v) for p in spec.paths
                            if (v := driver_version_of(p.path)) and v != driver.version})
            if stale:
                ev["stale_paths"] = " ".join(p for p, _ in stale)[:2048]
                fails.append(f"{len(stale)} driver file(s) of version "
                             f"{', '.join(sorted({v for _, v in stale}))} while driver "
                             f"{driver.version} is loaded (e.g. {stale[0][0]})")
        missing = sorted({p.path for p in spec.paths if checkable(p.path)
                          and not host.lstat_follow_ok(p.path)})
        if missing:
            ev["missing_paths"] = " ".join(missing)[:2048]
            fails.append(f"{len(missing)} host path(s) no longer exist "
                         f"({', '.join(missing[:3])})")
        clashing = sorted(q for q, paths in clashes.items() if spec.path in paths)
        if clashing:
            ev["conflicts"] = " ".join(clashing)[:1024]
            fails.append(f"{len(clashing)} device(s) also defined by another spec of the same "
                         f"directory ({', '.join(clashing[:3])}): the runtime drops them")
        listed = {p for edits in spec.device_nodes.values() for p in edits
                  if _GPU_NODE.fullmatch(p)}
        if listed and nodes and listed != nodes:
            ev["spec_gpu_nodes"] = " ".join(sorted(listed))
            ev["host_gpu_nodes"] = " ".join(sorted(nodes))
            warns.append(f"it lists GPU nodes {', '.join(sorted(listed))} but the host has "
                         f"{', '.join(sorted(nodes))} (a GPU added, removed or re-enumerated)")
        named = {d for d in spec.devices if d.startswith("GPU-") and len(d) == 40}
        if named and uuids and not named <= uuids:
            ev["unknown_uuids"] = " ".join(sorted(named - uuids))
            warns.append(f"it names GPU UUIDs the host does not have "
                         f"({', '.join(sorted(named - uuids)[:2])})")
        if not fails and not warns:
            return self.passed(spec.path, f"{len(live)} device(s); every versioned file matches "
                               f"driver {driver.version if driver else '?'} and the GPU nodes "
                               "match the host", evidence=ev)
        message = "stale CDI spec: " + "; ".join(fails + warns)
        if fails:
            return self.failed(spec.path, message, observed="stale", expected="current",
                               evidence=ev, fix=f"nvidia-ctk cdi generate --output={spec.path}")
        return self.warned(spec.path, message, observed="stale", expected="current",
                           evidence=ev, fix=f"nvidia-ctk cdi generate --output={spec.path}")

    def _refresh(self, host: Host) -> Finding:
        found = [units.read_unit(host, u) for u in REFRESH_UNITS]
        enabled = [u for u in found if u.enabled_by]
        ev = {"installed": " ".join(u.name for u in found if u.installed),
              "enabled": " ".join(u.name for u in enabled)}
        mode = ""
        for line in (files.read_optional(host, TOOLKIT_CONFIG) or "").split("\n")[:1024]:
            match = _MODE.match(line)
            if match:
                mode = match.group(1)
        ev["toolkit_mode"] = mode
        if enabled:
            return self.passed("refresh", f"{enabled[0].name} regenerates the specs after driver "
                               "changes", evidence=ev)
        installed = [u.name for u in found if u.installed]
        how = (f"{installed[0]} is installed but not enabled" if installed else
               "no nvidia-cdi-refresh unit is installed (NVIDIA container toolkit 1.18+ ships it)")
        return self.warned("refresh", f"nothing regenerates the CDI specs after a driver "
                           f"upgrade: {how}", observed="no refresh", expected="nvidia-cdi-refresh",
                           evidence=ev)

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Enable the toolkit's refresh unit; say how to regenerate each stale spec."""
        from auditor.remedy import Advice, MakeSymlink, Remedy, RunCommand, evidence
        remedies: list[Remedy] = []
        for finding in findings:
            if finding.subject == "refresh":
                unit = units.read_unit(host, REFRESH_UNITS[0])
                if unit.installed and "multi-user.target" in unit.wanted_by:
                    steps = (MakeSymlink(
                        f"/etc/systemd/system/multi-user.target.wants/{unit.name}", unit.path),
                        RunCommand(("systemctl", "daemon-reload"), after=(0,),
                                   undo=("systemctl", "daemon-reload"), optional=True))
                    remedies.append(Remedy(
                        check=self.id, subject="refresh",
                        title=f"enable {unit.name}", persistent=steps,
                        advice=(Advice("start watching now",
                                       ("systemctl", "start", unit.name)),)))
                else:
                    remedies.append(Remedy(
                        check=self.id, subject="refresh", title="regenerate specs on change",
                        advice=(Advice("install NVIDIA container toolkit 1.18 or newer and "
                                       "enable nvidia-cdi-refresh.path, or regenerate the specs "
                                       "after every driver or GPU change"),)))
                continue
            ev = evidence(finding)
            advice = [Advice("regenerate the spec from the running driver and GPUs",
                             ("nvidia-ctk", "cdi", "generate", f"--output={finding.subject}"))]
            if ev.get("conflicts"):
                advice.insert(0, Advice("keep one spec per device: remove or rename the other "
                                        "spec defining " + ev["conflicts"][:200]))
            advice.append(Advice("then recreate the containers that use the GPUs"))
            remedies.append(Remedy(check=self.id, subject=finding.subject,
                                   title="regenerate a stale CDI spec", advice=tuple(advice)))
        return remedies
