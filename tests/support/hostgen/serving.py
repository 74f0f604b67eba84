"""Hosts of the classes inference is served on, as the serving-path checks see them.

Built on :func:`~tests.support.hostgen.nvidia.build_driver_host` (kernels, driver, PCI
functions, daemons) with what the serving path adds: the mount table and memory, Docker and
the NVIDIA container toolkit, limits, systemd's own configuration, IRQs and NUMA placement.

- :func:`docker_gpu_container`: the audit run inside a Docker container given some of the
  host's GPUs (``docker run --gpus``): ``/.dockerenv``, a PID namespace of its own, the
  image's own ``/etc``, the host's ``/sys`` and ``/proc/driver``, Docker's 64 MiB /dev/shm;
- :func:`hyperv_vm`: an Azure ND-class Hyper-V guest (Microsoft's DMI strings, the
  ``hypervisor`` flag, 8 GPUs and 8 InfiniBand VFs passed through);
- :func:`grace_blackwell`: an aarch64 GB200 compute tray (4 Blackwell GPUs, the open module,
  4 ConnectX-7, the 64k-page Ubuntu kernel);
- :func:`dgx_class`: 8 H100 SXM, 4 NVSwitches, 8 ConnectX-7 InfiniBand, fabric manager;
- :func:`rhel_metal` and :func:`suse_metal`: bare-metal GPU nodes of those families with
  rdma-core's shipped limits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.support.hostgen.base import Tree
from tests.support.hostgen.nvidia import DriverSpec, build_driver_host
from tests.support.sysroot import Sysroot

GIB = 1 << 30
#: 2 TiB of RAM, as /proc/meminfo says it.
MEMTOTAL_KB = 2 * 1024 * 1024 * 1024
#: A B200/GB200 device id (0x29xx: Blackwell).
GB200 = 0x2941
ROOT_MOUNTS = ("/dev/nvme0n1p2 / ext4 rw,relatime 0 0\nproc /proc proc rw,nosuid,nodev,noexec 0 0\n"
               "sysfs /sys sysfs rw,nosuid,nodev,noexec 0 0\n")


def serving_files(tree: Tree, *, shm: str | None = "rw,nosuid,nodev,inode64",
                  memtotal_kb: int = MEMTOTAL_KB, mounts_prefix: str = ROOT_MOUNTS) -> None:
    """Write the mount table (with /dev/shm's options, None: not mounted) and /proc/meminfo."""
    mounts = mounts_prefix
    if shm is not None:
        mounts += f"tmpfs /dev/shm tmpfs {shm} 0 0\n"
    tree.put("/proc/mounts", mounts)
    tree.put("/proc/meminfo", f"MemTotal:       {memtotal_kb} kB\nMemFree:        "
             f"{memtotal_kb // 2} kB\nHugePages_Total:       0\nHugePages_Free:        0\n"
             "Hugepagesize:       2048 kB\n")


def docker_gpu_container(*, gpus: int = 8, host_gpus: int = 8,
                         shm: str | None = "rw,nosuid,nodev,noexec,relatime,size=65536k,inode64",
                         rdma_nics: int = 0) -> Tree:
    """Build the view from inside a Docker container given ``gpus`` of the host's GPUs."""
    host = build_driver_host(DriverSpec(gpus=host_gpus, rdma_nics=rdma_nics))
    tree = Tree()
    keep = ("/sys/", "/proc/driver/", "/proc/cpuinfo", "/proc/sys/kernel/osrelease",
            "/proc/version", "/proc/cmdline")
    for path, data in host.files.items():
        if path.startswith(keep):
            tree.files[path] = data
    for path, target in host.links.items():
        if path.startswith("/sys/"):
            tree.links[path] = target
    tree.put("/etc/hostname", "4f2a9c1e7b3d\n")
    tree.put("/etc/os-release", 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\n'
             'VERSION_ID="22.04"\nVERSION_CODENAME=jammy\nID=ubuntu\nID_LIKE=debian\n')
    tree.put("/.dockerenv", "")
    tree.put("/proc/1/cgroup", "0::/\n")
    tree.put("/proc/1/comm", "python3\n")
    tree.links["/proc/1/ns/pid"] = "pid:[4026532611]"
    tree.links["/proc/self/ns/pid"] = "pid:[4026532611]"
    for index in range(gpus):
        tree.devices[f"/dev/nvidia{index}"] = (195, index)
    if gpus:
        tree.devices["/dev/nvidiactl"] = (195, 255)
        tree.devices["/dev/nvidia-uvm"] = (508, 0)
    serving_files(tree, shm=shm, mounts_prefix="overlay / overlay rw,relatime,lowerdir=/var/"
                  "lib/docker/overlay2/l/ABC:/var/lib/docker/overlay2/l/DEF,upperdir=/var/lib/"
                  "docker/overlay2/0a1b/diff,workdir=/var/lib/docker/overlay2/0a1b/work 0 0\n"
                  "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
                  "sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0\n")
    return tree


def hyperv_vm(*, gpus: int = 8, rdma_nics: int = 8, **spec: object) -> Tree:
    """Build an Azure ND-class Hyper-V guest: Microsoft's DMI strings, GPUs and IB passed in."""
    tree = build_driver_host(DriverSpec(hostname="nd-h100-v5-01", gpus=gpus,
                                        rdma_nics=rdma_nics, environment="vm",
                                        running="6.8.0-1021-azure", **spec))  # type: ignore[arg-type]
    tree.put("/sys/class/dmi/id/sys_vendor", "Microsoft Corporation\n")
    tree.put("/sys/class/dmi/id/product_name", "Virtual Machine\n")
    tree.put("/sys/class/dmi/id/board_vendor", "Microsoft Corporation\n")
    tree.put("/sys/devices/system/clocksource/clocksource0/available_clocksource",
             "hyperv_clocksource_tsc_page acpi_pm\n")
    serving_files(tree)
    return tree


def grace_blackwell(*, gpus: int = 4, rdma_nics: int = 4, **spec: object) -> Tree:
    """Build an aarch64 GB200 compute tray: Blackwell GPUs, the open module, ConnectX-7."""
    tree = build_driver_host(DriverSpec(hostname="gb200-tray-01", gpus=gpus, gpu_device=GB200,
                                        rdma_nics=rdma_nics, running="6.8.0-1025-nvidia-64k",
                                        **spec))  # type: ignore[arg-type]
    tree.put("/proc/cpuinfo", "".join(
        f"processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 "
        "sha2 crc32 atomics sve\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: "
        "0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n\n" for n in range(4)))
    tree.put("/sys/class/dmi/id/sys_vendor", "NVIDIA\n")
    tree.put("/sys/class/dmi/id/product_name", "GB200 NVL\n")
    serving_files(tree, memtotal_kb=960 * 1024 * 1024)
    return tree


def dgx_class(**spec: object) -> Tree:
    """Build a DGX-class node: 8 H100 SXM, 4 NVSwitches, 8 InfiniBand NICs, fabric manager."""
    values: dict[str, object] = {"hostname": "dgx-01", "nvswitches": 4, "rdma_nics": 8,
                                 "fabricmanager": "running"}
    values.update(spec)
    tree = build_driver_host(DriverSpec(**values))  # type: ignore[arg-type]
    tree.put("/sys/class/dmi/id/sys_vendor", "NVIDIA\n")
    tree.put("/sys/class/dmi/id/product_name", "DGXH100\n")
    serving_files(tree)
    return tree


def rhel_metal(**spec: object) -> Tree:
    """Build a Rocky Linux 9 GPU node with rdma-core's shipped memlock limits."""
    values: dict[str, object] = {"hostname": "rhel-gpu-01", "distro": "rhel", "version_id":
                                 "9.6", "running": "5.14.0-570.23.1.el9_6.x86_64", "boot": "bls",
                                 "rdma_nics": 2}
    values.update(spec)
    tree = build_driver_host(DriverSpec(**values))  # type: ignore[arg-type]
    tree.put("/etc/security/limits.d/rdma.conf", "# configuration for rdma tuning\n"
             "*       soft    memlock         unlimited\n*       hard    memlock         "
             "unlimited\n# rdma tuning end\n")
    serving_files(tree)
    return tree


def suse_metal(**spec: object) -> Tree:
    """Build a SUSE Linux Enterprise Server 15 SP6 GPU node."""
    values: dict[str, object] = {"hostname": "sles-gpu-01", "distro": "rhel", "version_id": "15.6",
                                 "running": "6.4.0-150600.23.25-default", "rdma_nics": 2}
    values.update(spec)
    tree = build_driver_host(DriverSpec(**values))  # type: ignore[arg-type]
    tree.put("/etc/os-release", 'NAME="SLES"\nVERSION="15-SP6"\nVERSION_ID="15.6"\n'
             'PRETTY_NAME="SUSE Linux Enterprise Server 15 SP6"\nID="sles"\n'
             'ID_LIKE="suse"\n')
    serving_files(tree)
    return tree


def base(build: Callable[[], Tree], name: str) -> Callable[[Path], Sysroot]:
    """Return a case base writing ``build()``'s tree (device nodes as empty files as a user)."""
    def make(dest: Path) -> Sysroot:
        tree = build()
        root = tree.write_dir(dest)
        if os.geteuid() != 0:
            for path in tree.devices:
                (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                (root / path.lstrip("/")).touch()
        return Sysroot(root)

    make.__name__ = name
    return make


def irq_layout(root: Sysroot, *, cpus: int = 64, isolated: str = "",
               affinity: dict[str, str] | None = None) -> None:
    """Write two NUMA nodes of ``cpus`` CPUs, each GPU's and RDMA NIC's ``local_cpulist``
    and four MSI interrupts allowed on its local CPUs (``affinity``: address -> CPU list
    instead), and the isolated set (``/sys/devices/system/cpu/isolated``)."""
    half = cpus // 2
    lists = {0: f"0-{half - 1}", 1: f"{half}-{cpus - 1}"}
    cpu = "/sys/devices/system/cpu"
    root.write(f"{cpu}/online", f"0-{cpus - 1}\n")
    root.write(f"{cpu}/isolated", f"{isolated}\n")
    root.write(f"{cpu}/nohz_full", "(null)\n")
    for node, cpulist in lists.items():
        root.write(f"/sys/devices/system/node/node{node}/cpulist", cpulist + "\n")
    irq = 100
    devices = root.path("/sys/bus/pci/devices")
    for entry in sorted(devices.iterdir()):
        klass = (entry / "class").read_text().strip() if (entry / "class").exists() else ""
        if not klass.startswith(("0x0302", "0x0207")):
            continue
        node = int((entry / "numa_node").read_text().strip() or 0)
        local = lists.get(node, lists[0])
        root.write(f"/sys/bus/pci/devices/{entry.name}/local_cpulist", local + "\n")
        for _ in range(4):
            root.write(f"/sys/bus/pci/devices/{entry.name}/msi_irqs/{irq}", "msix\n")
            allowed = (affinity or {}).get(entry.name, local)
            root.write(f"/proc/irq/{irq}/smp_affinity_list", allowed + "\n")
            root.write(f"/proc/irq/{irq}/effective_affinity_list", allowed.split("-")[0] + "\n")
            irq += 1
