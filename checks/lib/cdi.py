"""CDI (Container Device Interface) specs: read with a real YAML/JSON parser, bounded.

Shared by ``container.cdi``. From cncf-tags/container-device-interface (SPEC.md,
pkg/cdi/spec-dirs.go, pkg/cdi/cache.go): specs are the ``*.json`` and ``*.yaml`` files of
``/etc/cdi`` (static) and ``/var/run/cdi`` (dynamic, generated), not recursing; a device
defined in both directories resolves to the later directory's (higher priority); a device
defined twice in one directory is a conflict, and the runtime drops it. A spec has
``cdiVersion``, ``kind`` (``vendor/class``, ``nvidia.com/gpu``), ``devices`` (each a ``name``
and ``containerEdits``) and spec-wide ``containerEdits``; edits carry ``deviceNodes``
(``path``, ``hostPath``), ``mounts`` (``hostPath``, ``containerPath``) and ``hooks``.

PyYAML is imported only when a ``.yaml`` spec exists, so an audit without CDI specs does not
pay for it. Everything is bounded: file size, number of devices and edits, nodes walked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: What :func:`read_specs` reads.
READS: tuple[str, ...] = tuple(f"{d}/*.{ext}" for d in SPEC_DIRS for ext in ("yaml", "json"))

MAX_SPEC_BYTES = 4 << 20
MAX_DEVICES = 4096
MAX_EDITS = 8192


class HostPath(NamedTuple):
    """A host path a spec makes the runtime use, and what for."""

    path: str
    #: ``device``, ``mount`` or ``hook``.
    role: str
    #: The device it belongs to ("" for the spec-wide edits).
    device: str = ""


@dataclass
class Spec:
    """One CDI spec file, parsed (or why it could not be)."""

    path: str
    #: Index of its directory in :data:`SPEC_DIRS` (higher wins).
    priority: int
    kind: str = ""
    version: str = ""
    devices: list[str] = field(default_factory=list)
    paths: list[HostPath] = field(default_factory=list)
    #: Container paths of device nodes per device (``/dev/nvidia0``).
    device_nodes: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""

    @property
    def vendor(self) -> str:
        """Return the vendor part of ``kind`` (``nvidia.com``)."""
        return self.kind.partition("/")[0]


def _strings(value: Any, limit: int = MAX_EDITS) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


def _edits(spec: Spec, edits: Any, device: str) -> None:
    if not isinstance(edits, dict):
        return
    for node in _strings(edits.get("deviceNodes")):
        if not isinstance(node, dict):
            continue
        path = node.get("path")
        host_path = node.get("hostPath") or path
        if isinstance(host_path, str) and host_path.startswith("/"):
            spec.paths.append(HostPath(host_path[:4096], "device", device))
        if isinstance(path, str):
            spec.device_nodes.setdefault(device, []).append(path[:4096])
    for mount in _strings(edits.get("mounts")):
        if isinstance(mount, dict) and isinstance(mount.get("hostPath"), str) and \
                mount["hostPath"].startswith("/"):
            spec.paths.append(HostPath(mount["hostPath"][:4096], "mount", device))
    for hook in _strings(edits.get("hooks")):
        if isinstance(hook, dict) and isinstance(hook.get("path"), str) and \
                hook["path"].startswith("/"):
            spec.paths.append(HostPath(hook["path"][:4096], "hook", device))


def load(data: Any, spec: Spec) -> Spec:
    """Fill a spec from its parsed document (any shape: what is not a spec is an error)."""
    if not isinstance(data, dict):
        spec.error = "the document is not a mapping"
        return spec
    kind, version = data.get("kind"), data.get("cdiVersion")
    if not isinstance(kind, str) or "/" not in kind:
        spec.error = "no kind (vendor/class)"
        return spec
    spec.kind = kind[:256]
    spec.version = str(version)[:32] if isinstance(version, (str, int, float)) else ""
    _edits(spec, data.get("containerEdits"), "")
    for device in _strings(data.get("devices"), MAX_DEVICES):
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        name = device["name"][:256]
        spec.devices.append(name)
        _edits(spec, device.get("containerEdits"), name)
        if len(spec.paths) > MAX_EDITS:
            break
    return spec


def parse(text: str, path: str, priority: int) -> Spec:
    """Parse one spec file's text (JSON, or YAML through PyYAML's safe loader)."""
    spec = Spec(path, priority)
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml  # deferred: only hosts with a YAML spec pay for the import

            data = yaml.safe_load(text)
    except RecursionError:
        spec.error = "nested too deeply"
        return spec
    except Exception as exc:  # any parser error means the spec is unreadable
        spec.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return spec
    try:
        return load(data, spec)
    except RecursionError:
        spec.error = "nested too deeply"
        return spec


def read_specs(host: Host) -> list[Spec]:
    """Return every CDI spec file of the host, parsed, in directory priority order."""
    specs: list[Spec] = []
    for priority, directory in enumerate(SPEC_DIRS):
        found = sorted({*host.glob(f"{directory}/*.yaml"), *host.glob(f"{directory}/*.json")})
        for path in found[:256]:
            if host.is_dir(path):
                continue
            raw = files.read_bytes(host, path, MAX_SPEC_BYTES + 1)
            if raw is None:
                specs.append(Spec(path, priority, error="unreadable, or not a regular file"))
                continue
            if len(raw) > MAX_SPEC_BYTES:
                specs.append(Spec(path, priority, error="larger than 4 MiB"))
                continue
            specs.append(parse(raw.decode("utf-8", "replace"), path, priority))
    return specs


def conflicts(specs: list[Spec]) -> dict[str, list[str]]:
    """Return devices (``kind=name``) defined by several specs of the same directory."""
    seen: dict[tuple[int, str], list[str]] = {}
    for spec in specs:
        for name in spec.devices:
            seen.setdefault((spec.priority, f"{spec.kind}={name}"), []).append(spec.path)
    return {qualified: paths for (_, qualified), paths in seen.items() if len(paths) > 1}
