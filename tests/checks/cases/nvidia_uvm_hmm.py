"""nvidia.uvm_hmm: HMM on with KASLR on multi-GPU nodes, Blackwell or not; configured but not live;
worked around by nokaslr; kernels without HMM; containers."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import RTX_PRO_6000, DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "nvidia.uvm_hmm"
CONF = "/etc/modprobe.d/nvidia-uvm.conf"


def no_device_private(root: Sysroot) -> None:
    root.write("/boot/config-6.8.0-45-generic", "CONFIG_RANDOMIZE_BASE=y\n"
               "# CONFIG_DEVICE_PRIVATE is not set\nCONFIG_HMM_MIRROR=y\n")


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "docker\n")


CASES = [
    Case("uvm_disable_hmm=Y live, configured in modprobe.d", Status.PASS,
         base=driver_host(DriverSpec(uvm_disable_hmm="Y", modprobe={
             CONF: "options nvidia_uvm uvm_disable_hmm=1\n"}))),
    Case("8 H100 with HMM and KASLR on: fixed, pending a reload", Status.WARN,
         base=driver_host(), fixed=True, after=Status.WARN),
    # Written but not live: judged by the live value (HMM on), the setting named as pending.
    Case("8 RTX PRO 6000 Blackwell with HMM and KASLR on: fixed, still failing until a reload",
         Status.FAIL, base=driver_host(DriverSpec(gpu_device=RTX_PRO_6000)), fixed=True,
         after=Status.FAIL),
    Case("Blackwell, with the nvidia modules in the initramfs (dracut)", Status.FAIL,
         base=driver_host(DriverSpec(gpu_device=RTX_PRO_6000, distro="rhel", version_id="9.6",
                                     boot="bls", running="5.14.0-570.23.1.el9_6.x86_64",
                                     initramfs_nvidia=True)),
         fixed=True, after=Status.FAIL),
    Case("configured off in modprobe.d but still on with Blackwell: fails by its live value",
         Status.FAIL, base=driver_host(DriverSpec(gpu_device=RTX_PRO_6000, modprobe={
             CONF: "options nvidia-uvm uvm_disable_hmm=1\n"}))),
    Case("configured off, on live, the initramfs carrying nvidia built before the setting",
         Status.FAIL, base=driver_host(DriverSpec(
             gpu_device=RTX_PRO_6000, initramfs_nvidia=True, initramfs_stale=True,
             modprobe={CONF: "options nvidia_uvm uvm_disable_hmm=1\n"}))),
    Case("configured off but still on, H100: warns by its live value", Status.WARN,
         base=driver_host(DriverSpec(modprobe={CONF: "options nvidia_uvm uvm_disable_hmm=1\n"}))),
    Case("a later file turns HMM back on at the next load", Status.WARN,
         base=driver_host(DriverSpec(uvm_disable_hmm="Y", modprobe={
             "/etc/modprobe.d/nvidia-uvm.conf": "options nvidia_uvm uvm_disable_hmm=1\n",
             "/etc/modprobe.d/zz-local.conf": "options nvidia_uvm uvm_disable_hmm=0\n"})),
         fixed=True, after=Status.PASS),
    Case("a value the kernel refuses: nvidia_uvm would not load", Status.FAIL,
         base=driver_host(DriverSpec(modprobe={CONF: "options nvidia_uvm uvm_disable_hmm=2\n"})),
         fixed=True, after=Status.WARN),
    Case("nokaslr on the boot line, H100", Status.PASS,
         base=driver_host(DriverSpec(kaslr=False))),
    Case("nokaslr with Blackwell: the eviction deadlock remains", Status.WARN,
         base=driver_host(DriverSpec(kaslr=False, gpu_device=RTX_PRO_6000))),
    Case("a kernel built without CONFIG_DEVICE_PRIVATE", Status.PASS, no_device_private,
         base=driver_host()),
    Case("one GPU", Status.PASS, base=driver_host(DriverSpec(gpus=1))),
    Case("no NVIDIA GPU or module", Status.SKIP,
         base=driver_host(DriverSpec(gpus=0, uvm_disable_hmm=None))),
    Case("inside a container: nvidia_uvm is the host's", Status.SKIP, container,
         base=driver_host()),
]
