"""ipc.shm: the /dev/shm that GPU work started here gets, and logind removing it at logout.

NCCL's shared-memory transport and vLLM's tensor-parallel workers put their buffers in
files under ``/dev/shm``. Docker gives a container a 64 MiB ``/dev/shm`` unless it runs
with ``--shm-size`` or ``--ipc=host`` (moby/moby PR #16168); with more than one GPU, NCCL
then fails with ``posix_fallocate ... No space left on device`` (NVIDIA/nccl#342) or
``Error while creating shared memory segment`` (NVIDIA/nccl-tests#166), or hangs
(NVIDIA/nccl#606, fixed by a 1 GB /dev/shm). The NCCL user guide ("Docker") asks for
``--shm-size=1g`` at least. A tmpfs without ``size=`` holds up to half of RAM (tmpfs(5)).

On a host that runs Docker, ``default-shm-size`` in ``/etc/docker/daemon.json`` sets what a
container gets when it names none. systemd-logind's ``RemoveIPC=yes`` (logind.conf(5);
upstream's default) removes a user's System V and POSIX IPC objects, /dev/shm files among
them, when that user's last session ends: a batch job's segments vanish when its owner logs
out of another session. ``shmmax`` is another limit (System V only; moby/moby#10176).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import docker, files, sdconf, serving
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy

MOUNTS = "/proc/mounts"
MEMINFO = "/proc/meminfo"
SHM = "/dev/shm"
SLURM_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")
LOGIND_DROP_IN = "/etc/systemd/logind.conf.d/90-host-auditor-removeipc.conf"
#: What the fix writes as Docker's default: the NCCL guide's 1g is the floor, and a tmpfs
#: size is a ceiling, not memory taken.
DOCKER_DEFAULT = "16g"
GIB = 1 << 30
_MAX_MOUNTS = 8192
_MEMTOTAL = lazy_re(r"MemTotal:\s{0,32}([0-9]{1,15}) kB")
_OCTAL = lazy_re(r"\\([0-7]{3})")
_TMPFS_SIZE = lazy_re(r"([0-9]{1,15})([kmgtpe%]?)", 0)
_TMPFS_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
                "e": 1 << 60}


class Mount(NamedTuple):
    """One line of the mount table."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]


def parse_mounts(text: str) -> list[Mount]:
    """Parse /proc/mounts (octal escapes in the fields undone; at most 8192 lines)."""
    found = []
    for line in text.split("\n")[:_MAX_MOUNTS]:
        fields = line[:8192].split()
        if len(fields) < 4:
            continue
        source, target, fstype, options = (
            _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[:4])
        found.append(Mount(source, target, fstype, tuple(options.split(",")[:256])))
    return found


def tmpfs_size(options: Sequence[str], memtotal: int | None) -> int | None:
    """Return a tmpfs mount's size in bytes (``size=``, ``nr_blocks=`` or half of RAM)."""
    for item in reversed(options):
        key, _, value = item.partition("=")
        if key == "size":
            match = _TMPFS_SIZE.fullmatch(value.lower())
            if match is None:
                return None
            number, unit = int(match.group(1)), match.group(2)
            if unit == "%":
                return memtotal * number // 100 if memtotal else None
            return number * _TMPFS_UNITS[unit]
        if key == "nr_blocks" and value.isdigit() and len(value) < 16:
            return int(value) * 4096
    return memtotal // 2 if memtotal else None


def _bytes(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:.1f} GiB"
    return f"{size / (1 << 20):.0f} MiB"


class IpcShmOptions(CheckOptions):
    """Options of ``ipc.shm``."""

    minimum_gib: float = option(1.0, minimum=0.0625, maximum=4096,
                                help="the smallest /dev/shm (GiB) that passes with two or more "
                                     "GPUs (NCCL's guide: 1)")


class IpcShm(Check[IpcShmOptions]):
    """A small /dev/shm breaks NCCL's shared-memory transport and vLLM tensor parallelism."""

    id: ClassVar[str] = "ipc.shm"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    options_type: ClassVar[type[CheckOptions]] = IpcShmOptions
    reads: ClassVar[tuple[str, ...]] = (
        MOUNTS, MEMINFO, *docker.READS, *sdconf.reads("logind"), *SLURM_CONFS,
        *serving.READS,
    )
    rationale: ClassVar[str] = (
        "NCCL (between GPUs of one host) and vLLM's tensor-parallel workers exchange data "
        "through files in /dev/shm. Docker's default of 64 MiB makes NCCL fail with 'No space "
        "left on device' or hang; the NCCL guide asks for --shm-size=1g at least. logind's "
        "RemoveIPC=yes deletes a user's /dev/shm files when their last session ends."
    )
    remedy: ClassVar[str] = (
        "Run GPU containers with --ipc=host or --shm-size=16g (Kubernetes: an emptyDir with "
        "medium: Memory on /dev/shm); set default-shm-size in /etc/docker/daemon.json and "
        "restart Docker; RemoveIPC=no in a logind.conf.d drop-in on batch nodes."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = where.environment(host)
        gpus = serving.gpus_here(host)
        yield self._shm(host, env, gpus)
        if not env.in_container:
            finding = self._docker(host, gpus)
            if finding is not None:
                yield finding
            finding = self._logind(host)
            if finding is not None:
                yield finding

    # -- /dev/shm where the audit runs -----------------------------------------------------

    def _shm(self, host: Host, env: where.Environment, gpus: serving.GpusHere) -> Finding:
        text = files.read_text(host, MOUNTS, 4 << 20)
        ev = {"gpus": str(gpus.number), "gpus_counted": gpus.how, "environment": env.describe()}
        if text is None:
            return self.skipped(SHM, f"{MOUNTS} was not collected or is unreadable: the size "
                                "of /dev/shm is unknown", evidence=ev)
        mounts = [m for m in parse_mounts(text) if m.target == SHM]
        memtotal_match = _MEMTOTAL.search(files.read_text(host, MEMINFO, 1 << 16) or "")
        memtotal = int(memtotal_match.group(1)) * 1024 if memtotal_match else None
        wanted = int(self.options.minimum_gib * GIB)
        expected = f">= {_bytes(wanted)} with 2 or more GPUs"
        inside = f" ({env.inside()})" if env.in_container else ""
        if not mounts:
            if gpus.number < 2:
                return self.passed(SHM, f"no /dev/shm mount{inside}, and {gpus.how}: NCCL's "
                                   "shared memory between GPUs is not used", evidence=ev)
            return self.warned(
                SHM, f"no tmpfs is mounted on /dev/shm{inside}, with {gpus.how}: NCCL's "
                "shared-memory segments go to the root filesystem, or fail where it is "
                "missing (docker --ipc=none)",
                observed="not mounted", expected=expected,
                fix=self._runtime_fix(env), evidence=ev)
        mount = mounts[-1]
        ev.update(fstype=mount.fstype, options=",".join(mount.options)[:256])
        size = tmpfs_size(mount.options, memtotal) if mount.fstype == "tmpfs" else None
        if size is None:
            return self.skipped(SHM, f"/dev/shm is a {mount.fstype} mount whose size cannot be "
                                "read from its options", evidence=ev)
        ev["size_bytes"] = str(size)
        explicit = any(o.startswith(("size=", "nr_blocks=")) for o in mount.options)
        how = "" if explicit else " (tmpfs without size=: half of RAM)"
        if gpus.number < 2:
            return self.passed(SHM, f"/dev/shm holds {_bytes(size)}{how}{inside}; {gpus.how}: "
                               "one GPU needs no shared memory between GPU processes",
                               observed=_bytes(size), expected=expected, evidence=ev)
        if size < wanted:
            docker_note = (" (Docker's 64 MiB default: the container was started without "
                           "--shm-size or --ipc=host)"
                           if env.in_container and size == docker.DEFAULT_SHM_BYTES else "")
            return self.failed(
                SHM, f"/dev/shm holds {_bytes(size)}{inside}{docker_note} with {gpus.how}: "
                "NCCL's shared-memory transport and vLLM tensor parallelism run out of space "
                "('No space left on device') or hang",
                observed=_bytes(size), expected=expected, fix=self._runtime_fix(env),
                evidence=ev)
        return self.passed(SHM, f"/dev/shm holds {_bytes(size)}{how}{inside} for {gpus.how}",
                           observed=_bytes(size), expected=expected, evidence=ev)

    @staticmethod
    def _runtime_fix(env: where.Environment) -> str:
        if env.in_container:
            return ("start the container with --ipc=host or --shm-size=16g (docker run, "
                    "compose 'shm_size'); Kubernetes: an emptyDir with medium: Memory mounted "
                    "on /dev/shm")
        return "mount -o remount,size=16G /dev/shm, and set size= in its /etc/fstab line"

    # -- what Docker gives the containers it starts ------------------------------------------

    def _docker(self, host: Host, gpus: serving.GpusHere) -> Finding | None:
        config = docker.daemon_config(host)
        if not config.installed or gpus.number < 2:
            return None
        ev = {"gpus": str(gpus.number), "daemon_json": docker.DAEMON_JSON if config.present
              else "absent"}
        if config.values is None:
            return self.warned(
                "docker", f"{docker.DAEMON_JSON} is {config.error}: dockerd refuses to start "
                "with it, and what containers get for /dev/shm cannot be read",
                observed="unparsable", expected="a JSON object", evidence=ev,
                fix=f"repair {docker.DAEMON_JSON}")
        raw = config.values.get("default-shm-size")
        wanted = int(self.options.minimum_gib * GIB)
        size = docker.parse_size(raw) if raw is not None else docker.DEFAULT_SHM_BYTES
        shown = f"default-shm-size {raw}" if raw is not None else "no default-shm-size (64 MiB)"
        ev["default_shm_size"] = str(raw) if raw is not None else ""
        if size is None:
            return self.warned("docker", f"{docker.DAEMON_JSON}: default-shm-size {raw!r} is "
                               "not a size Docker reads", observed=str(raw)[:64],
                               expected=f">= {_bytes(wanted)}", evidence=ev,
                               fix=f"default-shm-size \"{DOCKER_DEFAULT}\" in "
                                   f"{docker.DAEMON_JSON}")
        if size < wanted:
            return self.warned(
                "docker", f"Docker is installed with {gpus.number} GPUs and {shown}: a GPU "
                "container started without --shm-size or --ipc=host gets "
                f"{_bytes(size)} of /dev/shm, too little for NCCL",
                observed=_bytes(size), expected=f">= {_bytes(wanted)}", evidence=ev,
                fix=f"\"default-shm-size\": \"{DOCKER_DEFAULT}\" in {docker.DAEMON_JSON}, then "
                    "systemctl restart docker")
        return self.passed("docker", f"Docker gives containers {_bytes(size)} of /dev/shm by "
                           f"default ({shown})", observed=_bytes(size),
                           expected=f">= {_bytes(wanted)}", evidence=ev)

    # -- logind removing IPC of users whose last session ended -------------------------------

    def _logind(self, host: Host) -> Finding | None:
        slurm = next((p for p in SLURM_CONFS if files.regular(host, p)), "")
        if not slurm:
            # Without a batch scheduler, jobs do not run as users who log in and out.
            return None
        state = sdconf.setting(host, "logind", "Login", "RemoveIPC")
        value = state.effective.value if state.effective else (state.documented_default or
                                                               "yes")
        source = (state.effective.where if state.effective else
                  f"the default documented in {state.sources[0]}" if state.documented_default
                  and state.sources else "systemd's default")
        ev = {"slurm": slurm, "remove_ipc": value, "source": source}
        if value.lower() in ("yes", "true", "on", "1"):
            return self.warned(
                "logind", f"RemoveIPC={value} ({source}) on a Slurm node ({slurm}): when a "
                "user's last session ends, logind deletes their /dev/shm files and IPC "
                "segments, under jobs of theirs that are still running",
                observed=f"RemoveIPC={value}", expected="RemoveIPC=no", evidence=ev,
                fix=f"RemoveIPC=no in {LOGIND_DROP_IN}, then systemctl restart systemd-logind")
        return self.passed("logind", f"RemoveIPC={value} ({source}): logind keeps users' IPC "
                           "objects when they log out", observed=f"RemoveIPC={value}",
                           expected="RemoveIPC=no", evidence=ev)

    # -- the fix -------------------------------------------------------------------------------

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Raise Docker's default /dev/shm, keep logind from removing IPC; advise the rest."""
        from auditor.remedy import Advice, Remedy, WriteFile
        remedies: list[Remedy] = []
        for finding in findings:
            if finding.subject == SHM:
                remedies.append(Remedy(
                    check=self.id, subject=SHM, title="give GPU work a larger /dev/shm",
                    advice=(Advice(finding.fix),),
                    notes=("a running container's /dev/shm cannot be resized from inside; "
                           "start it again with the options named",)))
            elif finding.subject == "docker":
                config = docker.daemon_config(host)
                if config.values is None:
                    remedies.append(Remedy(check=self.id, subject="docker",
                                           title=f"repair {docker.DAEMON_JSON}",
                                           advice=(Advice(finding.fix),)))
                    continue
                remedies.append(Remedy(
                    check=self.id, subject="docker",
                    title=f"Docker's default /dev/shm of {DOCKER_DEFAULT} for new containers",
                    persistent=(WriteFile(docker.DAEMON_JSON, docker.with_values(
                        config, **{"default-shm-size": DOCKER_DEFAULT})),),
                    advice=(Advice("systemctl restart docker (running containers stop unless "
                                   "live-restore is on; they keep their /dev/shm until "
                                   "started again)", ("systemctl", "restart", "docker")),)))
            elif finding.subject == "logind":
                remedies.append(Remedy(
                    check=self.id, subject="logind",
                    title="keep users' IPC objects when they log out (RemoveIPC=no)",
                    persistent=(WriteFile(LOGIND_DROP_IN, "[Login]\nRemoveIPC=no\n"),),
                    advice=(Advice("systemctl restart systemd-logind (sessions stay; it "
                                   "reads the drop-in then)",
                                   ("systemctl", "restart", "systemd-logind")),)))
        return remedies
