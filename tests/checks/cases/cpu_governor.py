"""cpu.governor: VMs without cpufreq, ramping governors, performance everywhere, arm64
cppc_cpufreq, and an audit inside a container (the host's cpufreq)."""

from auditor.model import Status
from tests.support.cases import Case, built
from tests.support.hostgen.guests import (
    ContainerAuditSpec,
    KvmGuestSpec,
    build_container_audit,
    build_kvm_guest,
)
from tests.support.hostgen.platforms import GraceSpec, build_grace
from tests.support.plant import CPUFREQ, plant_cpufreq
from tests.support.sysroot import Sysroot

CHECK = "cpu.governor"


def performance(root: Sysroot) -> None:
    plant_cpufreq(root)
    for cpu in range(16):
        root.write(f"{CPUFREQ}/policy{cpu}/scaling_governor", "performance\n")


def epp_driver(root: Sysroot) -> None:
    plant_cpufreq(root, driver="amd-pstate-epp", epp=True)


def boost_off(root: Sysroot) -> None:
    performance(root)
    root.write(f"{CPUFREQ}/boost", "0\n")


def schedutil(root: Sysroot) -> None:
    for cpu in range(16):
        root.write(f"{CPUFREQ}/policy{cpu}/scaling_governor", "schedutil\n")


CASES = [
    Case("no cpufreq (a VM)", Status.SKIP),
    Case("performance on every policy", Status.PASS, performance),
    Case("acpi-cpufreq powersave and ondemand", Status.FAIL, plant_cpufreq, fixed=True),
    Case("amd-pstate-epp powersave with a power-leaning EPP", Status.FAIL, epp_driver,
         fixed=True),
    Case("boost off", Status.WARN, boost_off, fixed=True),
    Case("KVM guest: no cpufreq, the hypervisor host's governor decides", Status.SKIP,
         base=built(lambda: build_kvm_guest(KvmGuestSpec()), "kvm")),
    Case("arm64 cppc_cpufreq on performance", Status.PASS,
         base=built(lambda: build_grace(GraceSpec()), "grace")),
    Case("arm64 cppc_cpufreq on schedutil", Status.FAIL, schedutil,
         base=built(lambda: build_grace(GraceSpec()), "grace"), fixed=True),
    Case("inside an unprivileged container: the host runs powersave", Status.FAIL,
         base=built(lambda: build_container_audit(ContainerAuditSpec(host_powersave=True)),
                    "ct")),
    Case("inside an unprivileged container: the host runs performance", Status.PASS,
         base=built(lambda: build_container_audit(ContainerAuditSpec()), "ct")),
]
