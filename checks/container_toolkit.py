"""container.toolkit: the NVIDIA container toolkit's configuration against the host it runs on.

- ``/dev/char`` links (NVIDIA/nvidia-container-toolkit#48, its NOTICE; #251, #1227, #1397;
  NVIDIA/gpu-operator#485): with the systemd cgroup driver, ``systemctl daemon-reload`` makes
  systemd re-apply every container scope's device allow list, which it writes by the
  ``/dev/char/MAJOR:MINOR`` names of the nodes. The legacy hook adds the GPU nodes behind
  runc's back, and the NVIDIA nodes have no ``/dev/char`` links of their own (the driver
  creates them, not udev), so systemd drops them: running containers lose their GPUs
  ("Failed to initialize NVML: Unknown Error"). The fix is the toolkit's
  ``nvidia-ctk system create-dev-char-symlinks --create-all``, kept by its udev rule
  (``71-nvidia-dev-char.rules``), or CDI mode. Docker uses the systemd driver where it says
  ``native.cgroupdriver=systemd``, and by default on cgroup v2 (Docker 20.10+);
  containerd where ``SystemdCgroup = true``.
- ``ldconfig`` in ``[nvidia-container-cli]`` must name the host's ldconfig (``@`` means the
  host's): Ubuntu's is ``/sbin/ldconfig.real``, Debian's and RHEL's ``/sbin/ldconfig``
  (NVIDIA/nvidia-container-toolkit#59, #147: "ldcache error").
- Rootless Docker or Podman cannot write device cgroups: ``no-cgroups = true`` is needed
  (NVIDIA/nvidia-docker#1155: ``devices.allow: permission denied``).
- Docker's ``default-runtime: nvidia`` without a registered ``nvidia`` runtime, or one whose
  binary is gone, stops dockerd from starting containers.

Under cgroup v2 the device controller is BPF with no interface files (kernel
``Documentation/admin-guide/cgroup-v2.rst``): a file audit cannot read an allow list, so
nothing here claims one; inside a container the check skips, as the toolkit is the host's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import docker, files
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

CONFIG = "/etc/nvidia-container-runtime/config.toml"
BINARIES = tuple(f"{d}/{b}" for d in ("/usr/bin", "/usr/local/bin", "/usr/sbin")
                 for b in ("nvidia-container-runtime", "nvidia-ctk", "nvidia-container-cli"))
CONTAINERD = "/etc/containerd/config.toml"
CGROUP2 = "/sys/fs/cgroup/cgroup.controllers"
PROC_DEVICES = "/proc/devices"
NODES = ("/dev/nvidia*", "/dev/nvidia-caps/*")
DEV_CHAR = "/dev/char/*"
UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UDEV_RULES = ("/etc/udev/rules.d/*.rules", "/run/udev/rules.d/*.rules",
              "/usr/lib/udev/rules.d/*.rules", "/lib/udev/rules.d/*.rules")
ROOTLESS_SOCKETS = ("/run/user/*/docker.sock", "/run/user/*/podman/podman.sock")
#: The rule the toolkit documents (its "Troubleshooting" page and packaged udev rule).
RULE_TEXT = ('# /dev/char links for the NVIDIA device nodes: systemd re-applies device '
             'allow lists by these names\nACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
             'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n')
_NODE_NAME = lazy_re(r"nvidia(?:[0-9]{1,4}|ctl|-uvm|-uvm-tools|-modeset|-nvswitch[0-9]{1,3}|"
                     r"-nvswitchctl|-cap[0-9]{1,6})")
_DEVICES_LINE = lazy_re(r"\s{0,4}([0-9]{1,4}) (\S{1,64})")
_LDCONFIG_LINE = lazy_re(r"\s{0,16}ldconfig\s{0,16}=\s{0,16}\"([^\"]{0,256})\"\s{0,64}"
                         r"(?:#.{0,512})?")
_MAX_NODES = 1024
_SYSTEMD_CGROUP = lazy_re(r"\s{0,32}SystemdCgroup\s{0,8}=\s{0,8}true\s{0,64}(?:#.{0,256})?")


def load_toml(text: str) -> dict[str, Any] | None:
    """Parse TOML (None when it does not parse)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None


class Node(NamedTuple):
    """An NVIDIA device node and the /dev/char link systemd names it by."""

    path: str
    major: int
    minor: int

    @property
    def link(self) -> str:
        """Return ``/dev/char/MAJOR:MINOR``."""
        return f"/dev/char/{self.major}:{self.minor}"


def _majors(host: Host) -> dict[str, int]:
    found: dict[str, int] = {}
    section = ""
    for line in (files.read_text(host, PROC_DEVICES, 1 << 16) or "").split("\n")[:1024]:
        if line.endswith("devices:"):
            section = line
            continue
        match = _DEVICES_LINE.fullmatch(line)
        if match and section.startswith("Character"):
            found.setdefault(match.group(2), int(match.group(1)))
    return found


def _numbers_from_name(name: str, majors: dict[str, int]) -> tuple[int, int] | None:
    """Return a node's numbers from its name and /proc/devices (nodes seen as files)."""
    frontend = majors.get("nvidia-frontend") or majors.get("nvidia")
    if name.startswith("nvidia-uvm"):
        major = majors.get("nvidia-uvm")
        return (major, 1 if name.endswith("tools") else 0) if major is not None else None
    if frontend is None:
        return None
    if name == "nvidiactl":
        return frontend, 255
    if name == "nvidia-modeset":
        return frontend, 254
    if name[6:].isdigit():
        return frontend, int(name[6:])
    return None


def nvidia_nodes(host: Host) -> list[Node]:
    """Return the NVIDIA character nodes under /dev with their numbers."""
    majors: dict[str, int] | None = None
    found: list[Node] = []
    for pattern in NODES:
        for path in host.glob(pattern)[:_MAX_NODES]:
            name = path.rsplit("/", 1)[1]
            if not _NODE_NAME.fullmatch(name):
                continue
            numbers = host.device_numbers(path)
            if numbers is None and host.lstat(path) is not None:
                if majors is None:
                    majors = _majors(host)
                numbers = _numbers_from_name(name, majors)
            if numbers is not None:
                found.append(Node(path, *numbers))
    return found


class Driver(NamedTuple):
    """Which cgroup driver runs the containers, and why it is believed."""

    systemd: bool
    why: str


def cgroup_driver(host: Host, config: docker.DaemonConfig) -> Driver | None:
    """Return whether a runtime here uses the systemd cgroup driver (None: no runtime seen)."""
    containerd = files.read_text(host, CONTAINERD, 1 << 20)
    if containerd is not None:
        parsed = load_toml(containerd)
        if parsed is not None and any(_SYSTEMD_CGROUP.fullmatch(line) for line in
                                      containerd.split("\n")[:8192]):
            return Driver(True, f"containerd: SystemdCgroup = true in {CONTAINERD}")
    if config.installed and config.values is not None:
        opts = config.values.get("exec-opts")
        words = [o for o in opts if isinstance(o, str)] if isinstance(opts, list) else []
        for word in words:
            if word.replace(" ", "") == "native.cgroupdriver=systemd":
                return Driver(True, f"Docker: {word} in {docker.DAEMON_JSON}")
            if word.replace(" ", "") == "native.cgroupdriver=cgroupfs":
                return Driver(False, f"Docker: {word} in {docker.DAEMON_JSON}")
        if host.exists(CGROUP2):
            return Driver(True, "Docker on cgroup v2 (its default driver there is systemd)")
        return Driver(False, "Docker on cgroup v1 (its default driver there is cgroupfs)")
    if containerd is not None:
        return Driver(False, f"containerd without SystemdCgroup = true in {CONTAINERD}")
    return None


def udev_rule(host: Host) -> str:
    """Return a udev rules file that creates the /dev/char links, "" when none does."""
    for pattern in UDEV_RULES:
        for path in host.glob(pattern)[:256]:
            if "create-dev-char-symlinks" in (files.read_text(host, path, 1 << 16) or ""):
                return path
    return ""


class ContainerToolkit(Check[CheckOptions]):
    """The NVIDIA container toolkit must match the host, or containers lose or never get GPUs."""

    id: ClassVar[str] = "container.toolkit"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        CONFIG, *BINARIES, CONTAINERD, CGROUP2, PROC_DEVICES, *NODES, DEV_CHAR, *UDEV_RULES,
        *ROOTLESS_SOCKETS, "/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/sbin/ldconfig",
        "/usr/sbin/ldconfig.real", "/usr/bin/ldconfig", *docker.READS, *where.READS,
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.GPU_MODULE, Trigger.GPU_NODE})
    rationale: ClassVar[str] = (
        "Containers get GPUs through the NVIDIA container toolkit. Under the systemd cgroup "
        "driver, missing /dev/char links make every running container lose its GPUs at the "
        "next 'systemctl daemon-reload'; a wrong ldconfig path fails every GPU container "
        "start; rootless runtimes need no-cgroups."
    )
    remedy: ClassVar[str] = (
        "nvidia-ctk system create-dev-char-symlinks --create-all, kept by the toolkit's udev "
        "rule (or CDI mode); the ldconfig path that exists on the host; no-cgroups = true for "
        "rootless runtimes; the nvidia runtime registered (nvidia-ctk runtime configure)."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        present = files.regular(host, CONFIG)
        binaries = [p for p in BINARIES if host.exists(p)]
        if not present and not binaries:
            yield self.skipped("toolkit", "the NVIDIA container toolkit is not installed")
            return
        env = where.environment(host)
        if env.in_container:
            yield self.skipped("toolkit", f"{env.inside()}: the container toolkit and the "
                               "runtime are the host's; audit the host")
            return
        text = files.read_text(host, CONFIG, 1 << 20) if present else ""
        config = load_toml(text or "") if text is not None else None
        if config is None:
            yield self.failed("config", f"{CONFIG} does not parse as TOML: the runtime hook "
                              "fails on it", observed="unparsable", expected="valid TOML",
                              fix=f"repair {CONFIG} (nvidia-ctk config default > it)")
            return
        yield self._dev_char(host, config)
        yield self._ldconfig(host, config, text or "")
        rootless = [p for pattern in ROOTLESS_SOCKETS for p in host.glob(pattern)[:16]]
        if rootless:
            yield self._rootless(config, rootless)
        runtime = self._docker_runtime(host)
        if runtime is not None:
            yield runtime

    # -- /dev/char links under the systemd cgroup driver -----------------------------------

    def _dev_char(self, host: Host, config: dict[str, Any]) -> Finding:
        runtime = config.get("nvidia-container-runtime")
        mode = runtime.get("mode", "auto") if isinstance(runtime, dict) else "auto"
        driver = cgroup_driver(host, docker.daemon_config(host))
        nodes = nvidia_nodes(host)
        missing = [n for n in nodes if not host.lstat(n.link)]
        rule = udev_rule(host)
        ev = {"mode": str(mode)[:32], "cgroup_driver": driver.why if driver else "no runtime",
              "nodes": str(len(nodes)), "missing": " ".join(n.link for n in missing)[:512],
              "udev_rule": rule}
        if mode == "cdi":
            return self.passed("dev-char", "the toolkit runs in CDI mode: the runtime itself "
                               "adds the GPU nodes to the container's allow list", evidence=ev)
        if driver is None or not driver.systemd:
            return self.passed("dev-char", "no runtime here uses the systemd cgroup driver "
                               f"({driver.why if driver else 'neither Docker nor containerd'}):"
                               " a daemon-reload does not rewrite device access", evidence=ev)
        if not nodes:
            return self.skipped("dev-char", "no NVIDIA device node under /dev (the driver is "
                                "not loaded, or /dev was not collected)", evidence=ev)
        if not missing:
            return self.passed("dev-char", f"every NVIDIA node has its /dev/char link "
                               f"({len(nodes)}; {driver.why})", evidence=ev)
        later = f"; {rule} creates them only when the driver binds again" if rule else ""
        return self.failed(
            "dev-char", f"{len(missing)} of {len(nodes)} NVIDIA device nodes have no /dev/char "
            f"link ({', '.join(n.path for n in missing[:4])}{'...' if len(missing) > 4 else ''})"
            f" and {driver.why}: at the next 'systemctl daemon-reload' running containers "
            f"lose their GPUs (NVML 'Unknown Error'){later}",
            observed=f"{len(missing)} link(s) missing", expected="a /dev/char link per node",
            fix="nvidia-ctk system create-dev-char-symlinks --create-all, and its udev rule "
                f"{UDEV_RULE}; or CDI mode", evidence=ev)

    # -- ldconfig --------------------------------------------------------------------------

    def _ldconfig(self, host: Host, config: dict[str, Any], text: str) -> Finding:
        cli = config.get("nvidia-container-cli")
        value = cli.get("ldconfig") if isinstance(cli, dict) else None
        if not isinstance(value, str) or not value:
            return self.passed("ldconfig", "no ldconfig set in [nvidia-container-cli]: the "
                               "toolkit uses its built-in default")
        path = value.removeprefix("@")
        if not value.startswith("@"):
            return self.passed("ldconfig", f"ldconfig = {value!r} runs the container's own "
                               "ldconfig", observed=value)
        if host.exists(path):
            return self.passed("ldconfig", f"ldconfig = {value!r} exists on the host",
                               observed=value, expected="an existing host path")
        candidates = [p for p in ("/sbin/ldconfig.real", "/sbin/ldconfig") if host.exists(p)]
        line = next((n for n, raw in enumerate(text.split("\n")[:4096], start=1)
                     if _LDCONFIG_LINE.fullmatch(raw)), 0)
        return self.failed(
            "ldconfig", f"ldconfig = {value!r} in {CONFIG} does not exist on this host: every "
            "GPU container start fails ('ldcache error')",
            observed=value, expected=f"@{candidates[0]}" if candidates else "an existing path",
            fix=f"ldconfig = \"@{candidates[0]}\"" if candidates else "install ldconfig",
            evidence={"line": str(line), "replacement": f"@{candidates[0]}" if candidates
                      else ""})

    # -- rootless runtimes -----------------------------------------------------------------

    def _rootless(self, config: dict[str, Any], sockets: list[str]) -> Finding:
        cli = config.get("nvidia-container-cli")
        no_cgroups = cli.get("no-cgroups", False) if isinstance(cli, dict) else False
        ev = {"sockets": " ".join(sockets)[:256]}
        if no_cgroups is True:
            return self.passed("rootless", "a rootless runtime runs here and no-cgroups = true",
                               evidence=ev)
        return self.warned(
            "rootless", f"a rootless runtime runs here ({sockets[0]}) and no-cgroups is not "
            "true: its GPU containers fail with 'devices.allow: permission denied'",
            observed=f"no-cgroups = {str(no_cgroups).lower()}", expected="no-cgroups = true",
            fix="nvidia-ctk config --set nvidia-container-cli.no-cgroups --in-place (a "
                "rootful runtime on the same host then needs its GPUs through CDI)",
            evidence=ev)

    # -- the runtime as Docker registers it -------------------------------------------------

    def _docker_runtime(self, host: Host) -> Finding | None:
        config = docker.daemon_config(host)
        if not config.installed or config.values is None:
            return None
        runtimes = config.values.get("runtimes")
        nvidia = runtimes.get("nvidia") if isinstance(runtimes, dict) else None
        default = config.values.get("default-runtime")
        if default == "nvidia" and not isinstance(nvidia, dict):
            return self.failed("docker-runtime", f"{docker.DAEMON_JSON} makes nvidia the "
                               "default runtime but registers no runtime of that name: dockerd "
                               "does not start", observed="default-runtime nvidia, unregistered",
                               expected="runtimes.nvidia registered",
                               fix="nvidia-ctk runtime configure --runtime=docker")
        if not isinstance(nvidia, dict):
            return None
        binary = nvidia.get("path")
        if not isinstance(binary, str) or not binary:
            return None
        candidates = [binary] if binary.startswith("/") else [
            f"{d}/{binary}" for d in ("/usr/bin", "/usr/local/bin", "/usr/sbin")]
        if any(host.exists(p) for p in candidates):
            return self.passed("docker-runtime", f"Docker's nvidia runtime is {binary}",
                               observed=binary)
        return self.failed("docker-runtime", f"Docker's nvidia runtime names {binary!r}, which "
                           "is not installed: containers asking for it fail to start",
                           observed=binary, expected="an installed runtime binary",
                           fix="install nvidia-container-toolkit, or nvidia-ctk runtime "
                               "configure --runtime=docker")

    # -- the fix -------------------------------------------------------------------------------

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Create the /dev/char links and their udev rule; correct the ldconfig path."""
        from auditor.remedy import Advice, MakeSymlink, Remedy, ReplaceLine, WriteFile
        remedies: list[Remedy] = []
        for finding in findings:
            ev = dict(finding.evidence)
            if finding.subject == "dev-char":
                missing = [n for n in nvidia_nodes(host) if not host.lstat(n.link)]
                runtime: list[Step] = [MakeSymlink(n.link, f"..{n.path.removeprefix('/dev')}")
                                       for n in missing]
                persistent: list[Step] = [] if ev.get("udev_rule") else [
                    WriteFile(UDEV_RULE, RULE_TEXT)]
                remedies.append(Remedy(
                    check=self.id, subject="dev-char",
                    title="/dev/char links for the NVIDIA device nodes",
                    runtime=tuple(runtime), persistent=tuple(persistent),
                    notes=("the links are what 'nvidia-ctk system create-dev-char-symlinks "
                           "--create-all' creates; the udev rule creates them again when the "
                           "driver binds",)))
            elif finding.subject == "ldconfig" and ev.get("replacement"):
                line = int(ev.get("line", "0") or 0)
                text = files.read_text(host, CONFIG, 1 << 20) or ""
                lines = text.split("\n")
                if 0 < line <= len(lines):
                    old = lines[line - 1]
                    new = old.replace(finding.observed, ev["replacement"], 1)
                    remedies.append(Remedy(
                        check=self.id, subject="ldconfig",
                        title=f"ldconfig = \"{ev['replacement']}\"",
                        persistent=(ReplaceLine(CONFIG, line, old, new),)))
            elif finding.fix:
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title=finding.subject, advice=(Advice(finding.fix),)))
        return remedies
