"""nvidia.modparams: NVIDIA module options configured against the live values."""

from auditor.model import Status
from tests.support.cases import Case
from tests.support.hostgen.nvidia import DriverSpec, driver_host
from tests.support.sysroot import Sysroot

CHECK = "nvidia.modparams"
CONF = "/etc/modprobe.d/nvidia.conf"
BAR = {CONF: "options nvidia NVreg_EnableResizableBar=1\n"}


def container(root: Sysroot) -> None:
    root.write("/run/systemd/container", "lxc\n")


CASES = [
    Case("no option configured", Status.PASS, base=driver_host()),
    Case("NVreg_EnableResizableBar=1 is live", Status.PASS,
         base=driver_host(DriverSpec(modprobe=BAR, params={"EnableResizableBar": "1"}))),
    Case("NVreg_EnableResizableBar=1 configured, 0 live", Status.WARN,
         base=driver_host(DriverSpec(modprobe=BAR))),
    Case("a misspelt option the driver ignored", Status.WARN,
         base=driver_host(DriverSpec(modprobe={
             CONF: "options nvidia NVreg_EnableResizeableBar=1\n"}))),
    Case("RegistryDwords configured, empty live, modules in the initramfs", Status.WARN,
         base=driver_host(DriverSpec(initramfs_nvidia=True, modprobe={
             CONF: 'options nvidia NVreg_RegistryDwords="ForceP2P=0x11;RMForceP2PType=1"\n'}))),
    Case("options written after the initramfs that carries nvidia was built", Status.WARN,
         base=driver_host(DriverSpec(initramfs_nvidia=True, initramfs_stale=True, modprobe=BAR,
                                     params={"EnableResizableBar": "1"}))),
    Case("options live, the dracut initramfs built after them", Status.PASS,
         base=driver_host(DriverSpec(initramfs_nvidia=True, distro="rhel", version_id="9.6",
                                     boot="bls", running="5.14.0-570.23.1.el9_6.x86_64",
                                     modprobe=BAR, params={"EnableResizableBar": "1"}))),
    Case("RegistryDwords live as configured", Status.PASS,
         base=driver_host(DriverSpec(
             modprobe={CONF: 'options nvidia NVreg_RegistryDwords="ForceP2P=0x11"\n'},
             params={"RegistryDwords": "ForceP2P=0x11"}))),
    Case("-1 reads back as 4294967295; 1 as Y", Status.PASS,
         base=driver_host(DriverSpec(modprobe={
             CONF: "options nvidia NVreg_ResmanDebugLevel=-1\noptions nvidia-drm modeset=1\n"}))),
    Case("nvidia_uvm option on the boot line, not live", Status.WARN,
         base=driver_host(DriverSpec(configured=("quiet", "nvidia_uvm.uvm_perf_prefetch_enable=0"),
                                     booted=("quiet", "nvidia_uvm.uvm_perf_prefetch_enable=0")))),
    Case("inside a container", Status.SKIP, container,
         base=driver_host(DriverSpec(modprobe=BAR))),
    Case("no NVIDIA module", Status.SKIP,
         base=driver_host(DriverSpec(gpus=0, uvm_disable_hmm=None))),
]
