"""cpu.cstates: VMs, intel_idle, AMD EPYC's C2 (CC6) whatever it declares, a tuned PM QoS
limit, arm64 ACPI LPI states, and an audit inside a container."""

from auditor.model import Status
from tests.support.cases import Base, Case, built, capture
from tests.support.hostgen.guests import (
    ContainerAuditSpec,
    KvmGuestSpec,
    build_container_audit,
    build_kvm_guest,
)
from tests.support.hostgen.platforms import (
    EpycSpec,
    GraceSpec,
    NextBootSpec,
    build_epyc,
    build_grace,
    build_next_boot,
)
from tests.support.plant import plant_cstates
from tests.support.sysroot import Sysroot

CHECK = "cpu.cstates"


def c6_disabled(root: Sysroot) -> None:
    plant_cstates(root)
    for cpu in range(16):
        root.write(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle/state3/disable", "1\n")


def epyc(**flags: bool) -> Base:
    return built(lambda: build_epyc(EpycSpec(**flags)), "epyc")


def grace(**flags: bool) -> Base:
    return built(lambda: build_grace(GraceSpec(**flags)), "grace")


CASES = [
    Case("cpuidle driver none (a VM)", Status.SKIP),
    Case("haltpoll guest driver", Status.PASS, base=capture("virtio")),
    Case("intel_idle with C6 enabled", Status.FAIL, plant_cstates, fixed=True),
    Case("intel_idle with C6 disabled", Status.PASS, c6_disabled),
    Case("latency profile: C1E too deep", Status.FAIL, c6_disabled,
         options=(("max_exit_latency_us", 2),)),
    Case("AMD EPYC: C2 is CC6 though its BIOS declares 18 us", Status.FAIL, base=epyc(),
         fixed=True),
    Case("AMD EPYC: C2 (CC6) disabled", Status.PASS, base=epyc(cc6=False)),
    Case("AMD EPYC: tuned's latency-performance holds a 1 us PM QoS limit over C2",
         Status.PASS, base=epyc(tuned_latency=True)),
    Case("AMD EPYC: judged by declared latency alone, C2's 18 us passes", Status.PASS,
         base=epyc(), options=(("judge_identity", False),)),
    Case("arm64 ACPI LPI: LPI-1 (150 us) enabled", Status.FAIL, base=grace(), fixed=True),
    Case("arm64 ACPI LPI: LPI-1 disabled", Status.PASS, base=grace(deep_lpi=False)),
    Case("KVM guest with haltpoll", Status.PASS,
         base=built(lambda: build_kvm_guest(KvmGuestSpec()), "kvm")),
    Case("inside an unprivileged container: the host's CC6 enabled", Status.FAIL,
         base=built(lambda: build_container_audit(ContainerAuditSpec(host_cc6=True)), "ct")),
    Case("inside an unprivileged container: the host's C-states are shallow", Status.PASS,
         base=built(lambda: build_container_audit(ContainerAuditSpec()), "ct")),
    # Rule 4: processor.max_cstate=1 configured for the next kernel (BLS), not booted: C2 is
    # a problem now, its cap pending a reboot; the fix disables it now and writes no cap.
    Case("PCIe box: C2 (CC6) enabled, processor.max_cstate=1 pending a reboot", Status.FAIL,
         base=built(lambda: build_next_boot(NextBootSpec(boot="bls")), "next-boot-bls"),
         fixed=True),
]
