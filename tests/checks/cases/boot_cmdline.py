"""boot.cmdline: configured against booted on GRUB (drop-ins too), BLS and systemd-boot nodes;
tokens that do nothing, rewritten where they are configured."""

from auditor.model import Status
from tests.support.cases import Case, built
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.hostgen.platforms import NextBootSpec, build_next_boot
from tests.support.sysroot import Sysroot

CHECK = "boot.cmdline"


def _spec(**kw: object) -> DriverSpec:
    return DriverSpec(**kw)  # type: ignore[arg-type]


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "lxc\n")


CASES = [
    Case("Ubuntu GRUB node booted as configured", Status.PASS, base=driver_host()),
    Case("iommu=pt configured and grub.cfg regenerated, not booted", Status.WARN,
         base=driver_host(_spec(configured=("quiet", "iommu=pt"), booted=("quiet",)))),
    Case("iommu=pt configured, grub.cfg not regenerated", Status.WARN,
         base=driver_host(_spec(configured=("quiet", "iommu=pt"), booted=("quiet",),
                                grub_cfg_current=False))),
    Case("a grub.d drop-in extends GRUB_CMDLINE_LINUX and was booted", Status.PASS,
         base=driver_host(_spec(
             grub_d={"60-iommu.cfg": 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"\n'},
             generated=("iommu=pt", "quiet"), booted=("iommu=pt", "quiet")))),
    Case("a grub.d drop-in extends the line and was not booted", Status.WARN,
         base=driver_host(_spec(
             grub_d={"60-iommu.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\n'},
             generated=("iommu=pt", "quiet")))),
    Case("amd_iommu=pt configured and booted: rewritten to iommu=pt, pending a reboot",
         Status.WARN, base=driver_host(_spec(configured=("quiet", "amd_iommu=pt"))),
         fixed=True, after=Status.WARN),
    Case("two tokens glued together: split, pending a reboot", Status.WARN,
         base=driver_host(_spec(configured=("console=ttyS0,115200n8spectre_v2=off",))),
         fixed=True, after=Status.WARN),
    Case("pci=disable_acs_redir= twice: merged into one, pending a reboot", Status.WARN,
         base=driver_host(_spec(configured=("pci=disable_acs_redir=0000:40:01.1",
                                            "pci=noaer,disable_acs_redir=0000:c0:01.1"))),
         fixed=True, after=Status.WARN),
    Case("BLS entry carries a parameter the running kernel was not booted with", Status.WARN,
         base=driver_host(_spec(distro="rhel", version_id="9.6", boot="bls",
                                running="5.14.0-570.23.1.el9_6.x86_64",
                                configured=("intel_iommu=on", "iommu=pt"),
                                booted=("intel_iommu=on",)))),
    Case("BLS entry booted as configured", Status.PASS,
         base=driver_host(_spec(distro="rhel", version_id="9.6", boot="bls",
                                running="5.14.0-570.23.1.el9_6.x86_64",
                                configured=("intel_iommu=on", "iommu=pt")))),
    Case("proxmox-boot-tool: /etc/kernel/cmdline changed, not refreshed and rebooted",
         Status.WARN,
         base=driver_host(_spec(distro="proxmox", running="6.14.8-2-pve", boot="systemd-boot",
                                configured=("processor.max_cstate=1",), booted=()))),
    Case("tuned's bootcmdline booted through 00_tuned", Status.PASS,
         base=driver_host(_spec(tuned=("skew_tick=1",), generated=("quiet", "skew_tick=1"),
                                booted=("quiet", "skew_tick=1")))),
    Case("tuned's bootcmdline not booted", Status.WARN,
         base=driver_host(_spec(tuned=("skew_tick=1", "nohz=on")))),
    Case("inside a container: the boot line is the host's", Status.SKIP, container,
         base=driver_host()),
    # Rule 4: the next boot's line as every check reads it (test_next_boot.py).
    Case("PCIe box: a grub.d drop-in carries tokens not booted, one booted token dropped",
         Status.WARN, base=built(lambda: build_next_boot(NextBootSpec(boot="grub")),
                                 "next-boot-grub")),
    Case("Rocky 9: the next kernel's BLS entry (two options lines) carries them",
         Status.WARN, base=built(lambda: build_next_boot(NextBootSpec(boot="bls")),
                                 "next-boot-bls")),
    Case("proxmox-boot-tool: /etc/kernel/cmdline carries them, a stale /etc/default/grub",
         Status.WARN, base=built(lambda: build_next_boot(NextBootSpec(boot="systemd-boot")),
                                 "next-boot-systemd-boot")),
]
