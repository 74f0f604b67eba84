"""numa.balancing: single node, on at runtime, off now but not at boot, the boot's real
sysctl order (Debian 13 without a 99-sysctl.conf link), the mechanisms that keep it at
boot (command line, tuned, a unit, root's crontab), a KVM guest, and inside a container."""

from auditor.model import Status
from tests.support.cases import Base, Case, built, capture
from tests.support.hostgen.containers import PveSpec, build_pve9
from tests.support.hostgen.guests import (
    ContainerAuditSpec,
    KvmGuestSpec,
    build_container_audit,
    build_kvm_guest,
)
from tests.support.hostgen.platforms import NextBootSpec, build_next_boot
from tests.support.plant import add_node, plant_numa
from tests.support.sysroot import Sysroot

CHECK = "numa.balancing"


def off_now_not_at_boot(root: Sysroot) -> None:
    add_node(root, 1)
    root.write("/proc/sys/kernel/numa_balancing", "0\n")


def off_now_and_at_boot(root: Sysroot) -> None:
    off_now_not_at_boot(root)
    root.write("/etc/sysctl.d/60-numa.conf", "kernel.numa_balancing = 0\n")


def no_knob(root: Sysroot) -> None:
    root.remove("/proc/sys/kernel/numa_balancing")


def pve9() -> Base:
    return built(lambda: build_pve9(PveSpec()), "pve9")


def only_sysctl_conf(root: Sysroot) -> None:
    """Debian 13: the line is in /etc/sysctl.conf, which no sysctl.d link points at."""
    root.remove("/etc/sysctl.d/99-numa.conf")
    root.write("/etc/sysctl.conf", "# local settings\nkernel.numa_balancing = 0\n")


def sysctl_conf_linked(root: Sysroot) -> None:
    only_sysctl_conf(root)
    root.symlink("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")


def crontab(root: Sysroot) -> None:
    root.remove("/etc/sysctl.d/99-numa.conf")
    root.write("/var/spool/cron/crontabs/root", "# m h dom mon dow command\n"
               "@reboot /usr/sbin/sysctl -w kernel.numa_balancing=0 >/dev/null\n")


def unit_sets_one(root: Sysroot) -> None:
    root.write("/etc/systemd/system/numa-tiering.service", "[Unit]\nDescription=Tiering\n\n"
               "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo 1 > "
               "/proc/sys/kernel/numa_balancing'\n\n[Install]\nWantedBy=multi-user.target\n")
    root.symlink("/etc/systemd/system/multi-user.target.wants/numa-tiering.service",
                 "/etc/systemd/system/numa-tiering.service")


def tuned_profile(root: Sysroot) -> None:
    root.remove("/etc/sysctl.d/99-numa.conf")
    root.write("/etc/tuned/active_profile", "inference\n")
    root.write("/etc/tuned/inference/tuned.conf", "[main]\nsummary=Inference\n"
               "include=throughput-performance\n\n[sysctl]\nkernel.numa_balancing=0\n")
    root.write("/usr/lib/tuned/throughput-performance/tuned.conf",
               "[main]\nsummary=Broadly applicable tuning\n\n[sysctl]\nvm.swappiness=10\n")
    root.symlink("/etc/systemd/system/multi-user.target.wants/tuned.service",
                 "/usr/lib/systemd/system/tuned.service")
    root.write("/usr/lib/systemd/system/tuned.service", "[Unit]\n")


def cmdline_disable(root: Sysroot) -> None:
    """Booted with numa_balancing=disable, and configured for the next boot too."""
    root.remove("/etc/sysctl.d/99-numa.conf")
    cmdline = root.read("/proc/cmdline").strip()
    root.write("/proc/cmdline", f"{cmdline} numa_balancing=disable\n")
    configured = root.read("/etc/kernel/cmdline").strip()
    root.write("/etc/kernel/cmdline", f"{configured} numa_balancing=disable\n")


def cmdline_disable_dropped(root: Sysroot) -> None:
    """Booted with numa_balancing=disable, which /etc/kernel/cmdline no longer has (rule 4):
    the next boot starts with the kernel's default."""
    root.remove("/etc/sysctl.d/99-numa.conf")
    cmdline = root.read("/proc/cmdline").strip()
    root.write("/proc/cmdline", f"{cmdline} numa_balancing=disable\n")


def next_boot(spec: NextBootSpec) -> Base:
    return built(lambda: build_next_boot(spec), f"next-boot-{spec.boot}")


#: systemd-sysctl's order (sysctl.d(5)): /etc/sysctl.d/50-numa.conf masks the vendor file of
#: that name, and /run's 90-late.conf sorts after it, so its 1 is the boot's value.
SYSCTL_LAYERS = {"/usr/lib/sysctl.d/50-numa.conf": "kernel.numa_balancing = 1\n",
                 "/etc/sysctl.d/50-numa.conf": "kernel.numa_balancing = 0\n",
                 "/run/sysctl.d/90-late.conf": "kernel.numa_balancing = 1\n"}

CASES = [
    Case("one node: nothing to migrate", Status.PASS),
    Case("two nodes, off now and in sysctl.d", Status.PASS, off_now_and_at_boot),
    Case("two nodes, on, a sysctl.d file sets 1", Status.FAIL, plant_numa, fixed=True),
    Case("two nodes, off now, nothing keeps it off at boot", Status.WARN,
         off_now_not_at_boot, fixed=True),
    Case("kernel without NUMA balancing", Status.SKIP, no_knob, base=capture("virtio")),
    Case("PVE 9: a sysctl.d file keeps it off", Status.PASS, base=pve9()),
    Case("PVE 9: /etc/sysctl.conf says 0, but no 99-sysctl.conf link makes the boot read it",
         Status.WARN, only_sysctl_conf, base=pve9(), fixed=True),
    Case("PVE 9: /etc/sysctl.conf through a 99-sysctl.conf link", Status.PASS,
         sysctl_conf_linked, base=pve9()),
    Case("PVE 9: root's @reboot crontab keeps it off", Status.PASS, crontab, base=pve9()),
    Case("PVE 9: a systemd unit sets 1 after systemd-sysctl", Status.FAIL, unit_sets_one,
         base=pve9()),
    Case("PVE 9: tuned's active profile keeps it off", Status.PASS, tuned_profile,
         base=pve9()),
    Case("PVE 9: numa_balancing=disable on the command line", Status.PASS, cmdline_disable,
         base=pve9()),
    Case("KVM guest: on across its two virtual nodes", Status.FAIL,
         base=built(lambda: build_kvm_guest(KvmGuestSpec(numa_balancing=True)), "kvm"),
         fixed=True),
    Case("inside an unprivileged container: the host's balancing is on", Status.FAIL,
         base=built(lambda: build_container_audit(ContainerAuditSpec(host_numa=True)), "ct")),
    Case("inside an unprivileged container: the host's balancing is off", Status.PASS,
         base=built(lambda: build_container_audit(ContainerAuditSpec()), "ct")),
    Case("PVE 9: numa_balancing=disable booted, no longer configured", Status.WARN,
         cmdline_disable_dropped, base=pve9(), fixed=True),
    # Rule 4: the next boot's line and sysctls as every check reads them.
    Case("PCIe box: the next boot's line drops numa_balancing=disable", Status.WARN,
         base=next_boot(NextBootSpec(boot="grub")), fixed=True),
    Case("PCIe box: a later /run/sysctl.d file sets 1 over /etc's 0", Status.FAIL,
         base=next_boot(NextBootSpec(boot="systemd-boot", sysctl=SYSCTL_LAYERS)), fixed=True),
    Case("PCIe box: on now, a later sysctl.d file already sets 0", Status.FAIL,
         base=next_boot(NextBootSpec(boot="bls", balancing="1", sysctl={
             "/etc/sysctl.d/10-numa.conf": "kernel.numa_balancing = 1\n",
             "/etc/sysctl.d/95-numa.conf": "kernel.numa_balancing = 0\n"})), fixed=True),
]
