"""Where the audit runs: bare metal, a virtual machine guest, or a container.

Every check that judges something the host (or the hypervisor) controls asks this
first: inside a container ``/sys`` and ``/proc/sys`` are the host's and read-only,
the kernel is the host's, and PCI config space past 64 bytes is out of reach even
for root; in a VM guest the CPU governor, C-states and the physical PCIe and IOMMU
topology belong to the hypervisor host. Read through the Host seam (a capture
replays it), computed once per host and shared by every check.

Evidence, strongest first:

- VM: the ``hypervisor`` CPU flag (x86: CPUID leaf 1 ECX bit 31, which every
  hypervisor sets and bare metal never does; arch/x86/include/asm/cpufeatures.h
  ``X86_FEATURE_HYPERVISOR``), ``/sys/hypervisor/type`` (Xen guests), and the DMI
  system vendor or product a hypervisor's firmware reports (the only evidence on
  arm64, which has no such flag). Cloud "metal" instances keep a cloud vendor
  string but no hypervisor flag: the flag wins where there is one.
- Container: ``/run/systemd/container`` (the container manager's name: systemd
  writes it from the ``container=`` variable LXC, nspawn, podman and others set,
  systemd's src/basic/virt.c ``detect_container``), ``/run/host/container-manager``
  (where newer managers name themselves, read there too), ``/.dockerenv``,
  ``/run/.containerenv`` (podman), container paths in ``/proc/1/cgroup``, and a
  user namespace that does not map every UID (pid 1's ``uid_map``: the initial
  namespace maps ``0 0 4294967295``), which is an unprivileged container.
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.hosts.base import Host
from auditor.parsing import lazy_re

CPUINFO = "/proc/cpuinfo"
#: The clock sources the kernel found: a KVM guest has ``kvm-clock``, which tells KVM
#: from the plain QEMU that its DMI strings name.
CLOCKSOURCES = "/sys/devices/system/clocksource/clocksource0/available_clocksource"
DMI = "/sys/class/dmi/id"
HYPERVISOR_TYPE = "/sys/hypervisor/type"
XEN_CAPABILITIES = "/proc/xen/capabilities"
SYSTEMD_CONTAINER = "/run/systemd/container"
#: Where newer container managers (systemd-nspawn, podman) name themselves.
HOST_CONTAINER_MANAGER = "/run/host/container-manager"
DOCKERENV = "/.dockerenv"
CONTAINERENV = "/run/.containerenv"
INIT_CGROUP = "/proc/1/cgroup"
UID_MAP = "/proc/1/uid_map"
#: The PID namespace of pid 1 (readable as root) and of the reader (always readable).
INIT_PID_NS = "/proc/1/ns/pid"
SELF_PID_NS = "/proc/self/ns/pid"
#: The initial PID namespace's inode: fixed by the kernel since 3.8
#: (include/linux/proc_ns.h, PROC_PID_INIT_INO = 0xEFFFFFFC).
INITIAL_PID_NS = "pid:[4026531836]"

#: Every path :func:`environment` reads: a check that uses it lists these in ``reads``.
READS: tuple[str, ...] = (
    CPUINFO,
    CLOCKSOURCES,
    f"{DMI}/sys_vendor",
    f"{DMI}/product_name",
    f"{DMI}/board_vendor",
    HYPERVISOR_TYPE,
    XEN_CAPABILITIES,
    SYSTEMD_CONTAINER,
    HOST_CONTAINER_MANAGER,
    DOCKERENV,
    CONTAINERENV,
    INIT_CGROUP,
    UID_MAP,
    INIT_PID_NS,
    SELF_PID_NS,
)

#: DMI system vendors and products that hypervisors report (systemd's
#: src/basic/virt.c ``detect_vm_dmi_vendor`` table, lower-cased prefixes).
_VM_VENDORS = (
    ("kvm", "kvm"), ("openstack", "kvm"), ("kubevirt", "kvm"), ("amazon ec2", "amazon"),
    ("qemu", "qemu"), ("vmware", "vmware"), ("innotek gmbh", "oracle"),
    ("virtualbox", "oracle"), ("oracle corporation", "oracle"), ("xen", "xen"),
    ("bochs", "bochs"), ("parallels", "parallels"), ("bhyve", "bhyve"), ("hyper-v", "microsoft"),
    ("apple virtualization", "apple"), ("google compute engine", "google"),
)
_VM_PRODUCTS = (
    ("standard pc (", "qemu"), ("kvm", "kvm"), ("virtualbox", "oracle"),
    ("vmware", "vmware"), ("virtual machine", "microsoft"), ("hvm domu", "xen"),
    ("google compute engine", "google"), ("openstack", "kvm"),
)
_CGROUP_CONTAINERS = (
    ("/docker/", "docker"), ("/docker-", "docker"), ("/kubepods", "kubernetes"),
    ("/libpod-", "podman"), ("/lxc.payload", "lxc"), ("/lxc/", "lxc"),
    ("/containerd", "containerd"), ("/machine.slice/systemd-nspawn", "systemd-nspawn"),
)
_WORD = lazy_re(r"[a-z0-9][a-z0-9._-]{0,31}")


def cgroup_container(text: str) -> str:
    """Return the container manager a ``/proc/PID/cgroup`` text places a process in, or ""."""
    for line in text.splitlines()[:64]:
        path = line.split(":", 2)[-1]
        for marker, manager in _CGROUP_CONTAINERS:
            if marker in path:
                return manager
    return ""


@dataclass(frozen=True)
class Environment:
    """Where the host's files were read: the machine's kind and the evidence for it."""

    #: The hypervisor a VM guest runs under (``kvm``, ``vmware``, ...), "" on bare metal.
    hypervisor: str = ""
    #: The container manager (``lxc``, ``docker``, ...), "" outside a container.
    container: str = ""
    #: In a container whose user namespace does not map every UID (unprivileged).
    user_namespace: bool = False
    #: What told: one short phrase per piece of evidence.
    evidence: tuple[str, ...] = ()

    @property
    def vm(self) -> bool:
        """Return whether the host is a virtual machine guest."""
        return bool(self.hypervisor)

    @property
    def in_container(self) -> bool:
        """Return whether the files were read inside a container."""
        return bool(self.container)

    @property
    def bare_metal(self) -> bool:
        """Return whether the host is neither a VM guest nor a container."""
        return not self.vm and not self.in_container

    @property
    def kind(self) -> str:
        """Return ``container``, ``vm`` or ``bare-metal``."""
        if self.in_container:
            return "container"
        return "vm" if self.vm else "bare-metal"

    def describe(self) -> str:
        """Return the environment in a few words (``container (lxc) in a VM (kvm)``)."""
        parts = []
        if self.in_container:
            kind = "unprivileged container" if self.user_namespace else "container"
            parts.append(f"{kind} ({self.container})")
        if self.vm:
            parts.append(f"VM ({self.hypervisor})")
        if not parts:
            return "bare metal"
        return " in a ".join(parts)

    def inside(self) -> str:
        """Return where the files were read: ``inside an unprivileged container (lxc)``."""
        text = self.describe()
        return f"inside {'an' if text[0] in 'aeiouAEIOU' else 'a'} {text}"


def _word(text: str | None) -> str:
    value = (text or "").strip().lower()
    match = _WORD.match(value)
    return match.group(0) if match else ""


def cpuinfo(host: Host) -> str:
    """Return /proc/cpuinfo's text, read once per host (checks share it)."""
    return host.fact("text:" + CPUINFO, lambda h: h.read_optional(CPUINFO) or "")


def _hypervisor(host: Host, evidence: list[str]) -> str:
    cpuinfo_text = cpuinfo(host)
    flags_line = next((line for line in cpuinfo_text.splitlines()
                       if line.startswith(("flags", "Features"))), None)
    dmi_vendor = (host.read_optional(f"{DMI}/sys_vendor") or "").strip().lower()
    product = (host.read_optional(f"{DMI}/product_name") or "").strip().lower()
    if flags_line is not None and "hypervisor" in flags_line.partition(":")[2].split():
        evidence.append("the hypervisor CPU flag")
        if "kvm-clock" in (host.read_optional(CLOCKSOURCES) or "").split():
            evidence.append("the kvm-clock clock source")
            return "kvm"
        for prefix, name in _VM_VENDORS:
            if dmi_vendor.startswith(prefix):
                return name
        for prefix, name in _VM_PRODUCTS:
            if product.startswith(prefix):
                return name
        return "unknown hypervisor"
    xen = _word(host.read_optional(HYPERVISOR_TYPE))
    # A Xen dom0 has the file too, and "control_d" in its capabilities.
    if xen == "xen" and "control_d" not in (host.read_optional(XEN_CAPABILITIES) or ""):
        evidence.append(f"{HYPERVISOR_TYPE} reads xen")
        return "xen"
    if flags_line is not None and "vendor_id" in cpuinfo_text:
        # x86 without the flag: bare metal, whatever the firmware's strings say.
        return ""
    for prefix, name in _VM_PRODUCTS:
        if product.startswith(prefix):
            evidence.append(f"DMI product {product[:40]!r}")
            return name
    for prefix, name in _VM_VENDORS:
        if dmi_vendor.startswith(prefix) and name != "amazon":
            evidence.append(f"DMI vendor {dmi_vendor[:40]!r}")
            return name
    return ""


def _container(host: Host, evidence: list[str]) -> tuple[str, bool]:
    name = ""
    for path in (SYSTEMD_CONTAINER, HOST_CONTAINER_MANAGER):
        declared = _word(host.read_optional(path))
        if declared:
            evidence.append(f"{path} reads {declared}")
            name = declared
            break
    if not name and host.exists(DOCKERENV):
        evidence.append(f"{DOCKERENV} exists")
        name = "docker"
    if not name and host.exists(CONTAINERENV):
        evidence.append(f"{CONTAINERENV} exists")
        name = "podman"
    if not name:
        for line in (host.read_optional(INIT_CGROUP) or "").splitlines()[:64]:
            path = line.split(":", 2)[-1]
            for marker, manager in _CGROUP_CONTAINERS:
                if marker in path:
                    evidence.append(f"pid 1's cgroup {path[:60]!r}")
                    name = manager
                    break
            if name:
                break
    mapped = _uid_map_is_partial(host.read_optional(UID_MAP))
    if mapped:
        evidence.append("a user namespace that maps part of the UIDs")
        name = name or "unknown container"
    # The markers above are files, and a root filesystem built from a container image
    # keeps them when it boots as a VM or a host of its own (Firecracker, cloud images).
    # A container shares its host's kernel and runs in a PID namespace of its own: the
    # namespace decides where it can be read.
    pid_ns = host.readlink(INIT_PID_NS) or host.readlink(SELF_PID_NS) or ""
    if pid_ns.startswith("pid:["):
        if pid_ns == INITIAL_PID_NS and name and not mapped:
            evidence.append(f"but pid 1 runs in the kernel's initial PID namespace ({pid_ns}): "
                            "the markers are leftovers of a container image, not a container")
            return "", False
        if pid_ns != INITIAL_PID_NS and not name:
            evidence.append(f"a PID namespace of its own ({pid_ns[:40]})")
            name = "unknown container"
    return name, mapped


def _uid_map_is_partial(text: str | None) -> bool:
    """Return whether a uid_map maps less than every UID (not the initial user namespace)."""
    if not text:
        return False
    lines = [line.split() for line in text.splitlines()[:340] if line.strip()]
    if len(lines) != 1 or len(lines[0]) != 3 or not all(f.isdigit() for f in lines[0]):
        return bool(lines)
    inside, outside, count = (int(f) for f in lines[0])
    return not (inside == 0 and outside == 0 and count == 4294967295)


def detect(host: Host) -> Environment:
    """Read where the host's files come from (uncached: :func:`environment` caches)."""
    evidence: list[str] = []
    hypervisor = _hypervisor(host, evidence)
    container, user_namespace = _container(host, evidence)
    return Environment(hypervisor, container, user_namespace, tuple(evidence))


def environment(host: Host) -> Environment:
    """Return where the host's files come from, read once per host."""
    return host.fact("environment", detect)
