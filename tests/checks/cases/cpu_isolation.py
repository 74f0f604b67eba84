"""cpu.isolation: NVIDIA's inference profile isolating CPU0 (DGX-class, a Hyper-V VM), every
CPU local to a Grace-Blackwell tray's devices, device interrupts allowed only on isolated
CPUs or a NIC's on the other node, irqbalance's banned list missing isolated CPUs, a fix
pending a reboot, legitimate isolation, no isolation (RHEL, SUSE), inside a container."""

from auditor.model import Status
from tests.support.cases import Case, built
from tests.support.hostgen.platforms import NextBootSpec, build_next_boot
from tests.support.hostgen.serving import (
    base,
    dgx_class,
    docker_gpu_container,
    grace_blackwell,
    hyperv_vm,
    irq_layout,
    rhel_metal,
    suse_metal,
)
from tests.support.sysroot import Sysroot

CHECK = "cpu.isolation"


def cmdline(root: Sysroot, tokens: str) -> None:
    root.write("/proc/cmdline", root.read("/proc/cmdline").rstrip("\n") + f" {tokens}\n")
    grub = root.read("/etc/default/grub").replace('GRUB_CMDLINE_LINUX_DEFAULT="quiet',
                                                   f'GRUB_CMDLINE_LINUX_DEFAULT="quiet {tokens}')
    root.write("/etc/default/grub", grub)


def nodewright_profile(root: Sysroot) -> None:
    """isolcpus=0,1,48,49 as the AKS H100 profile set it (PR #96)."""
    irq_layout(root, cpus=96, isolated="0-1,48-49")
    cmdline(root, "isolcpus=0,1,48,49 nohz_full=0,1,48,49 rcu_nocbs=0,1,48,49")


def pending_reboot(root: Sysroot) -> None:
    irq_layout(root, cpus=96, isolated="0-1,48-49")
    root.write("/proc/cmdline", root.read("/proc/cmdline").rstrip("\n") +
               " isolcpus=0,1,48,49\n")
    grub = root.read("/etc/default/grub").replace('GRUB_CMDLINE_LINUX_DEFAULT="quiet',
                                                   'GRUB_CMDLINE_LINUX_DEFAULT="quiet '
                                                   'isolcpus=2,3,50,51')
    root.write("/etc/default/grub", grub)


def realtime_cores(root: Sysroot) -> None:
    """Legitimate: the top cores of each node isolated, the devices' IRQs elsewhere."""
    irq_layout(root, cpus=64, isolated="28-31,60-63")
    cmdline(root, "isolcpus=managed_irq,domain,28-31,60-63")


def irqs_on_isolated(root: Sysroot) -> None:
    irq_layout(root, cpus=64, isolated="28-31,60-63",
               affinity={"0000:19:00.0": "28-31", "0000:29:00.0": "60-63"})
    cmdline(root, "isolcpus=managed_irq,domain,28-31,60-63")


def nic_remote(root: Sysroot) -> None:
    irq_layout(root, cpus=64, affinity={"0000:1b:00.0": "32-63"})


def starved_tray(root: Sysroot) -> None:
    irq_layout(root, cpus=64, isolated="32-63")
    cmdline(root, "isolcpus=32-63 nohz_full=32-63")


def irqbalance_banned(root: Sysroot) -> None:
    realtime_cores(root)
    root.write("/etc/default/irqbalance", "#IRQBALANCE_ONESHOT=\nIRQBALANCE_BANNED_CPUS="
               "f0000000\n")


def irqbalance_covers(root: Sysroot) -> None:
    realtime_cores(root)
    root.write("/etc/sysconfig/irqbalance", "IRQBALANCE_BANNED_CPULIST=28-31,60-63\n")


def no_isolation(root: Sysroot) -> None:
    irq_layout(root, cpus=64)


CASES = [
    Case("DGX-class: NVIDIA's AKS profile isolates CPU0,1,48,49", Status.FAIL,
         nodewright_profile, base=base(dgx_class, "dgx"), fixed=True, after=Status.WARN),
    Case("Hyper-V VM: the same profile", Status.FAIL, nodewright_profile,
         base=base(hyperv_vm, "hyperv")),
    Case("isolation fixed in GRUB, pending a reboot", Status.WARN, pending_reboot,
         base=base(dgx_class, "dgx")),
    Case("realtime cores isolated, device IRQs on housekeeping CPUs", Status.PASS,
         realtime_cores, base=base(dgx_class, "dgx")),
    Case("GPU IRQs allowed only on isolated CPUs", Status.WARN, irqs_on_isolated,
         base=base(dgx_class, "dgx"), fixed=True),
    Case("a NIC's completion IRQs on the other node", Status.WARN, nic_remote,
         base=base(rhel_metal, "rhel"), fixed=True),
    Case("Grace-Blackwell: every CPU local to node 1's GPUs and NICs isolated", Status.FAIL,
         starved_tray, base=base(grace_blackwell, "gb200")),
    Case("irqbalance's banned mask misses isolated CPUs", Status.WARN, irqbalance_banned,
         base=base(dgx_class, "dgx")),
    Case("irqbalance's banned list covers them", Status.PASS, irqbalance_covers,
         base=base(suse_metal, "sles")),
    Case("no CPU isolated", Status.PASS, no_isolation, base=base(suse_metal, "sles")),
    Case("inside a Docker container", Status.SKIP, base=base(docker_gpu_container, "docker")),
    # Rule 4: the next kernel's BLS entry isolates CPU0; the running kernel's entry and the
    # stale /etc/default/grub do not. Judged on the kernel that boots next, as boot.cmdline.
    Case("Rocky 9: the next kernel's BLS entry isolates CPU0", Status.FAIL,
         base=built(lambda: build_next_boot(NextBootSpec(boot="bls")), "next-boot-bls")),
    Case("PCIe box: a grub.d drop-in isolates CPU0 at the next boot", Status.FAIL,
         base=built(lambda: build_next_boot(NextBootSpec(boot="grub")), "next-boot-grub"),
         fixed=True),
]
