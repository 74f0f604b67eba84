"""kernel.version: kernels judged by their line and its dated lifecycle (Ubuntu HWE and cloud
steps, RHEL minors, SLE service packs, a replayed capture's own date), a hold that keeps a
kernel back, a pending reboot, the GPU driver's module at the next boot (DKMS, precompiled,
AMD), a container."""

import datetime as dt

from auditor.checks.kernel_version import KernelVersion
from auditor.manifest import PATH, make_manifest
from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.hostgen.serving import base, rhel_metal, suse_metal
from tests.support.sysroot import Sysroot

NEXT = "6.8.0-50-generic"
HWE = "6.14.0-37-generic"

CHECK = "kernel.version"


def reboot_pending(root: Sysroot) -> None:
    root.write("/boot/vmlinuz-6.19.2", "")
    root.write("/lib/modules/6.19.2/modules.dep", "updates/dkms/nvidia.ko.xz:\n")


def old_vanilla(root: Sysroot) -> None:
    root.write("/proc/sys/kernel/osrelease", "6.1.55\n")


def captured_2025_06(root: Sysroot) -> None:
    """Make the tree a capture taken on 2025-06-01 (its manifest covers this check)."""
    manifest = make_manifest([KernelVersion], KernelVersion.reads, (),
                             created=dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc))
    root.write(PATH, manifest.to_json())


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "lxc\n")


CASES = [
    Case("6.18 with the open 580 driver", Status.PASS),
    Case("a vanilla 6.1 kernel", Status.FAIL, old_vanilla),
    Case("a newer kernel waits for a reboot", Status.WARN, reboot_pending),
    Case("Ubuntu 24.04 GA kernel, DKMS module for it", Status.PASS, base=driver_host()),
    Case("the next kernel has no nvidia module: the reboot loses the GPUs", Status.FAIL,
         base=driver_host(DriverSpec(installed=(NEXT,), without_module=(NEXT,)))),
    Case("the next kernel's DKMS module is of another version", Status.FAIL,
         base=driver_host(DriverSpec(installed=(NEXT,), dkms_version={NEXT: "575.64.05"}))),
    Case("a newer kernel, its precompiled module installed, waits for a reboot", Status.WARN,
         base=driver_host(DriverSpec(installed=(NEXT,), module_origin="precompiled"))),
    Case("precompiled module missing for the next kernel", Status.FAIL,
         base=driver_host(DriverSpec(installed=(NEXT,), module_origin="precompiled",
                                     without_module=(NEXT,)))),
    Case("an -nvidia node whose next boot would start a generic kernel", Status.WARN,
         base=driver_host(DriverSpec(running="6.8.0-1017-nvidia", installed=(HWE,)))),
    Case("MI300X node, amdgpu in the next kernel", Status.PASS,
         base=driver_host(DriverSpec(gpus=0, uvm_disable_hmm=None, userspace="", amd_gpus=8))),
    Case("MI300X node, the next kernel without linux-modules-extra", Status.FAIL,
         base=driver_host(DriverSpec(gpus=0, uvm_disable_hmm=None, userspace="", amd_gpus=8,
                                     installed=(NEXT,), without_amdgpu=(NEXT,)))),
    Case("inside a container: the kernel is the host's", Status.SKIP, container),
    # Vendor lines by their dated lifecycle.
    Case("SLES 15 SP6 in general support", Status.PASS, base=base(suse_metal, "suse_metal"),
         options=(("as_of", "2025-09-01"),)),
    Case("SLES 15 SP6 after its general support ended", Status.WARN,
         base=base(suse_metal, "suse_metal"), options=(("as_of", "2026-03-01"),)),
    Case("Rocky 9.6 before 9.7", Status.PASS, base=base(rhel_metal, "rhel_metal"),
         options=(("as_of", "2025-09-01"),)),
    Case("Rocky 9.6 after 9.7 shipped", Status.WARN, base=base(rhel_metal, "rhel_metal"),
         options=(("as_of", "2025-12-01"),)),
    Case("Ubuntu 22.04 -azure on a superseded 6.5 step, held", Status.WARN,
         base=driver_host(DriverSpec(version_id="22.04", running="6.5.0-1025-azure",
                                     kernel_held=True)), options=(("as_of", "2025-01-10"),)),
    Case("a 24.04 HWE 6.11 capture replayed on its own date", Status.PASS, captured_2025_06,
         base=driver_host(DriverSpec(running="6.11.0-29-generic"))),
]
