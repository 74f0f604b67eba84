"""nccl.env: NCCL workarounds written into files, which outlive the problem they worked around.

NCCL reads ``$NCCL_CONF_FILE`` or ``~/.nccl.conf``, then ``/etc/nccl.conf``, and sets each
variable only where the environment has none (NVIDIA/nccl ``src/misc/param.cc``;
``src/os/linux.cc``: ``setenv(name, value, 0)``): the process environment wins over the
files, the user's file over ``/etc``. Variables also come from ``/etc/environment``,
``/etc/profile.d`` and the ``Environment=``/``EnvironmentFile=`` of serving units.

``NCCL_P2P_DISABLE=1`` and ``NCCL_SHM_DISABLE=1`` are the usual hang "fixes" (vllm-project/
vllm#5484; TrelisResearch/one-click-llms PR #18 bakes ``NCCL_P2P_DISABLE=1
NCCL_IB_DISABLE=1`` into an image): once ACS or the IOMMU is fixed they only cost
bandwidth, GPU to GPU through host memory. ``NCCL_IB_DISABLE=1`` on a host with RDMA NICs
sends inter-node traffic over TCP sockets. ``NCCL_P2P_LEVEL=LOC`` disables P2P, and ``NVL``
without NVSwitch does on PCIe-only hosts. vLLM caches its P2P probe in
``~/.cache/vllm/gpu_p2p_access_cache_for_<devices>.json``: a cache that says ``false``
keeps P2P off after the host is fixed (vllm-project/vllm#8735, #6895; noonghunna/club-3090
#787). Process environments are not read (a snapshot keeps none): only files are judged,
and the findings say so.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions
from auditor.checks.lib import files, nvidia, pci, serving
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

ETC_NCCL = "/etc/nccl.conf"
USER_NCCL = ("/root/.nccl.conf", "/home/*/.nccl.conf")
ENVIRONMENT = "/etc/environment"
PROFILE_D = "/etc/profile.d/*.sh"
#: Where EnvironmentFile= is followed (others are named as not read).
ENV_FILE_DIRS = ("/etc/default/", "/etc/sysconfig/", "/etc/vllm/", "/etc/sglang/")
ENV_FILES = tuple(f"{d}*" for d in ENV_FILE_DIRS)
VLLM_CACHES = ("/root/.cache/vllm/gpu_p2p_access_cache_for_*.json",
               "/home/*/.cache/vllm/gpu_p2p_access_cache_for_*.json")
_ASSIGNMENT = lazy_re(r"\s{0,16}(?:export\s{1,8})?(NCCL_[A-Z0-9_]{1,64})\s{0,4}=\s{0,4}"
                      r"[\"']?([A-Za-z0-9_.,:/-]{0,128})[\"']?\s{0,64}(?:#.{0,512})?")
_MAX_LINES = 4096


class Setting(NamedTuple):
    """One NCCL variable set in a file."""

    name: str
    value: str
    path: str
    line: int
    raw: str
    #: The line sets nothing else (commenting it out removes only NCCL settings).
    alone: bool


def _file_settings(host: Host, path: str) -> list[Setting]:
    found = []
    for number, raw in enumerate((files.read_text(host, path, 1 << 20) or "").split("\n")
                                 [:_MAX_LINES], start=1):
        match = _ASSIGNMENT.fullmatch(raw[:1024])
        if match:
            found.append(Setting(match.group(1), match.group(2), path, number, raw, True))
    return found


def _unit_settings(host: Host, path: str) -> tuple[list[Setting], list[str]]:
    found: list[Setting] = []
    unread: list[str] = []
    section = ""
    for number, raw in enumerate((files.read_text(host, path, 1 << 20) or "").split("\n")
                                 [:_MAX_LINES], start=1):
        line = raw[:4096].strip()
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key.strip() == "Environment":
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            pairs = [w.partition("=") for w in words[:256]]
            nccl = [(k, v) for k, _, v in pairs if k.startswith("NCCL_")]
            alone = len(nccl) == len(pairs)
            found += [Setting(k, v[:128], path, number, raw, alone) for k, v in nccl]
        elif key.strip() == "EnvironmentFile":
            target = value.strip().lstrip("-")
            if target.startswith(ENV_FILE_DIRS) and "/../" not in target:
                found += _file_settings(host, target)
            elif target:
                unread.append(target[:256])
    return found, unread


def settings(host: Host) -> tuple[list[Setting], list[str]]:
    """Return every NCCL variable set in the files NCCL and the serving units read."""
    paths = [ETC_NCCL, *(p for pattern in USER_NCCL for p in host.glob(pattern)[:256]),
             ENVIRONMENT, *host.glob(PROFILE_D)[:256]]
    found = [s for path in paths for s in _file_settings(host, path)]
    unread: list[str] = []
    for unit in serving.serving_units(host):
        more, missing = _unit_settings(host, unit)
        found += more
        unread += missing
    return found, unread


class NcclEnv(Check[CheckOptions]):
    """NCCL workarounds left in files (P2P, IB, SHM disabled) cost bandwidth after the fix."""

    id: ClassVar[str] = "nccl.env"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        ETC_NCCL, *USER_NCCL, ENVIRONMENT, PROFILE_D, *ENV_FILES, *VLLM_CACHES,
        *serving.UNIT_READS, *pci.DEVICE_READS, *where.READS,
    )
    rationale: ClassVar[str] = (
        "NCCL_P2P_DISABLE, NCCL_SHM_DISABLE and NCCL_IB_DISABLE are set to get past hangs and "
        "stay in /etc/nccl.conf, profile scripts and unit files: GPU-to-GPU traffic then "
        "goes through host memory, inter-node traffic over TCP, long after the host is fixed."
    )
    remedy: ClassVar[str] = (
        "Comment out the workaround where it is set (when the host's P2P path, ACS and IOMMU "
        "are sound: pcie.acs, iommu.mode), restart the servers; delete vLLM's P2P cache "
        "files that say false."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        found, unread = settings(host)
        devices = pci.devices(host)
        rdma = any(d.is_rdma_nic for d in devices)
        nvswitch = bool(nvidia.nvswitches(host))
        env = where.environment(host)
        note = ("files only: a variable set in a process's environment or a container "
                "image's ENV is not seen")
        problems = 0
        for setting in found:
            why = self._harm(setting, rdma, nvswitch)
            if not why:
                continue
            problems += 1
            related = ("rdma.peermem and rdma.memlock" if "_IB_" in setting.name
                       else "pcie.acs and iommu.mode")
            yield self.warned(
                f"{setting.path}:{setting.line}", f"{setting.name}={setting.value} in "
                f"{setting.path}:{setting.line}: {why}; a workaround that outlives the fix "
                f"(check {related} before removing it)",
                aspect=setting.name, observed=f"{setting.name}={setting.value}",
                expected="unset", fix=f"comment out {setting.path}:{setting.line} and restart "
                "the servers", evidence={"path": setting.path, "line": str(setting.line),
                                         "alone": "yes" if setting.alone else "no",
                                         "environment": env.describe()})
        for cache in (p for pattern in VLLM_CACHES for p in host.glob(pattern)[:64]):
            finding = self._vllm_cache(host, cache)
            if finding is not None:
                problems += 1
                yield finding
        if not problems:
            unread_note = (f"; EnvironmentFile not read: {', '.join(unread[:4])}"
                           if unread else "")
            yield self.passed("nccl", f"no NCCL workaround in {len(found)} NCCL setting(s) "
                              f"found ({note}){unread_note}",
                              evidence={"settings": " ".join(f"{s.name}={s.value}"
                                                             for s in found)[:512]})

    @staticmethod
    def _harm(setting: Setting, rdma: bool, nvswitch: bool) -> str:
        on = setting.value.lower() in ("1", "true", "yes", "on")
        if setting.name == "NCCL_P2P_DISABLE" and on:
            return "GPU-to-GPU traffic is staged through host memory"
        if setting.name == "NCCL_SHM_DISABLE" and on:
            return "NCCL's shared-memory transport is off: traffic falls back to the network"
        if setting.name == "NCCL_IB_DISABLE" and on and rdma:
            return "this host has RDMA NICs, and NCCL uses TCP sockets instead"
        if setting.name == "NCCL_P2P_LEVEL" and setting.value.upper() in ("LOC", "0"):
            return "P2P is never used between GPUs"
        if setting.name == "NCCL_P2P_LEVEL" and setting.value.upper() == "NVL" and not nvswitch:
            return ("P2P only over NVLink, on a host with no NVSwitch (PCIe P2P is off; "
                    "NVLink bridges are not visible in files)")
        return ""

    def _vllm_cache(self, host: Host, path: str) -> Finding | None:
        text = files.read_text(host, path, 1 << 20)
        try:
            values = json.loads(text or "")
        except (ValueError, RecursionError):
            return None
        if not isinstance(values, dict):
            return None
        denied = sorted(k for k, v in list(values.items())[:4096] if v is False)
        if not denied:
            return None
        return self.warned(
            path, f"vLLM's P2P cache {path} says {len(denied)} GPU pair(s) cannot do P2P "
            f"({', '.join(denied[:6])}): vLLM keeps custom all-reduce and P2P off for them "
            "until the file is deleted, also after the host is fixed",
            aspect="vllm-cache", observed=f"{len(denied)} pair(s) false", expected="no stale "
            "false", fix=f"rm {path} (vLLM probes again at its next start)",
            evidence={"path": path})

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Comment out the workaround lines; name the cache files to delete."""
        from auditor.remedy import Advice, Remedy, ReplaceLine
        remedies: list[Remedy] = []
        done: set[tuple[str, str]] = set()
        for finding in findings:
            ev = dict(finding.evidence)
            path, line = ev.get("path", ""), ev.get("line", "")
            if (path, line) in done:
                continue
            done.add((path, line))
            if finding.aspect == "vllm-cache" or not line.isdigit():
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title="delete vLLM's stale P2P cache",
                                       advice=(Advice(finding.fix, ("rm", "--", path)),)))
                continue
            raw = (files.read_text(host, path, 1 << 20) or "").split("\n")
            number = int(line)
            if ev.get("alone") != "yes" or not 0 < number <= len(raw):
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title=f"remove {finding.observed}",
                                       advice=(Advice(f"remove {finding.observed} from "
                                                      f"{finding.subject}"),)))
                continue
            remedies.append(Remedy(
                check=self.id, subject=finding.subject, title=f"comment out {finding.observed}",
                persistent=(ReplaceLine(path, number, raw[number - 1],
                                        f"# {raw[number - 1]}  # host-auditor: stale workaround"),),
                notes=("servers read it when they start: restart them",)))
        return remedies
