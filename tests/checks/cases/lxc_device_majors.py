"""lxc.device_majors: the real capture, a Proxmox VE 9 node with seven GPU container layouts,
plain LXC and Incus, and an audit run inside a container."""

from typing import Any

from auditor.model import Status
from tests.support.cases import Base, Case, built
from tests.support.hostgen.containers import LxcSpec, PveSpec, build_lxc_host, build_pve9
from tests.support.hostgen.guests import ContainerAuditSpec, build_container_audit
from tests.support.plant import LXC_CONFIG, plant_lxc
from tests.support.sysroot import Sysroot

CHECK = "lxc.device_majors"


def current(root: Sysroot) -> None:
    root.write("/etc/pve/lxc/101.conf", LXC_CONFIG.replace("c 509:* rwm", "c 238:* rwm"))


def pve(**flags: bool) -> Base:
    name = "pve9-" + "-".join(sorted(flags)) if flags else "pve9"
    fields: dict[str, Any] = dict(flags)  # the spec's other fields are not all bool
    return built(lambda: build_pve9(PveSpec(**fields)), name)


def lxc(**flags: bool) -> Base:
    name = "lxc-" + "-".join(sorted(flags)) if flags else "lxc"
    fields: dict[str, Any] = dict(flags)  # the spec's other fields are not all bool
    return built(lambda: build_lxc_host(LxcSpec(**fields)), name)


CASES = [
    Case("no containers", Status.SKIP),
    Case("Proxmox container allows the old nvidia-uvm major", Status.FAIL, plant_lxc,
         fixed=True),
    Case("Proxmox container allows the current major", Status.PASS, current),
    Case("PVE 9: seven GPU containers (devN, binds, an included profile, the nvidia hook, "
         "running, AMD, nested include directories) that all work", Status.PASS, base=pve()),
    Case("PVE 9: bind mounts whose cgroup2 rule names the old nvidia-uvm major", Status.FAIL,
         base=pve(stale_bind=True), fixed=True),
    Case("PVE 9: the included GPU profile names the old major", Status.FAIL,
         base=pve(stale_include=True), fixed=True),
    Case("PVE 9: the nvidia hook in an allow-list that names the old major", Status.FAIL,
         base=pve(hook_allowlist=True), fixed=True),
    Case("PVE 9: fixed config, but the container runs with its last start's rules",
         Status.FAIL, base=pve(stale_running=True)),
    Case("PVE 9: AMD container allows the old kfd major", Status.FAIL,
         base=pve(stale_amd=True), fixed=True),
    Case("PVE 9: a directory included from an included directory names the old major",
         Status.FAIL, base=pve(stale_nested=True), fixed=True),
    Case("PVE 9: nested includes that loop: LXC refuses the config", Status.WARN,
         base=pve(include_loop=True)),
    Case("PVE 9: config edited to the old major after the start: it runs, and breaks at the "
         "next start", Status.FAIL, base=pve(broken_after_start=True), fixed=True),
    Case("plain LXC and Incus containers that all work", Status.PASS, base=lxc()),
    Case("plain LXC: a running container allows the old major", Status.FAIL,
         base=lxc(stale_plain=True), fixed=True),
    Case("plain LXC: an unprivileged nvidia hook container allows the old major", Status.FAIL,
         base=lxc(stale_hook=True), fixed=True),
    Case("Incus: a running instance started when nvidia-uvm had another major", Status.FAIL,
         base=lxc(stale_incus=True)),
    Case("plain LXC: a stale profile reached through a link out of the host's root is never "
         "read (that container is skipped, the rest pass)", Status.PASS,
         base=lxc(escaping_include=True, stale_plain=True)),
    Case("audit inside an unprivileged container: the host's containers are not visible",
         Status.SKIP, base=built(lambda: build_container_audit(ContainerAuditSpec()),
                                 "container-audit")),
]
