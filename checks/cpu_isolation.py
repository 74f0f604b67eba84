"""cpu.isolation: isolated CPUs (isolcpus, nohz_full, tuned's cpu-partitioning) against the CPUs
the GPUs' and NICs' interrupts and the housekeeping need.

``isolcpus`` takes CPUs out of the scheduler's balancing (and with ``managed_irq`` out of
managed interrupts); ``nohz_full`` and ``rcu_nocbs`` move the tick and RCU callbacks off
them (kernel ``Documentation/admin-guide/kernel-parameters.txt``). That is right on realtime
hosts, so only the overlap with what must not be isolated is judged:

- CPU0, or every CPU local to a GPU or RDMA NIC: housekeeping, the NIC's completion
  interrupts and the serving threads then starve or cross sockets. NVIDIA's own H100
  inference tuned profiles isolated ``0,1,48,49`` on AKS and served 50,404 instead of
  148,344 tokens/s, TTFT p99 6,034 instead of 614 ms, bisected to ``isolcpus`` alone
  (NVIDIA/nodewright-packages PR #96): *fail*;
- a GPU's or NIC's interrupts allowed only on isolated CPUs, or a NIC's only on another
  NUMA node than its own (Irqbalance/irqbalance#175; bloomberg/chef-bcpc PR #2115: 10-20%
  from explicit affinity): *warn*;
- irqbalance's ``IRQBALANCE_BANNED_CPUS``/``_CPULIST``: once set, irqbalance stops banning
  isolcpus and nohz_full CPUs on its own (irqbalance cputree.c), so a list that misses
  isolated CPUs puts interrupts on them: *warn*.

The isolated set is the live one (``/sys/devices/system/cpu/isolated`` and ``nohz_full``);
the next boot's is the configured command line (checks/lib/bootloader.py, tuned's
``bootcmdline`` among it): a live problem the configuration no longer has is pending a
reboot. Interrupts are found by device (``msi_irqs``), their allowed CPUs in
``/proc/irq/N/smp_affinity_list``. Inside a container the command line is the host's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor import environment as where
from auditor.check import Check, CheckOptions, Trigger
from auditor.checks.lib import bootloader, files, gpupath, pci
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import format_cpulist, lazy_re, parse_cpulist

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

ISOLATED = "/sys/devices/system/cpu/isolated"
NOHZ_FULL = "/sys/devices/system/cpu/nohz_full"
ONLINE = "/sys/devices/system/cpu/online"
CMDLINE = "/proc/cmdline"
OS_RELEASE = "/etc/os-release"
MSI_IRQS = f"{pci.PCI_DEVICES}/*/msi_irqs/*"
IRQ_AFFINITY = "/proc/irq/*/smp_affinity_list"
IRQ_EFFECTIVE = "/proc/irq/*/effective_affinity_list"
IRQBALANCE_FILES = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")
#: The parameters that isolate CPUs, and the flags isolcpus takes before its list.
ISOLATING = ("isolcpus", "nohz_full", "rcu_nocbs")
ISOLCPUS_FLAGS = frozenset({"nohz", "domain", "managed_irq"})
_IRQ = lazy_re(r"[0-9]{1,6}")
_ASSIGN = lazy_re(r"\s{0,16}(?:export\s{1,8})?(IRQBALANCE_BANNED_CPU(?:S|LIST))=\"?([0-9a-fA-F,x"
                  r"\-]{0,1024})\"?\s{0,64}(?:#.{0,256})?")
#: How many of a starved device's local CPUs the fix hands back to housekeeping.
HANDED_BACK = 2


def split_isolcpus(value: str) -> tuple[tuple[str, ...], str]:
    """Return isolcpus=''s flags and its CPU list (``managed_irq,domain,2-31``)."""
    parts = value.split(",")
    flags: list[str] = []
    while parts and parts[0] in ISOLCPUS_FLAGS:
        flags.append(parts.pop(0))
    return tuple(flags), ",".join(parts)


def cpus_of(value: str) -> set[int]:
    """Return the CPUs a parameter's value names (isolcpus flags dropped), empty if none."""
    text = split_isolcpus(value)[1].strip()
    if not text or text == "(null)":
        return set()
    try:
        return set(parse_cpulist(text))
    except ValueError:
        return set()


def banned_mask(text: str) -> set[int]:
    """Return the CPUs of an irqbalance hex mask (``ff,00000000``: 32-bit words, high first)."""
    digits = text.lower().replace("0x", "").replace(",", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits) or len(digits) > 4096:
        return set()
    value = int(digits, 16)
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


class DeviceIrqs(NamedTuple):
    """A GPU's or RDMA NIC's place and its interrupts' allowed CPUs."""

    device: pci.PciDevice
    kind: str
    node: int | None
    local: set[int]
    #: IRQ number -> allowed CPUs.
    irqs: dict[int, set[int]]


def device_irqs(host: Host) -> list[DeviceIrqs]:
    """Return the GPUs and RDMA NICs (physical functions) with their MSI interrupts."""
    found: list[DeviceIrqs] = []
    for device in pci.devices(host):
        if device.virtual_function or not (device.is_gpu or device.is_rdma_nic):
            continue
        local_text = pci.local_cpulist(host, device.address)
        irqs: dict[int, set[int]] = {}
        for path in host.glob(f"{pci.device_path(device.address)}/msi_irqs/*")[:512]:
            name = path.rsplit("/", 1)[1]
            if not _IRQ.fullmatch(name):
                continue
            allowed = files.read_optional(host, f"/proc/irq/{name}/smp_affinity_list")
            if allowed:
                irqs[int(name)] = cpus_of(allowed)
        found.append(DeviceIrqs(device, "GPU" if device.is_gpu else "RDMA NIC",
                                pci.numa_node(host, device.address),
                                cpus_of(local_text) if local_text else set(), irqs))
    return found


class Isolation(NamedTuple):
    """The isolated CPUs, live and as the next boot will set them."""

    live: set[int]
    #: Where the live set was read.
    source: str
    #: The configured command line's isolating tokens (None: unknown).
    configured: dict[str, str] | None
    next_boot: set[int] | None


def isolation(host: Host) -> Isolation | None:
    """Return the isolated CPUs now and at the next boot, None when nothing says."""
    live: set[int] = set()
    sources = []
    for path in (ISOLATED, NOHZ_FULL):
        text = files.read_optional(host, path)
        if text is not None:
            sources.append(path)
            live |= cpus_of(text)
    cmdline = files.read_optional(host, CMDLINE)
    if not sources:
        if cmdline is None:
            return None
        for token in gpupath.cmdline_tokens(host):
            key, _, value = token.partition("=")
            if key in ("isolcpus", "nohz_full"):
                live |= cpus_of(value)
        sources.append(CMDLINE)
    # The next boot's line as every check sees it: the kernel that boots next (not the
    # running one: a BLS entry is per kernel), and its loader's configuration.
    conf = bootloader.next_boot(host).configured
    configured: dict[str, str] | None = None
    next_boot: set[int] | None = None
    if conf is not None:
        configured = {}
        next_boot = set()
        for configured_token in conf.tokens:
            key, _, value = configured_token.text.partition("=")
            if key in ISOLATING:
                configured[key] = value
                if key in ("isolcpus", "nohz_full"):
                    next_boot |= cpus_of(value)
    return Isolation(live, " and ".join(sources), configured, next_boot)


class CpuIsolation(Check[CheckOptions]):
    """Isolated CPUs must leave CPU0 and the GPUs' and NICs' interrupts their own CPUs."""

    id: ClassVar[str] = "cpu.isolation"
    severity: ClassVar[Severity] = Severity.HIGH
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        ISOLATED, NOHZ_FULL, ONLINE, CMDLINE, OS_RELEASE, MSI_IRQS, IRQ_AFFINITY,
        *IRQBALANCE_FILES, gpupath.OSRELEASE, *gpupath.NODE_READS,
        *bootloader.NEXT_BOOT_READS,
        *pci.DEVICE_READS, *pci.NUMA_READS, *where.READS,
    )
    events: ClassVar[frozenset[Trigger]] = frozenset({Trigger.PCI, Trigger.GPU_MODULE})
    rationale: ClassVar[str] = (
        "Isolating CPU0 or the CPUs local to the GPUs and NICs leaves housekeeping, "
        "interrupts and the serving threads a few cores, or cores on the other socket: "
        "NVIDIA's own inference profile that isolated CPU0 and the IRQ targets served "
        "50k instead of 148k tokens/s."
    )
    remedy: ClassVar[str] = (
        "Take CPU0 and some CPUs local to each GPU/NIC out of isolcpus/nohz_full/rcu_nocbs "
        "(the boot command line, or tuned's cpu-partitioning-variables.conf), move the "
        "devices' interrupts to housekeeping CPUs of their node, and let irqbalance's banned "
        "list cover every isolated CPU."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = where.environment(host)
        if env.in_container:
            yield self.skipped("isolcpus", f"{env.inside()}: CPU isolation and interrupt "
                               "placement are the host's; audit the host")
            return
        state = isolation(host)
        if state is None:
            yield self.skipped("isolcpus", f"neither {ISOLATED} nor {CMDLINE} was collected: "
                               "the isolated CPUs are unknown")
            return
        devices = device_irqs(host)
        configured = " ".join(f"{k}={v}" for k, v in (state.configured or {}).items())
        ev = {"isolated": format_cpulist(state.live), "source": state.source,
              "configured": configured[:512], **bootloader.next_boot(host).evidence()}
        if not state.live:
            pending = state.next_boot or set()
            if 0 in pending:
                yield self.failed("isolcpus", f"no CPU is isolated now, but the configured "
                                  f"command line isolates CPU0 at the next boot ({configured})",
                                  observed=f"next boot: {format_cpulist(pending)}",
                                  expected="CPU0 not isolated", evidence=ev,
                                  fix="remove CPU0 from the configured isolcpus/nohz_full")
                return
            yield self.passed("isolcpus", "no CPU is isolated", evidence=ev)
            for item in devices:
                finding = self._irqs(item, state.live, host)
                if finding is not None:
                    yield finding
            yield from self._irqbalance(host, state)
            return
        yield self._housekeeping(state, devices, ev)
        for item in devices:
            finding = self._irqs(item, state.live, host)
            if finding is not None:
                yield finding
        yield from self._irqbalance(host, state)

    def _starved(self, state: Isolation, devices: list[DeviceIrqs]) -> list[DeviceIrqs]:
        return [d for d in devices if d.local and d.local <= state.live]

    def _housekeeping(self, state: Isolation, devices: list[DeviceIrqs],
                      ev: dict[str, str]) -> Finding:
        problems = []
        if 0 in state.live:
            problems.append("CPU0")
        starved = self._starved(state, devices)
        for item in starved[:8]:
            problems.append(f"every CPU local to {item.kind} {item.device.address} "
                            f"({format_cpulist(item.local)})")
        shown = format_cpulist(state.live)
        if not problems:
            return self.passed("isolcpus", f"CPUs {shown} are isolated ({state.source}); CPU0 "
                               "and CPUs local to every GPU and RDMA NIC stay housekeeping",
                               observed=shown, evidence=ev)
        ev = {**ev, "starved": " ".join(d.device.address for d in starved)[:512]}
        message = (f"CPUs {shown} are isolated ({state.source}), among them "
                   f"{'; '.join(problems)}: housekeeping, device interrupts and serving threads "
                   "are left few or remote CPUs (NVIDIA's inference profile that isolated CPU0 "
                   "and the IRQ targets served 50k instead of 148k tokens/s)")
        fix = "take CPU0 and CPUs local to each GPU/NIC out of isolcpus/nohz_full/rcu_nocbs"
        if state.next_boot is not None and 0 not in state.next_boot and not any(
                d.local <= state.next_boot for d in starved):
            return self.warned("isolcpus", message + "; the configured command line no longer "
                               "does: pending a reboot", observed=shown, expected="CPU0 and "
                               "device-local CPUs not isolated", evidence=ev,
                               fix="reboot into the configured command line")
        return self.failed("isolcpus", message, observed=shown,
                           expected="CPU0 and device-local CPUs not isolated", fix=fix,
                           evidence=ev)

    def _irqs(self, item: DeviceIrqs, isolated: set[int], host: Host) -> Finding | None:
        if not item.irqs:
            return None
        on_isolated = sorted(n for n, cpus in item.irqs.items() if cpus and cpus <= isolated)
        nodes = gpupath.numa_nodes(host).cpus
        node_cpus = cpus_of(nodes.get(item.node, "")) if item.node is not None else set()
        remote = sorted(n for n, cpus in item.irqs.items()
                        if item.kind == "RDMA NIC" and node_cpus and cpus
                        and not cpus & node_cpus and n not in on_isolated)
        address = item.device.address
        ev = {"irqs": " ".join(str(n) for n in sorted(item.irqs))[:512],
              "isolated_irqs": " ".join(map(str, on_isolated))[:512],
              "remote_irqs": " ".join(map(str, remote))[:512],
              "local_cpus": format_cpulist(item.local), "node": str(item.node)}
        if on_isolated:
            return self.warned(
                address, f"{len(on_isolated)} of {len(item.irqs)} interrupts of {item.kind} "
                f"{address} may run only on isolated CPUs: they preempt the isolated work, and "
                "their completions wait on it", aspect="irq",
                observed=f"{len(on_isolated)} IRQ(s) on isolated CPUs",
                expected="interrupts on housekeeping CPUs of the device's node",
                fix="write housekeeping CPUs of its node to /proc/irq/N/smp_affinity_list",
                evidence=ev)
        if remote:
            return self.warned(
                address, f"{len(remote)} of {len(item.irqs)} completion interrupts of "
                f"{item.kind} {address} (node {item.node}) run only on another node's CPUs",
                aspect="irq", observed=f"{len(remote)} IRQ(s) remote",
                expected=f"node {item.node}'s CPUs",
                fix="write CPUs of its own node to /proc/irq/N/smp_affinity_list", evidence=ev)
        return self.passed(address, f"the {len(item.irqs)} interrupts of {item.kind} {address} "
                           "are allowed on housekeeping CPUs", aspect="irq", evidence=ev)

    def _irqbalance(self, host: Host, state: Isolation) -> Iterable[Finding]:
        isolated = state.live | (state.next_boot or set())
        if not isolated:
            return
        for path in IRQBALANCE_FILES:
            for number, raw in enumerate((files.read_text(host, path, 1 << 16) or "")
                                         .split("\n")[:1024], start=1):
                match = _ASSIGN.fullmatch(raw)
                if match is None or not match.group(2):
                    continue
                banned = (cpus_of(match.group(2)) if match.group(1).endswith("LIST")
                          else banned_mask(match.group(2)))
                missing = isolated - banned
                ev = {"file": f"{path}:{number}", "banned": format_cpulist(banned)}
                if missing:
                    yield self.warned(
                        "irqbalance", f"{path}:{number} sets {match.group(1)}, so irqbalance no "
                        "longer bans isolated and nohz_full CPUs itself, and the list misses "
                        f"isolated CPUs {format_cpulist(missing)}: it moves interrupts onto "
                        "them", observed=format_cpulist(banned) or "none",
                        expected=f"covering {format_cpulist(isolated)}", evidence=ev,
                        fix=f"IRQBALANCE_BANNED_CPULIST={format_cpulist(banned | isolated)} "
                            f"in {path} (or remove the line), then restart irqbalance")
                else:
                    yield self.passed("irqbalance", f"irqbalance's banned CPUs cover the "
                                      f"isolated ones ({path}:{number})", evidence=ev)
                return

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Hand CPU0 and device-local CPUs back at boot; move device IRQs off isolated CPUs."""
        from auditor.remedy import Advice, Remedy, SetValue
        remedies: list[Remedy] = []
        state = isolation(host)
        if state is None:
            return remedies
        devices = {d.device.address: d for d in device_irqs(host)}
        for finding in findings:
            ev = dict(finding.evidence)
            if finding.subject == "isolcpus" and state.configured:
                back = {0}
                for address in ev.get("starved", "").split():
                    item = devices.get(address)
                    if item is not None:
                        back |= set(sorted(item.local)[:HANDED_BACK])
                params = []
                for key, value in state.configured.items():
                    flags, _ = split_isolcpus(value)
                    cpus = cpus_of(value)
                    if cpus & back:
                        kept = format_cpulist(cpus - back)
                        params.append(f"{key}={','.join((*flags, kept))}" if kept else "")
                if params and all(params):
                    remedies.append(Remedy(
                        check=self.id, subject="isolcpus",
                        title=f"CPUs {format_cpulist(back)} back to housekeeping at boot",
                        boot_params=tuple(params), reboot=True,
                        notes=("a tuned cpu-partitioning profile sets isolated_cores in "
                               "/etc/tuned/cpu-partitioning-variables.conf: change it there "
                               "too",)))
                else:
                    remedies.append(Remedy(check=self.id, subject="isolcpus",
                                           title="hand CPUs back to housekeeping",
                                           advice=(Advice(finding.fix),)))
            elif finding.aspect == "irq":
                item = devices.get(finding.subject)
                if item is None:
                    continue
                housekeeping = item.local - state.live
                if not housekeeping:
                    continue
                wanted = format_cpulist(housekeeping)
                steps: list[Step] = []
                for irq, cpus in sorted(item.irqs.items()):
                    if cpus <= state.live or (item.kind == "RDMA NIC" and not cpus & item.local):
                        path = f"/proc/irq/{irq}/smp_affinity_list"
                        if host.exists(path):
                            steps.append(SetValue(path, wanted))
                remedies.append(Remedy(
                    check=self.id, subject=finding.subject,
                    title=f"interrupts of {finding.subject} on CPUs {wanted}",
                    runtime=tuple(steps),
                    notes=("the driver or irqbalance sets affinities again at boot; ban the "
                           "isolated CPUs in irqbalance so it keeps them off",)))
            elif finding.fix:
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title=finding.subject, advice=(Advice(finding.fix),)))
        return remedies
