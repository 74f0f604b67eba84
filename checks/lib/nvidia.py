"""The NVIDIA driver as files show it: the loaded module, its parameters, userspace, daemons.

Shared by ``kernel.version`` and the ``nvidia.*``, ``rdma.peermem`` and ``container.cdi``
checks. Sources:

- ``/proc/driver/nvidia/version``: ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
  580.95.05 Release Build ...`` (open) or ``NVIDIA UNIX x86_64 Kernel Module 550.54.14 ...``
  (proprietary); ``/sys/module/nvidia/version`` holds the bare version.
- ``/proc/driver/nvidia/params``: nvidia.ko declares its ``NVreg_*`` parameters with
  permission 0 (``NV_MODULE_PARAMETER`` is ``module_param(x, int, 0)``,
  kernel-open/common/inc/nv-linux.h), so they never appear in ``/sys/module/nvidia/parameters``;
  ``nv_procfs_read_params`` (kernel-open/nvidia/nv-procfs.c) prints each entry of the
  ``nv_parms`` table as ``Name: %u`` under its *registry* name, then the string keys quoted.
  The option name is ``NVreg_`` plus the variable name, which is the registry name except
  ``NVreg_RestrictProfilingToAdminUsers``, printed ``RmProfilingAdminOnly``
  (kernel-open/nvidia/nv-reg.h ``NV_DEFINE_PARAMS_TABLE_ENTRY_CUSTOM_NAME``).
- The userspace driver: ``libcuda.so.<version>`` and ``libnvidia-ml.so.<version>``, found
  through their soname links (``libcuda.so.1``: the name programs and the loader ask for;
  a version file without that link cannot be loaded) in the loader's directories, as GPUd's library
  component lists them (leptonai/gpud components/library), and under ``/run/nvidia/driver``
  where the GPU Operator's driver container keeps its own. CUDA's forward-compatibility
  libraries (``/usr/local/cuda-*/compat``) are meant to be newer and are never searched.
"""

from __future__ import annotations

import fnmatch
from typing import NamedTuple

from auditor.checks.lib import files, pci
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

PROC_VERSION = "/proc/driver/nvidia/version"
PROC_PARAMS = "/proc/driver/nvidia/params"
MODULE_VERSION = "/sys/module/nvidia/version"
MODULE_TAINT = "/sys/module/nvidia/taint"
#: What :func:`loaded_driver` reads.
DRIVER_READS: tuple[str, ...] = (PROC_VERSION, MODULE_VERSION, MODULE_TAINT)

#: Device-id ranges of NVIDIA's Blackwell GPUs, by chip, from the PCI ID database
#: (pci-ids.ucw.cz) and the supported-GPU list of NVIDIA's open kernel modules:
#:   0x2900-0x29ff  GB100 / GB102: B200 (0x2901), GB200 (0x2941), B100 (0x29bc)
#:   0x2b00-0x2bff  GB202: RTX 5090 (0x2b85), RTX PRO 6000 Blackwell (0x2bb1...);
#:                  also GB10B Jetson Thor (0x2b00)
#:   0x2c00-0x2cff  GB203: RTX 5080 (0x2c02), RTX 5070 Ti (0x2c05), laptop parts
#:   0x2d00-0x2dff  GB206 / GB207: RTX 5060 Ti (0x2d04), RTX 5060 (0x2d05), RTX 5050
#:   0x2e00-0x2eff  GB10: DGX Spark / GB10 Grace Blackwell (0x2e12)
#:   0x2f00-0x2fff  GB205: RTX 5070 (0x2f04), laptop parts
#:   0x3100-0x31ff  GB110 (Blackwell Ultra): B300 (0x3182), GB300 (0x31c2, 0x31c3)
BLACKWELL_DEVICE_RANGES = (
    (0x2900, 0x29FF),
    (0x2B00, 0x2BFF),
    (0x2C00, 0x2CFF),
    (0x2D00, 0x2DFF),
    (0x2E00, 0x2EFF),
    (0x2F00, 0x2FFF),
    (0x3100, 0x31FF),
)
#: Drivers that hold a GPU for a virtual machine: no host driver is expected then.
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})

#: A driver version: 2 or 3 dot-separated numbers (``580.95.05``, ``535.104``).
_VERSION = lazy_re(r"(?<![0-9.])([0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)(?![0-9.])")
_FULL_VERSION = lazy_re(r"[0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?")
_MAX_LINE = 512


def is_blackwell(device_id: int) -> bool:
    """Return whether an NVIDIA device id is a Blackwell GPU."""
    return any(low <= device_id <= high for low, high in BLACKWELL_DEVICE_RANGES)


def is_version(text: str) -> bool:
    """Return whether ``text`` is a driver version such as ``580.95.05``."""
    return _FULL_VERSION.fullmatch(text) is not None


def branch(version: str) -> str:
    """Return a driver version's branch (``580.95.05`` -> ``580``)."""
    return version.split(".", 1)[0]


class LoadedDriver(NamedTuple):
    """The NVIDIA kernel module that is loaded."""

    version: str
    #: ``open``, ``proprietary`` or ``unknown``.
    flavour: str
    #: The file the version came from.
    source: str


def parse_nvrm(text: str) -> tuple[str, str] | None:
    """Return (version, flavour) from /proc/driver/nvidia/version text, or None.

    Linear: the ``NVRM version:`` line is cut to 512 characters, the words after
    ``Kernel Module`` are searched for the first version.
    """
    for line in text.split("\n", 8)[:8]:
        line = line[:_MAX_LINE]
        at = line.find("Kernel Module")
        if "NVIDIA UNIX" not in line or at < 0:
            continue
        match = _VERSION.search(line, at)
        if match:
            return match.group(1), "open" if "Open Kernel Module" in line else "proprietary"
    return None


def loaded_driver(host: Host) -> LoadedDriver | None:
    """Return the loaded NVIDIA kernel module, or None if none is loaded."""
    parsed = parse_nvrm(files.read_optional(host, PROC_VERSION) or "")
    if parsed:
        return LoadedDriver(parsed[0], parsed[1], PROC_VERSION)
    module_version = (files.read_optional(host, MODULE_VERSION) or "")[:_MAX_LINE]
    match = _FULL_VERSION.match(module_version)
    if match is None:
        return None
    # The proprietary module is not GPL-compatible and taints the kernel with P; the open
    # one (Dual MIT/GPL) leaves only O and E.
    taint = files.read_optional(host, MODULE_TAINT)
    if taint is None:
        flavour = "unknown"
    else:
        flavour = "proprietary" if "P" in taint[:32] else "open"
    return LoadedDriver(match.group(0), flavour, MODULE_VERSION)


def gpus(host: Host) -> list[pci.PciDevice]:
    """Return the NVIDIA GPUs (judged by class and vendor), virtual functions too."""
    return [d for d in pci.devices(host) if d.is_nvidia_gpu]


def nvswitches(host: Host) -> list[pci.PciDevice]:
    """Return the NVIDIA NVSwitch functions (class 0x0680)."""
    return [d for d in pci.devices(host) if d.is_nvswitch]


# -- module parameters -----------------------------------------------------------------

#: Option names whose registry name differs (nv-reg.h ``NV_DEFINE_PARAMS_TABLE_ENTRY_CUSTOM_NAME``).
REGISTRY_NAMES = {"RestrictProfilingToAdminUsers": "RmProfilingAdminOnly"}
_PARAM_LINE = lazy_re(r"([A-Za-z0-9_]{1,64}): (.{0,4096})")


def parse_params(text: str) -> dict[str, str]:
    """Parse /proc/driver/nvidia/params (``Name: value``; strings quoted) into a mapping."""
    found: dict[str, str] = {}
    for line in text.split("\n")[:512]:
        match = _PARAM_LINE.fullmatch(line.rstrip()[:4200])
        if match:
            value = match.group(2)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            found[match.group(1)] = value
    return found


def live_params(host: Host) -> dict[str, str] | None:
    """Return nvidia.ko's live parameters by registry name, or None where unreadable."""
    text = files.read_optional(host, PROC_PARAMS)
    return parse_params(text) if text is not None else None


def registry_name(option: str) -> str | None:
    """Return the params-file name of an ``NVreg_*`` option, or None for another option."""
    if not option.startswith("NVreg_"):
        return None
    name = option[len("NVreg_"):]
    return REGISTRY_NAMES.get(name, name)


# -- the userspace driver --------------------------------------------------------------

#: Where distributions and NVIDIA's installers put the userspace driver (GPUd's list plus
#: the plain /usr/lib of Arch and the runfile's /usr/lib64); relative to a root.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/usr/local/lib/x86_64-linux-gnu",
    "/usr/local/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
)
#: Directories ld.so.conf may name that are searched too (a collection carries their
#: soname links): vendor trees under /usr/local and /opt. Others are listed as unsearched.
LD_SO_CONF_PATTERNS = ("/usr/local/*/lib64", "/usr/local/*/lib", "/opt/*/lib64", "/opt/*/lib")
#: The GPU Operator's driver container keeps its root here.
OPERATOR_ROOT = "/run/nvidia/driver"
LD_SO_CONF = "/etc/ld.so.conf"
LD_SO_CONF_D = "/etc/ld.so.conf.d/*.conf"
LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
#: What :func:`userspace` reads: the soname links and the files they lead to.
USERSPACE_READS: tuple[str, ...] = (
    LD_SO_CONF,
    LD_SO_CONF_D,
    *(f"{root}{d}/{lib}.1" for root in ("", OPERATOR_ROOT) for d in LIBRARY_DIRS
      for lib in LIBRARIES),
    *(f"{d}/{lib}.1" for d in LD_SO_CONF_PATTERNS for lib in LIBRARIES),
)
_LIB_VERSION = lazy_re(
    r"(libcuda\.so|libnvidia-ml\.so)\.([0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?)")


class Library(NamedTuple):
    """One userspace driver library the loader can pick, with its version."""

    name: str
    version: str
    #: The file (the soname link's target where there is a link).
    path: str
    #: ``host`` or ``gpu-operator``.
    root: str


class Userspace(NamedTuple):
    """The userspace driver libraries of one root, and directories the loader names."""

    libraries: tuple[Library, ...]
    #: Directories ld.so.conf names that are not among the ones searched.
    unsearched: tuple[str, ...] = ()

    def versions(self, root: str | None = None) -> set[str]:
        """Return the versions found (in one root)."""
        return {lib.version for lib in self.libraries if root is None or lib.root == root}

    def roots(self) -> list[str]:
        """Return the roots that hold a userspace driver."""
        return sorted({lib.root for lib in self.libraries})


def ld_so_conf_dirs(host: Host) -> list[str]:
    """Return the directories /etc/ld.so.conf and its ``include``d files name, in order."""
    found: list[str] = []
    pending = [LD_SO_CONF]
    seen: set[str] = set()
    while pending and len(seen) < 128:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        text = files.read_optional(host, path) or ""
        for line in text.split("\n")[:512]:
            line = line.split("#", 1)[0].strip()[:_MAX_LINE]
            if not line:
                continue
            if line.startswith("include"):
                pattern = line[len("include"):].strip()
                if pattern == LD_SO_CONF_D or pattern == "ld.so.conf.d/*.conf":
                    pending.extend(host.glob(LD_SO_CONF_D)[:256])
                continue
            if line.startswith("/") and " " not in line:
                found.append(line.rstrip("/") or "/")
    return list(dict.fromkeys(found))


def _in_patterns(directory: str) -> bool:
    parts = directory.strip("/").split("/")
    return any(len(parts) == len(p.strip("/").split("/")) and all(
        fnmatch.fnmatchcase(a, b) for a, b in zip(parts, p.strip("/").split("/"), strict=True))
        for p in LD_SO_CONF_PATTERNS)


def _read_userspace(host: Host) -> Userspace:
    libraries: list[Library] = []
    configured = ld_so_conf_dirs(host)
    extra = tuple(d for d in configured if _in_patterns(d) and "/compat" not in d)
    for root, label in (("", "host"), (OPERATOR_ROOT, "gpu-operator")):
        for directory in (*LIBRARY_DIRS, *(extra if not root else ())):
            for lib in LIBRARIES:
                link = f"{root}{directory}/{lib}.1"
                try:
                    resolved = host.resolve(link)
                except OSError:
                    continue
                match = _LIB_VERSION.fullmatch(resolved.rsplit("/", 1)[-1])
                if match and host.exists(link):  # the link followed: its target exists
                    libraries.append(Library(lib, match.group(2), resolved, label))
    searched = {*LIBRARY_DIRS, *extra}
    unsearched = tuple(d for d in configured if d not in searched and "/compat" not in d)
    return Userspace(tuple(dict.fromkeys(libraries)), unsearched)


def userspace(host: Host) -> Userspace:
    """Return the userspace driver libraries of the host, read once per host."""
    return host.fact("nvidia.userspace", _read_userspace)


# -- daemons ---------------------------------------------------------------------------

_PID = lazy_re(r"[1-9][0-9]{0,9}")


class Daemon(NamedTuple):
    """A daemon found through its pid file: its pid, ``comm`` and command line."""

    pid: str
    comm: str
    #: The arguments, or None where /proc/<pid>/cmdline could not be read.
    argv: tuple[str, ...] | None
    #: What shows it is the system's daemon (its unit's cgroup, or root in the host's PID
    #: namespace); "" where that cannot be told (/proc/<pid>/status was not read).
    vouched: str = ""


class Sighting(NamedTuple):
    """A process running under a daemon's name, and whether it is that daemon."""

    pid: str
    #: True: the system's daemon; False: it proves nothing; None: cannot be told.
    verdict: bool | None
    #: Why, in a few words.
    why: str


#: What tells who runs a process, beside its name: its owner (``Uid:`` of status), its
#: cgroup (a unit's own, or a container's) and its PID namespace against pid 1's.
OWNER_READS: tuple[str, ...] = ("/proc/[0-9]*/status", "/proc/[0-9]*/cgroup",
                                "/proc/[0-9]*/ns/pid")
_UID_LINE = lazy_re(r"Uid:[ \t]+([0-9]{1,10})[ \t]+([0-9]{1,10})[ \t]+([0-9]{1,10})[ \t]+"
                    r"([0-9]{1,10})")


def _cgroup_path(text: str) -> str:
    """Return a process's systemd cgroup: the v2 line's (``0::``), else v1 ``name=systemd``."""
    lines = text.splitlines()[:64]
    for line in lines:
        if line.startswith("0::"):
            return line[3:].strip()
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "name=systemd" in parts[1].split(","):
            return parts[2].strip()
    return ""


def _system_unit_cgroup(path: str, unit: str) -> bool:
    """Return whether a cgroup path is the system manager's ``unit``: ``/system.slice/UNIT``,
    or below other slices, never below a user's (``user.slice``) or a delegated unit.

    A user's own systemd (``user@UID.service``) and a unit with ``Delegate=`` may make
    cgroups of any name below themselves; only slices are the system manager's alone.
    """
    parts = path.strip("/").split("/")
    return (len(parts) >= 2 and parts[-1] == unit and parts[0] != "user.slice"
            and all(part.endswith(".slice") for part in parts[:-1]))


def vouch(host: Host, pid: str, unit: str = "") -> tuple[bool | None, str]:
    """Return whether process ``pid`` is the system's daemon, and why.

    A name proves nothing: any user, or any container, can run a process named
    ``nv-fabricmanager``. The process counts when it runs in the system ``unit``'s own
    cgroup (only root can place a process there: systemd started it from the unit; a
    user's own systemd has cgroups of its own, below ``user.slice``), or as root (every
    UID of ``status`` 0) outside any container's cgroup and in the host's own PID
    namespace. A process of another user, in a container's cgroup or another PID
    namespace does not. Where its ``status`` was not read it cannot be told (None).
    """
    from auditor.environment import cgroup_container

    status = files.read_optional(host, f"/proc/{pid}/status")
    if status is None:
        return None, f"/proc/{pid}/status was not read: who runs it cannot be told"
    uids = _UID_LINE.search(status[:8192])
    if uids is None:
        return False, f"/proc/{pid}/status names no owner"
    cgroup = (files.read_optional(host, f"/proc/{pid}/cgroup") or "")[:16384]
    manager = cgroup_container(cgroup)
    if manager:
        return False, f"runs in a {manager} container's cgroup"
    own, init = host.lstat(f"/proc/{pid}/ns/pid"), host.lstat("/proc/1/ns/pid")
    if own is not None and init is not None and own.kind == init.kind == "link" \
            and own.target != init.target:
        return False, "runs in another PID namespace than pid 1"
    if unit and _system_unit_cgroup(_cgroup_path(cgroup), unit):
        return True, f"in {unit}'s cgroup"
    if all(uid == "0" for uid in uids.groups()):
        return True, "run by root"
    return False, f"run by uid {uids.group(2)}, not root, outside {unit or 'its unit'}"


def daemon(host: Host, pidfile: str, comm: str, unit: str = "") -> Daemon | None:
    """Return the daemon a pid file names if that process is the daemon, else None.

    That process must run under the name (``comm``, cut to 15 characters by the kernel:
    ``TASK_COMM_LEN``) and be the system's (:func:`vouch`): None where it is another
    user's or a container's; ``vouched`` "" where that cannot be told. Reads only that one
    pid's files, never another process's.
    """
    text = (files.read_optional(host, pidfile) or "")[:32].strip()
    if not _PID.fullmatch(text):
        return None
    name = (files.read_optional(host, f"/proc/{text}/comm") or "")[:64]
    if name != comm[:15]:
        return None
    verdict, why = vouch(host, text, unit)
    if verdict is False:
        return None
    argv: tuple[str, ...] | None = None
    raw = files.read_bytes(host, f"/proc/{text}/cmdline", 1 << 16)
    if raw:
        argv = tuple(a.decode("utf-8", "replace")[:1024]
                     for a in raw.rstrip(b"\0").split(b"\0")[:256])
    return Daemon(text, name, argv, why if verdict else "")


def daemon_reads(pidfile: str) -> tuple[str, ...]:
    """Return the paths :func:`daemon` reads for one pid file."""
    return (pidfile, "/proc/[0-9]*/comm", "/proc/[0-9]*/cmdline", *OWNER_READS,
            "/proc/1/ns/pid")


def sightings(host: Host, comm: str, pidfiles: tuple[str, ...] = (), unit: str = ""
              ) -> list[Sighting]:
    """Return the processes running under ``comm`` (their pid files' first, then /proc), each
    with whether it is the system's daemon (:func:`vouch`).

    Only ``comm`` files are read to find them (the name, cut to 15 characters), never
    command lines; then each one's owner, cgroup and PID namespace.
    """
    cut = comm[:15]
    pids: dict[str, None] = {}
    for pidfile in pidfiles:
        text = (files.read_optional(host, pidfile) or "")[:32].strip()
        if _PID.fullmatch(text):
            pids[text] = None
    pids.update(dict.fromkeys(path.split("/")[2]
                              for path in host.glob("/proc/[0-9]*/comm")[:65536]))
    found: list[Sighting] = []
    for pid in pids:
        if (files.read_optional(host, f"/proc/{pid}/comm") or "")[:64] != cut:
            continue
        verdict, why = vouch(host, pid, unit)
        found.append(Sighting(pid, verdict, why))
        if verdict or len(found) >= 16:
            break
    return found


def find_process(host: Host, comm: str, pidfiles: tuple[str, ...] = (), unit: str = ""
                 ) -> str | None:
    """Return the pid of the system's daemon named ``comm``, or None (see :func:`sightings`)."""
    return next((s.pid for s in sightings(host, comm, pidfiles, unit) if s.verdict), None)
