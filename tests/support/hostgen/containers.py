"""Hosts whose GPUs reach containers: a Proxmox VE 9 node with seven GPU containers in seven
layouts, and an Ubuntu host with plain LXC containers and Incus instances.

The LXC side follows what LXC and Proxmox really read and write: LXC's shipped
configs under /usr/share/lxc/config (common.conf starts an allow-list, userns.conf
clears it, Proxmox's userns.conf.d/01-pve.conf makes unprivileged containers a
deny-list), the config ``pct start`` writes to /var/lib/lxc/<id>/config, the cgroup
a running container has, and the lxc.conf Incus writes at each start. Each layout
has a flag that plants its problem; all off is a host whose containers all work.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.hostgen.base import Tree
from tests.support.hostgen.proxmox import HostSpec, build_host

LXC_CONFIG = "/usr/share/lxc/config"

#: LXC's shipped configs, the device part as LXC and Proxmox ship them.
_COMMON = """\
# Default configuration shared by all containers
lxc.tty.dir = lxc
lxc.cgroup2.devices.deny = a
lxc.cgroup2.devices.allow = c *:* m
lxc.cgroup2.devices.allow = b *:* m
lxc.cgroup2.devices.allow = c 1:3 rwm
lxc.cgroup2.devices.allow = c 1:5 rwm
lxc.cgroup2.devices.allow = c 1:7 rwm
lxc.cgroup2.devices.allow = c 5:0 rwm
lxc.cgroup2.devices.allow = c 5:1 rwm
lxc.cgroup2.devices.allow = c 5:2 rwm
lxc.cgroup2.devices.allow = c 1:8 rwm
lxc.cgroup2.devices.allow = c 1:9 rwm
lxc.cgroup2.devices.allow = c 136:* rwm
lxc.cgroup2.devices.allow = c 10:229 rwm
lxc.mount.auto = cgroup:mixed proc:mixed sys:mixed
lxc.include = /usr/share/lxc/config/common.conf.d/
"""
_USERNS = """\
lxc.cgroup2.devices.deny =
lxc.cgroup2.devices.allow =
lxc.cap.drop =
lxc.mount.auto = sys:rw
lxc.include = /usr/share/lxc/config/userns.conf.d/
"""
_PVE_COMMON_D = """\
lxc.hook.pre-start = /usr/share/lxc/hooks/lxc-pve-prestart-hook
lxc.hook.autodev = /usr/share/lxc/hooks/lxc-pve-autodev-hook
lxc.hook.post-stop = /usr/share/lxc/hooks/lxc-pve-poststop-hook
"""
_PVE_USERNS_D = """\
# Reset cgroupv2:
lxc.cgroup2.devices.deny =
lxc.cgroup2.devices.allow =
# For unprivileged containers we make it a deny-list:
lxc.cgroup2.devices.allow = a
"""


def lxc_shipped(tree: Tree, *, proxmox: bool) -> None:
    """Write LXC's configs (and Proxmox's drop-ins on a Proxmox host)."""
    tree.put(f"{LXC_CONFIG}/common.conf", _COMMON)
    tree.put(f"{LXC_CONFIG}/userns.conf", _USERNS)
    for distro in ("ubuntu", "debian"):
        tree.put(f"{LXC_CONFIG}/{distro}.common.conf",
                 f"lxc.include = {LXC_CONFIG}/common.conf\nlxc.arch = x86_64\n")
        tree.put(f"{LXC_CONFIG}/{distro}.userns.conf",
                 f"lxc.include = {LXC_CONFIG}/userns.conf\n")
    tree.put(f"{LXC_CONFIG}/common.seccomp", "2\nblacklist\n")
    if proxmox:
        tree.put(f"{LXC_CONFIG}/common.conf.d/01-pve.conf", _PVE_COMMON_D)
        tree.put(f"{LXC_CONFIG}/userns.conf.d/01-pve.conf", _PVE_USERNS_D)
    else:
        tree.put(f"{LXC_CONFIG}/common.conf.d/README", "LXC will read any file here.\n")


def _mounts(nodes: list[str], sep: str = ": ") -> list[str]:
    return [f"lxc.mount.entry{sep}{node} {node[1:]} none bind,optional,create=file"
            for node in nodes]


NVIDIA_NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools"]


@dataclass
class PveSpec:
    """The Proxmox VE 9 node with seven GPU containers; each flag plants one layout's problem."""

    hostname: str = "pve9-gpu"
    uvm_major: int = 511
    stale_uvm_major: int = 509
    kfd_major: int = 234
    stale_kfd_major: int = 235
    #: 202: bind mounts with cgroup2 rules that still name the old nvidia-uvm major.
    stale_bind: bool = False
    #: 203: the shared GPU profile it includes names the old major.
    stale_include: bool = False
    #: 204: the nvidia hook, with the device list turned back into an allow-list that names
    #: the old major (unprivileged Proxmox containers are a deny-list otherwise).
    hook_allowlist: bool = False
    #: 205: running with the config of its last start, which names the old major
    #: (its /etc/pve config is right).
    stale_running: bool = False
    #: 206: AMD: allows the old kfd major.
    stale_amd: bool = False
    #: 207: the nested profile (a directory included from a directory) names the old major.
    stale_nested: bool = False
    #: 207: the nested profile includes the directory that includes it: LXC loops until the
    #: config fails to load.
    include_loop: bool = False
    #: 205: its config on disk names the old major, but it was started before that edit,
    #: with the config of its last start that allows the current one.
    broken_after_start: bool = False


def build_pve9(spec: PveSpec | None = None) -> Tree:
    """Build a Proxmox VE 9 (Debian 13) node with NVIDIA and AMD GPUs and seven GPU containers."""
    spec = spec or PveSpec()
    tree = build_host(HostSpec(
        hostname=spec.hostname, cpus=32, nodes=2, gpus=2, nics=1, bad_governor=False,
        deep_cstates=False, numa_balancing=False, old_kernel=False, low_mrrs=False,
        stale_lxc_major=False, uvm_major=spec.uvm_major, stale_uvm_major=spec.stale_uvm_major,
    ))
    for path in [p for p in tree.files if p.startswith("/etc/pve/lxc/")]:
        del tree.files[path]
    # Debian 13: no /etc/sysctl.conf, no 99-sysctl.conf link.
    for path in ("/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.conf"):
        tree.files.pop(path, None)
    tree.put("/etc/sysctl.d/99-numa.conf", "kernel.numa_balancing = 0\n")
    tree.put("/usr/lib/systemd/system/systemd-sysctl.service", "[Unit]\nDescription=Apply "
             "Kernel Variables\n")
    tree.put("/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian '
             'GNU/Linux"\nVERSION_ID="13"\nVERSION_CODENAME=trixie\nID=debian\n')
    tree.put("/proc/1/cgroup", "0::/init.scope\n")
    tree.put("/proc/devices", (
        "Character devices:\n  1 mem\n  4 tty\n  5 /dev/tty\n 10 misc\n 13 input\n"
        "136 pts\n195 nvidia-frontend\n195 nvidia\n195 nvidiactl\n226 drm\n"
        f"{spec.kfd_major} kfd\n"
        f"{spec.uvm_major} nvidia-uvm\n{spec.uvm_major + 1} nvidia-nvswitch\n"
        f"{spec.uvm_major + 2} nvidia-caps\n"
        "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
    ))
    tree.devices["/dev/kfd"] = (spec.kfd_major, 0)
    tree.devices["/dev/dri/card1"] = (226, 1)
    tree.devices["/dev/dri/renderD128"] = (226, 128)
    lxc_shipped(tree, proxmox=True)
    uvm, stale = spec.uvm_major, spec.stale_uvm_major
    head = ["arch: amd64", "cores: 16", "memory: 131072", "ostype: ubuntu",
            "rootfs: local-zfs:subvol-{id}-disk-0,size=200G", "swap: 0"]

    def conf(ctid: int, lines: list[str], unprivileged: bool = False) -> None:
        text = [line.replace("{id}", str(ctid)) for line in head]
        text += [f"hostname: gpu{ctid}", f"unprivileged: {1 if unprivileged else 0}", *lines]
        tree.put(f"/etc/pve/lxc/{ctid}.conf", "\n".join(text) + "\n")

    # 201: devN entries, allowed at the live major on every start.
    conf(201, [f"dev{i}: {node},gid=44" for i, node in enumerate(NVIDIA_NODES)])
    # 202: bind mounts with cgroup2 rules.
    conf(202, ["lxc.cgroup2.devices.allow: c 195:* rwm",
               f"lxc.cgroup2.devices.allow: c {stale if spec.stale_bind else uvm}:* rwm",
               *_mounts(NVIDIA_NODES)])
    # 203: a shared GPU profile, included.
    conf(203, ["lxc.include: /etc/lxc/gpu-nvidia.conf"])
    tree.put("/etc/lxc/gpu-nvidia.conf", "\n".join([
        "# GPU passthrough profile shared by the inference containers",
        "lxc.cgroup2.devices.allow = c 195:* rwm",
        f"lxc.cgroup2.devices.allow = c {stale if spec.stale_include else uvm}:* rwm",
        *_mounts(NVIDIA_NODES, " = "),
    ]) + "\n")
    # 204: LXC's nvidia mount hook in an unprivileged container. Its leftover allow line
    # names the old major; under Proxmox's deny-list it restricts nothing.
    hook = ["lxc.hook.mount: /usr/share/lxc/hooks/nvidia",
            "lxc.environment: NVIDIA_VISIBLE_DEVICES=all",
            "lxc.environment: NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    if spec.hook_allowlist:
        hook += ["lxc.cgroup2.devices.deny: a", "lxc.cgroup2.devices.allow: c 1:3 rwm",
                 "lxc.cgroup2.devices.allow: c 195:* rwm",
                 f"lxc.cgroup2.devices.allow: c {stale}:* rwm"]
    else:
        hook += [f"lxc.cgroup2.devices.allow: c {stale}:* rwm"]
    conf(204, hook, unprivileged=True)
    # 205: its config is right, and it runs: with the config of its last start.
    conf(205, ["lxc.cgroup2.devices.allow: c 195:* rwm",
               f"lxc.cgroup2.devices.allow: c {stale if spec.broken_after_start else uvm}:* rwm",
               *_mounts(NVIDIA_NODES)])
    started = stale if spec.stale_running else uvm
    tree.put("/var/lib/lxc/205/config", "\n".join([
        "lxc.cgroup.relative = 0", "lxc.cgroup.dir.monitor = lxc.monitor/205",
        "lxc.cgroup.dir.container = lxc/205", "lxc.cgroup.dir.container.inner = ns",
        "lxc.arch = amd64", f"lxc.include = {LXC_CONFIG}/ubuntu.common.conf",
        "lxc.monitor.unshare = 1", "lxc.tty.max = 2", "lxc.environment = TERM=linux",
        "lxc.uts.name = gpu205", "lxc.cgroup2.memory.max = 137438953472",
        "lxc.cgroup2.devices.allow = c 195:* rwm",
        f"lxc.cgroup2.devices.allow = c {started}:* rwm",
        *_mounts(NVIDIA_NODES, " = "),
        "lxc.rootfs.path = /var/lib/lxc/205/rootfs",
    ]) + "\n")
    tree.put("/sys/fs/cgroup/lxc/205/cgroup.type", "domain\n")
    # 206: AMD, ROCm: /dev/kfd (a dynamic major) and /dev/dri (226).
    kfd = spec.stale_kfd_major if spec.stale_amd else spec.kfd_major
    conf(206, ["lxc.cgroup2.devices.allow: c 226:* rwm",
               f"lxc.cgroup2.devices.allow: c {kfd}:* rwm",
               "lxc.mount.entry: /dev/kfd dev/kfd none bind,optional,create=file",
               "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir"])
    # 207: nested includes as LXC reads them: a relative path (pct start runs lxc-start in
    # /), a directory of *.conf (README and *.conf.bak are not read), a file in it that
    # includes a second directory named without a trailing slash, and a link to a profile.
    conf(207, ["lxc.include: etc/lxc/gpu.d/"])
    tree.put("/etc/lxc/gpu.d/10-nvidia.conf", "lxc.cgroup2.devices.allow = c 195:* rwm\n"
             "lxc.include = /etc/lxc/profiles/uvm.d\n")
    tree.put("/etc/lxc/gpu.d/README", "Profiles for the GPU containers.\n")
    tree.put("/etc/lxc/gpu.d/10-nvidia.conf.bak", "lxc.cgroup2.devices.deny = a\n")
    tree.links["/etc/lxc/gpu.d/30-mounts.conf"] = "../profiles/mounts.conf"
    tree.put("/etc/lxc/profiles/mounts.conf", "\n".join(_mounts(NVIDIA_NODES, " = ")) + "\n")
    tree.put("/etc/lxc/profiles/uvm.d/20-uvm.conf", "\n".join([
        "# nvidia-uvm and its tools node",
        f"lxc.cgroup2.devices.allow = c {stale if spec.stale_nested else uvm}:* rwm",
        *(["lxc.include = /etc/lxc/gpu.d/"] if spec.include_loop else []),
    ]) + "\n")
    # And one without a GPU.
    conf(102, ["net0: name=eth0,bridge=vmbr0,ip=dhcp,type=veth"], unprivileged=True)
    return tree


@dataclass
class LxcSpec:
    """An Ubuntu host with plain LXC containers and Incus instances; flags plant problems."""

    hostname: str = "lxc-gpu"
    uvm_major: int = 236
    stale_uvm_major: int = 235
    #: gpu1 (plain LXC, privileged, running) allows the old nvidia-uvm major.
    stale_plain: bool = False
    #: hook1 (plain LXC, unprivileged, the nvidia hook) allows the old major: with no
    #: Proxmox drop-in its rules are an allow-list after userns.conf cleared LXC's.
    stale_hook: bool = False
    #: llm (Incus, running) was started when nvidia-uvm had the old major.
    stale_incus: bool = False
    #: gpu1 takes its rules from a shared profile through a link whose target climbs out of
    #: the host's root (clamped there, it is /srv/lxc/gpu.conf, not a path the audit reads).
    escaping_include: bool = False


def build_lxc_host(spec: LxcSpec | None = None) -> Tree:
    """Build an Ubuntu 24.04 host with NVIDIA GPUs, plain LXC containers and Incus."""
    spec = spec or LxcSpec()
    tree = build_host(HostSpec(
        hostname=spec.hostname, cpus=16, nodes=1, gpus=2, nics=0, bad_governor=False,
        deep_cstates=False, numa_balancing=False, old_kernel=False, low_mrrs=False,
        stale_lxc_major=False, uvm_major=spec.uvm_major, boot="grub",
    ))
    for path in [p for p in tree.files if p.startswith(("/etc/pve", "/boot/", "/lib/modules/"))]:
        del tree.files[path]
    release = "6.8.0-60-generic"
    tree.put("/proc/sys/kernel/osrelease", release + "\n")
    tree.put("/proc/version", f"Linux version {release} (buildd@lcy02-amd64-015) #63-Ubuntu "
             "SMP PREEMPT_DYNAMIC\n")
    tree.put("/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/mapper/vg-root "
             "ro quiet\n")
    tree.put(f"/boot/vmlinuz-{release}", b"\x7fELF")
    tree.put(f"/lib/modules/{release}/modules.dep", "")
    tree.put("/etc/os-release", 'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\n'
             'VERSION_ID="24.04"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n')
    tree.put("/proc/1/cgroup", "0::/init.scope\n")
    lxc_shipped(tree, proxmox=False)
    uvm, stale = spec.uvm_major, spec.stale_uvm_major
    rules = ["lxc.cgroup2.devices.allow = c 195:* rwm",
             f"lxc.cgroup2.devices.allow = c {stale if spec.stale_plain else uvm}:* rwm"]
    if spec.escaping_include:
        tree.put("/srv/lxc/gpu.conf", "\n".join(rules) + "\n")
        tree.links["/etc/lxc/shared/gpu.conf"] = "../../../../../../../../srv/lxc/gpu.conf"
        rules = ["lxc.include = /etc/lxc/shared/gpu.conf"]
    tree.put("/var/lib/lxc/gpu1/config", "\n".join([
        f"lxc.include = {LXC_CONFIG}/ubuntu.common.conf",
        "lxc.arch = linux64",
        "lxc.rootfs.path = dir:/var/lib/lxc/gpu1/rootfs",
        "lxc.uts.name = gpu1",
        *rules,
        *_mounts(NVIDIA_NODES, " = "),
    ]) + "\n")
    tree.put("/sys/fs/cgroup/lxc.payload.gpu1/cgroup.type", "domain\n")
    tree.put("/var/lib/lxc/hook1/config", "\n".join([
        f"lxc.include = {LXC_CONFIG}/ubuntu.common.conf",
        f"lxc.include = {LXC_CONFIG}/ubuntu.userns.conf",
        "lxc.idmap = u 0 100000 65536",
        "lxc.idmap = g 0 100000 65536",
        "lxc.rootfs.path = dir:/var/lib/lxc/hook1/rootfs",
        "lxc.uts.name = hook1",
        "lxc.hook.mount = /usr/share/lxc/hooks/nvidia",
        "lxc.environment = NVIDIA_VISIBLE_DEVICES=0",
        "lxc.environment = NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        "lxc.cgroup2.devices.allow = c 195:* rwm",
        f"lxc.cgroup2.devices.allow = c {stale if spec.stale_hook else uvm}:* rwm",
    ]) + "\n")
    # Incus: llm runs (its config is what Incus generated at its start), idle is stopped.
    for name in ("llm", "idle"):
        tree.links[f"/var/lib/incus/containers/{name}"] = (
            f"../storage-pools/default/containers/{name}")
        tree.put(f"/var/lib/incus/storage-pools/default/containers/{name}/metadata.yaml",
                 "architecture: x86_64\n")
    started = stale if spec.stale_incus else uvm
    devices = "/var/lib/incus/devices/llm"
    tree.put("/var/log/incus/llm/lxc.conf", "\n".join([
        "lxc.cgroup2.devices.deny = a",
        "lxc.cgroup2.devices.allow = b *:* m",
        "lxc.cgroup2.devices.allow = c *:* m",
        "lxc.cgroup2.devices.allow = c 1:3 rwm",
        "lxc.cgroup2.devices.allow = c 5:2 rwm",
        "lxc.cgroup2.devices.allow = c 136:* rwm",
        "lxc.cgroup2.devices.allow = c 195:0 rwm",
        "lxc.cgroup2.devices.allow = c 195:255 rwm",
        f"lxc.cgroup2.devices.allow = c {started}:0 rwm",
        f"lxc.cgroup2.devices.allow = c {started}:1 rwm",
        f"lxc.mount.entry = {devices}/unix.gpu.dev-nvidia0 dev/nvidia0 none "
        "bind,create=file 0 0",
        f"lxc.mount.entry = {devices}/unix.gpu.dev-nvidiactl dev/nvidiactl none "
        "bind,create=file 0 0",
        f"lxc.mount.entry = {devices}/unix.gpu.dev-nvidia--uvm dev/nvidia-uvm none "
        "bind,create=file 0 0",
        f"lxc.mount.entry = {devices}/unix.gpu.dev-nvidia--uvm--tools dev/nvidia-uvm-tools "
        "none bind,create=file 0 0",
        "lxc.uts.name = llm",
    ]) + "\n")
    tree.put("/sys/fs/cgroup/lxc.payload.llm/cgroup.type", "domain\n")
    return tree
