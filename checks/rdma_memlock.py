"""rdma.memlock: the locked-memory limit that RDMA and GPUDirect processes get.

Registering memory with an RDMA NIC pins it (``ibv_reg_mr``), which RLIMIT_MEMLOCK bounds:
with the kernel's and systemd's 8 MiB NCCL fails with ``ibv_reg_mr_iova2 failed ... Cannot
allocate memory`` (NVIDIA/nccl-tests#206: ``ulimit -l`` was 8192, fixed by limits.conf and a
new login), UCX with 64 KiB (openucx/ucx#8229), and containers get their runtime's limit
(NVIDIA/cudf-spark PR #7632: 64 MB). Where the limit comes from depends on how the work
starts (limits.conf(5), systemd-system.conf(5), systemd.exec(5)):

- a login (ssh, a Slurm job whose limits slurmd propagates from the submitting shell):
  pam_limits reads ``/etc/security/limits.conf``, then ``limits.d/*.conf`` in order; a
  user's own line outranks a group's, which outranks ``*``; it applies at the next login
  (the Red Hat RHEL 9 InfiniBand guide, chapter 5, says the same);
- a systemd service: ``LimitMEMLOCK=`` of the unit and its drop-ins, else
  ``DefaultLimitMEMLOCK=`` of system.conf (8M since systemd 253), never limits.conf;
- a Docker container: ``default-ulimits`` of daemon.json or ``--ulimit``, else dockerd's own.

The audit's own limit is not the workload's: only running servers' ``/proc/PID/limits`` say
what a workload has (then the finding fails); configuration alone warns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, Trigger, option
from auditor.checks.lib import docker, files, pci, sdconf, serving
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

LIMITS_CONF = "/etc/security/limits.conf"
LIMITS_D = "/etc/security/limits.d/*.conf"
LIMITS_DROP_IN = "/etc/security/limits.d/90-host-auditor-rdma.conf"
UNIT_DROP_IN = "90-host-auditor-memlock.conf"
PROC_COMMS = "/proc/[0-9]*/comm"
PROC_LIMITS = "/proc/[0-9]*/limits"
#: What systemd gives services without DefaultLimitMEMLOCK= (systemd 253+; the kernel's
#: own default since 5.16 is the same 8 MiB).
SYSTEMD_DEFAULT = 8 << 20
UNLIMITED = -1
#: Process names of servers whose limit is the workload's (comm: 15 characters).
SERVERS = frozenset({"tritonserver", "slurmstepd", "vllm", "VLLM::EngineCor", "sglang",
                     "trtllm-serve", "text-generation"})
_MAX_LIMIT_LINES = 4096
_PROC_LIMIT = lazy_re(r"Max locked memory\s{1,64}(\S{1,24})\s{1,64}(\S{1,24})")
_SYSTEMD_SIZE = lazy_re(r"([0-9]{1,15})([KMGTPE]?)", 0)
_UNIT_NAME = lazy_re(r"[A-Za-z0-9][A-Za-z0-9@_.:-]{0,120}\.service")
GIB = 1 << 30


def limits_kib(text: str) -> int | None:
    """Return a limits.conf memlock value in bytes (-1: unlimited), None if unreadable."""
    word = text.strip().lower()
    if word in ("unlimited", "infinity", "-1"):
        return UNLIMITED
    return int(word) * 1024 if word.isdigit() and len(word) < 16 else None


def systemd_size(text: str) -> int | None:
    """Return a LimitMEMLOCK= value (``infinity``, ``64M``, ``soft:hard``: the soft) in bytes."""
    soft = text.strip().split(":", 1)[0].strip()
    if soft.lower() == "infinity":
        return UNLIMITED
    match = _SYSTEMD_SIZE.fullmatch(soft.upper())
    if match is None:
        return None
    return int(match.group(1)) << (10 * " KMGTPE".index(match.group(2) or " "))


def shown(size: int) -> str:
    """Return a limit in words."""
    if size == UNLIMITED:
        return "unlimited"
    if size >= GIB:
        return f"{size / GIB:g} GiB"
    if size >= 1 << 20:
        return f"{size / (1 << 20):g} MiB"
    return f"{size / 1024:g} KiB"


class LoginLimit(NamedTuple):
    """The memlock limit pam_limits gives a login of an ordinary user."""

    #: Bytes (-1 unlimited), None when no line for every user sets it.
    soft: int | None
    where: str
    #: Lines for some users or groups only (they outrank ``*`` for them).
    narrower: tuple[str, ...]


def login_limit(host: Host) -> LoginLimit:
    """Return the soft memlock limit of ``*`` lines (limits.conf, then limits.d in order)."""
    paths = [LIMITS_CONF, *sorted(host.glob(LIMITS_D)[:256])]
    soft: int | None = None
    at = ""
    narrower: list[str] = []
    for path in paths:
        for number, raw in enumerate((files.read_text(host, path) or "").split("\n")
                                     [:_MAX_LIMIT_LINES], start=1):
            fields = raw[:1024].split("#", 1)[0].split()
            if len(fields) != 4 or fields[2].lower() != "memlock":
                continue
            domain, kind, _, value = fields
            if kind not in ("soft", "-", "hard"):
                continue
            if domain != "*":
                narrower.append(f"{path}:{number} ({domain})")
                continue
            if kind == "hard" and soft is not None:
                continue
            size = limits_kib(value)
            if size is not None and kind in ("soft", "-"):
                soft, at = size, f"{path}:{number}"
            elif size is not None and soft is None:
                # A hard limit alone caps the soft one at the kernel default or below.
                at = f"{path}:{number} (hard only)"
    return LoginLimit(soft, at, tuple(narrower[:8]))


class UnitLimit(NamedTuple):
    """A serving unit's memlock limit as systemd will apply it."""

    unit: str
    path: str
    size: int
    where: str


def unit_limit(host: Host, path: str) -> UnitLimit:
    """Return a unit's LimitMEMLOCK= (its drop-ins last), else DefaultLimitMEMLOCK=."""
    name = path.rsplit("/", 1)[1]
    sources = [path]
    drop_ins: dict[str, str] = {}
    for directory in serving.UNIT_DIRS:
        for conf in host.glob(f"{directory}/{name}.d/*.conf")[:64]:
            drop_ins.setdefault(conf.rsplit("/", 1)[1], conf)
    sources += [drop_ins[n] for n in sorted(drop_ins)]
    found: tuple[int, str] | None = None
    for source in sources:
        section = ""
        for number, raw in enumerate((files.read_text(host, source) or "").split("\n")[:4096],
                                     start=1):
            line = raw[:4096].strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and line.startswith("LimitMEMLOCK="):
                size = systemd_size(line.partition("=")[2])
                if size is not None:
                    found = (size, f"{source}:{number}")
    if found is not None:
        return UnitLimit(name, path, found[0], found[1])
    default = sdconf.setting(host, "system", "Manager", "DefaultLimitMEMLOCK")
    if default.effective is not None:
        size = systemd_size(default.effective.value)
        if size is not None:
            return UnitLimit(name, path, size, f"DefaultLimitMEMLOCK at {default.effective.where}")
    return UnitLimit(name, path, SYSTEMD_DEFAULT, "systemd's default for services")


class RunningLimit(NamedTuple):
    """A running server's limit, from /proc."""

    pid: str
    comm: str
    size: int


def running_limits(host: Host) -> list[RunningLimit]:
    """Return the memlock soft limit of each running server process (bounded)."""
    found: list[RunningLimit] = []
    for path in host.glob(PROC_COMMS)[:65536]:
        comm = (files.read_optional(host, path) or "")[:64]
        if comm not in SERVERS:
            continue
        pid = path.split("/")[2]
        match = _PROC_LIMIT.search(files.read_text(host, f"/proc/{pid}/limits", 1 << 14) or "")
        if match is None:
            continue
        word = match.group(1)
        size = UNLIMITED if word == "unlimited" else int(word) if word.isdigit() else None
        if size is not None:
            found.append(RunningLimit(pid, comm, size))
        if len(found) >= 32:
            break
    return found


class RdmaMemlockOptions(CheckOptions):
    """Options of ``rdma.memlock``."""

    minimum_gib: float = option(64.0, minimum=1, maximum=1 << 20,
                                help="the smallest locked-memory limit (GiB) that passes, "
                                     "when not unlimited")


class RdmaMemlock(Check[RdmaMemlockOptions]):
    """RDMA and GPUDirect need a large locked-memory limit: 8 MiB fails ibv_reg_mr."""

    id: ClassVar[str] = "rdma.memlock"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    options_type: ClassVar[type[CheckOptions]] = RdmaMemlockOptions
    reads: ClassVar[tuple[str, ...]] = (
        LIMITS_CONF, LIMITS_D, *sdconf.reads("system"), *docker.READS,
        *serving.UNIT_READS, *(f"{d}/*.service.d/*.conf" for d in serving.UNIT_DIRS),
        PROC_COMMS, PROC_LIMITS, "/proc/1/limits", *pci.DEVICE_READS, *where.READS,
    )
    daemons: ClassVar[frozenset[str]] = SERVERS
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI})
    rationale: ClassVar[str] = (
        "NCCL, UCX and GPUDirect RDMA register (pin) buffers with the NIC; the locked-memory "
        "limit bounds that. With the kernel's and systemd's 8 MiB, ibv_reg_mr fails with "
        "'Cannot allocate memory' and multi-node inference falls back or stops."
    )
    remedy: ClassVar[str] = (
        "'* - memlock unlimited' in /etc/security/limits.d (for logins and Slurm jobs, from "
        "the next login), LimitMEMLOCK=infinity for the serving units, Docker's "
        "default-ulimits memlock -1 (or --ulimit memlock=-1)."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        nics = [d for d in pci.devices(host) if d.is_rdma_nic and not d.virtual_function] or \
            [d for d in pci.devices(host) if d.is_rdma_nic]
        if not nics:
            yield self.skipped("memlock", "no RDMA NIC: the locked-memory limit does not bound "
                               "GPUDirect or NCCL's network transport here")
            return
        wanted = int(self.options.minimum_gib * GIB)
        expected = f"unlimited or >= {shown(wanted)}"
        env = where.environment(host)
        running = running_limits(host)
        low_running = [r for r in running if self._low(r.size, wanted)]
        for server in low_running:
            yield self.failed(
                f"pid {server.pid}", f"{server.comm} (pid {server.pid}) runs with a "
                f"locked-memory limit of {shown(server.size)} on a host with {len(nics)} RDMA "
                "NIC(s): its memory registrations fail",
                observed=shown(server.size), expected=expected,
                fix="raise the limit where it starts (its unit's LimitMEMLOCK=, limits.d for "
                    "logins, --ulimit memlock=-1 for a container) and restart it",
                evidence={"pid": server.pid, "comm": server.comm})
        if env.in_container:
            yield self._container(host, wanted, expected)
            return
        yield self._login(host, wanted, expected, len(nics))
        for path in serving.serving_units(host)[:32]:
            yield self._unit(unit_limit(host, path), wanted, expected)
        finding = self._docker(host, wanted, expected)
        if finding is not None:
            yield finding
        if running and not low_running:
            yield self.passed("running", "running servers have their limit: " + ", ".join(
                f"{r.comm} {shown(r.size)}" for r in running[:8]), expected=expected)

    @staticmethod
    def _low(size: int, wanted: int) -> bool:
        return size != UNLIMITED and size < wanted

    def _container(self, host: Host, wanted: int, expected: str) -> Finding:
        env = where.environment(host)
        match = _PROC_LIMIT.search(files.read_text(host, "/proc/1/limits", 1 << 14) or "")
        if match is None:
            return self.skipped("memlock", f"{env.inside()}: the runtime sets the limit, and "
                                "/proc/1/limits was not collected or is unreadable")
        word = match.group(1)
        size = UNLIMITED if word == "unlimited" else int(word) if word.isdigit() else None
        if size is None:
            return self.skipped("memlock", f"/proc/1/limits reads {word!r}")
        if self._low(size, wanted):
            return self.failed(
                "memlock", f"the container's first process has a locked-memory limit of "
                f"{shown(size)} ({env.inside()}; its limits.conf does not apply): RDMA "
                "registrations of work started in it fail",
                observed=shown(size), expected=expected,
                fix="start the container with --ulimit memlock=-1 (Docker), or set "
                    "default-ulimits in the host's /etc/docker/daemon.json",
                evidence={"environment": env.describe()})
        return self.passed("memlock", f"the container's first process has a locked-memory "
                           f"limit of {shown(size)} ({env.inside()})", observed=shown(size),
                           expected=expected)

    def _login(self, host: Host, wanted: int, expected: str, nics: int) -> Finding:
        login = login_limit(host)
        ev = {"source": login.where, "narrower": " ".join(login.narrower)[:512]}
        fix = (f"'* soft memlock unlimited' and '* hard memlock unlimited' in {LIMITS_DROP_IN}; "
               "users log in again")
        if login.soft is None:
            return self.warned(
                "login", f"no limits.conf line sets memlock for every user on a host with "
                f"{nics} RDMA NIC(s): logins and the Slurm jobs they submit keep the kernel's "
                "8 MiB, and ibv_reg_mr fails", observed="8 MiB (kernel default)",
                expected=expected, fix=fix, evidence=ev)
        if self._low(login.soft, wanted):
            return self.warned(
                "login", f"{login.where} limits logins to {shown(login.soft)} of locked "
                "memory: RDMA registrations of work started from a login fail",
                observed=shown(login.soft), expected=expected, fix=fix, evidence=ev)
        return self.passed("login", f"logins get a locked-memory limit of {shown(login.soft)} "
                           f"({login.where}; from the next login)", observed=shown(login.soft),
                           expected=expected, evidence=ev)

    def _unit(self, limit: UnitLimit, wanted: int, expected: str) -> Finding:
        ev = {"unit": limit.unit, "unit_file": limit.path, "source": limit.where}
        if self._low(limit.size, wanted):
            return self.warned(
                limit.unit, f"{limit.unit} starts with a locked-memory limit of "
                f"{shown(limit.size)} ({limit.where}): limits.conf does not apply to services",
                observed=shown(limit.size), expected=expected, evidence=ev,
                fix=f"LimitMEMLOCK=infinity in /etc/systemd/system/{limit.unit}.d/"
                    f"{UNIT_DROP_IN}, then systemctl daemon-reload and restart it")
        return self.passed(limit.unit, f"{limit.unit} starts with a locked-memory limit of "
                           f"{shown(limit.size)} ({limit.where})", observed=shown(limit.size),
                           expected=expected, evidence=ev)

    def _docker(self, host: Host, wanted: int, expected: str) -> Finding | None:
        config = docker.daemon_config(host)
        if not config.installed:
            return None
        if config.values is None:
            return self.warned("docker", f"{docker.DAEMON_JSON} is {config.error}",
                               observed="unparsable", expected="a JSON object",
                               fix=f"repair {docker.DAEMON_JSON}")
        ulimits = config.values.get("default-ulimits")
        entry = ulimits.get("memlock") if isinstance(ulimits, dict) else None
        soft = entry.get("Soft") if isinstance(entry, dict) else None
        fix = ("\"default-ulimits\": {\"memlock\": {\"Name\": \"memlock\", \"Soft\": -1, "
               f"\"Hard\": -1}}}} in {docker.DAEMON_JSON}, then systemctl restart docker "
               "(or --ulimit memlock=-1 per container)")
        if not isinstance(soft, int) or isinstance(soft, bool):
            return self.warned(
                "docker", "Docker is installed and sets no memlock in default-ulimits: a "
                "container started without --ulimit memlock=-1 gets dockerd's own limit (8 MiB "
                "from systemd), too little for RDMA", observed="not set", expected=expected,
                fix=fix)
        size = UNLIMITED if soft < 0 else soft
        if self._low(size, wanted):
            return self.warned("docker", f"Docker's default-ulimits memlock is {shown(size)}",
                               observed=shown(size), expected=expected, fix=fix)
        return self.passed("docker", f"Docker gives containers {shown(size)} of locked memory "
                           "(default-ulimits)", observed=shown(size), expected=expected)

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Raise the limit for logins, serving units and Docker; advise the restarts."""
        from auditor.remedy import Advice, Remedy, RunCommand, WriteFile
        remedies: list[Remedy] = []
        units: list[Step] = []
        names: list[str] = []
        for finding in findings:
            ev = dict(finding.evidence)
            if finding.subject == "login":
                remedies.append(Remedy(
                    check=self.id, subject="login", title="unlimited locked memory for logins",
                    persistent=(WriteFile(LIMITS_DROP_IN, "# RDMA and GPUDirect register "
                                          "(pin) memory: NCCL, UCX\n* soft memlock unlimited\n"
                                          "* hard memlock unlimited\n"),),
                    notes=("pam_limits applies it at the next login: log in again, and "
                           "restart slurmd's jobs' sessions",) + (
                        (f"user or group lines outrank '*': {ev['narrower']}",)
                        if ev.get("narrower") else ())))
            elif "unit" in ev and _UNIT_NAME.fullmatch(ev["unit"]):
                units.append(WriteFile(f"/etc/systemd/system/{ev['unit']}.d/{UNIT_DROP_IN}",
                                       "[Service]\nLimitMEMLOCK=infinity\n"))
                names.append(ev["unit"])
            elif finding.subject == "docker":
                config = docker.daemon_config(host)
                if config.values is None:
                    remedies.append(Remedy(check=self.id, subject="docker",
                                           title=f"repair {docker.DAEMON_JSON}",
                                           advice=(Advice(finding.fix),)))
                    continue
                ulimits = config.values.get("default-ulimits")
                merged = dict(ulimits) if isinstance(ulimits, dict) else {}
                merged["memlock"] = {"Name": "memlock", "Hard": -1, "Soft": -1}
                remedies.append(Remedy(
                    check=self.id, subject="docker",
                    title="unlimited locked memory for Docker containers",
                    persistent=(WriteFile(docker.DAEMON_JSON, docker.with_values(
                        config, **{"default-ulimits": merged})),),
                    advice=(Advice("systemctl restart docker (running containers stop unless "
                                   "live-restore is on)", ("systemctl", "restart", "docker")),)))
            elif finding.subject.startswith("pid ") or finding.subject == "memlock":
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title="restart with a higher locked-memory limit",
                                       advice=(Advice(finding.fix),)))
        if units:
            remedies.append(Remedy(
                check=self.id, subject="units",
                title="LimitMEMLOCK=infinity for " + ", ".join(names),
                persistent=(*units, RunCommand(("systemctl", "daemon-reload"),
                                               after=tuple(range(len(units))),
                                               undo=("systemctl", "daemon-reload"),
                                               optional=True)),
                advice=tuple(Advice(f"systemctl restart {n}: the limit applies when it starts",
                                    ("systemctl", "restart", n)) for n in names)))
        return remedies
