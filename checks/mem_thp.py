"""mem.thp: transparent huge pages and their defrag mode, and explicit huge pages per node.

``defrag=always`` makes an application that asks for a huge page "stall on allocation
failure and directly reclaim pages and compact memory" (kernel
``Documentation/admin-guide/mm/transhuge.rst``): latency spikes in the serving process,
whose tokenizer, scheduler and pinned buffers allocate all the time. Whether THP itself
helps inference is mixed (ubergarm/ik_llama.cpp PR #1: MADV_HUGEPAGE slowed a disk-paging
case from 3.5 to under 2 tok/s; ikawrakow/ik_llama.cpp PR #278: huge pages help on some
systems), so ``enabled`` is judged only against a profile that asks for a word (the
``latency`` profile asks for ``madvise``), never failed. Explicit huge pages (NVIDIA's H100
inference tuned profile reserves ``hugepagesz=2M hugepages=8192``) are memory taken from
the page cache and the serving process: a reservation nothing uses, or one on a single node
of several, is named.

Both files are selectors (``always [madvise] never``): the fix writes one word and its
rollback writes back the word that was selected (``SetSelector``); across reboots
``transparent_hugepage=`` on the command line sets ``enabled``, and a tmpfiles.d line sets
``defrag`` (there is no boot parameter for it). Inside a container both files are the host's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

from auditor import environment as where
from auditor.check import Check, CheckOptions, option
from auditor.checks.lib import files
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re, parse_selector

if TYPE_CHECKING:
    from auditor.remedy import FixContext, Remedy, Step

THP = "/sys/kernel/mm/transparent_hugepage"
ENABLED = f"{THP}/enabled"
DEFRAG = f"{THP}/defrag"
MEMINFO = "/proc/meminfo"
NODE_HUGEPAGES = "/sys/devices/system/node/node*/hugepages/hugepages-*/nr_hugepages"
NODE_FREE = "/sys/devices/system/node/node*/hugepages/hugepages-*/free_hugepages"
TMPFILES = "/etc/tmpfiles.d/90-host-auditor-thp.conf"
_MEMINFO_LINE = lazy_re(r"(HugePages_Total|HugePages_Free|Hugepagesize|Hugetlb):\s{0,32}"
                        r"([0-9]{1,15})(?: kB)?")
_NODE = lazy_re(r"/sys/devices/system/node/node([0-9]{1,4})/hugepages/hugepages-([0-9]{1,9})kB/"
                r"nr_hugepages")
GIB = 1 << 30


class MemThpOptions(CheckOptions):
    """Options of ``mem.thp``."""

    enabled: str = option("any", choices=("any", "always", "madvise", "never"),
                          help="the THP mode wanted ('any': not judged; the evidence is mixed)")
    defrag_avoid: tuple[str, ...] = option(("always",), help="defrag modes that warn")
    defrag: str = option("madvise", choices=("defer", "defer+madvise", "madvise", "never"),
                         help="the defrag mode the fix selects")


class MemThp(Check[MemThpOptions]):
    """THP defrag=always stalls allocations in direct compaction; huge pages held unused."""

    id: ClassVar[str] = "mem.thp"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    options_type: ClassVar[type[CheckOptions]] = MemThpOptions
    profiles: ClassVar[dict[str, dict[str, object]]] = {"latency": {"enabled": "madvise"}}
    reads: ClassVar[tuple[str, ...]] = (ENABLED, DEFRAG, MEMINFO, NODE_HUGEPAGES, NODE_FREE,
                                        TMPFILES, *where.READS)
    rationale: ClassVar[str] = (
        "With THP defrag=always every huge-page fault that finds no free huge page reclaims "
        "and compacts memory in the faulting thread: latency spikes in the serving process. "
        "Explicit huge pages reserved and unused are memory the server cannot have."
    )
    remedy: ClassVar[str] = (
        "Select madvise in /sys/kernel/mm/transparent_hugepage/defrag (and the wanted "
        "'enabled' mode), kept at boot by a tmpfiles.d line and transparent_hugepage= on the "
        "command line; release or rebalance unused huge page reservations."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = where.environment(host)
        inside = f" ({env.inside()}: the host's setting)" if env.in_container else ""
        enabled_text = files.read_optional(host, ENABLED)
        defrag_text = files.read_optional(host, DEFRAG)
        if enabled_text is None and defrag_text is None:
            yield self.skipped("thp", f"{THP} was not collected, or the kernel has no "
                               "transparent huge pages")
        else:
            yield self._enabled(enabled_text, inside, env.in_container)
            yield self._defrag(defrag_text, inside, env.in_container)
        finding = self._hugepages(host)
        if finding is not None:
            yield finding

    def _enabled(self, text: str | None, inside: str, container: bool) -> Finding:
        parsed = parse_selector(text) if text is not None else None
        if parsed is None:
            return self.skipped("enabled", f"{ENABLED} is unreadable or not a selector line",
                                evidence={"text": (text or "")[:128]})
        words, selected = parsed
        wanted = self.options.enabled
        ev = {"offered": " ".join(words), "container": "yes" if container else "no"}
        if wanted == "any" or selected == wanted:
            note = "" if wanted != "any" else " (not judged: the evidence for inference is mixed)"
            return self.passed("enabled", f"transparent huge pages: {selected}{inside}{note}",
                               observed=selected, expected=wanted, evidence=ev)
        return self.warned("enabled", f"transparent huge pages are {selected}{inside}; the "
                           f"profile asks for {wanted}", observed=selected, expected=wanted,
                           fix=f"echo {wanted} > {ENABLED}; transparent_hugepage={wanted} on "
                               "the boot command line", evidence=ev)

    def _defrag(self, text: str | None, inside: str, container: bool) -> Finding:
        parsed = parse_selector(text) if text is not None else None
        if parsed is None:
            return self.skipped("defrag", f"{DEFRAG} is unreadable or not a selector line",
                                evidence={"text": (text or "")[:128]})
        words, selected = parsed
        ev = {"offered": " ".join(words), "container": "yes" if container else "no"}
        if selected not in self.options.defrag_avoid:
            return self.passed("defrag", f"THP defrag: {selected}{inside}", observed=selected,
                               evidence=ev)
        return self.warned(
            "defrag", f"THP defrag is {selected}{inside}: a thread whose huge-page fault finds "
            "none free reclaims and compacts memory itself, stalling the serving process",
            observed=selected, expected=self.options.defrag,
            fix=f"echo {self.options.defrag} > {DEFRAG}, and keep it with a tmpfiles.d line",
            evidence=ev)

    def _hugepages(self, host: Host) -> Finding | None:
        info = {m.group(1): int(m.group(2)) for m in _MEMINFO_LINE.finditer(
            files.read_text(host, MEMINFO, 1 << 16) or "")}
        per_node: dict[int, int] = {}
        for path in host.glob(NODE_HUGEPAGES)[:256]:
            match = _NODE.fullmatch(path)
            count = (files.read_optional(host, path) or "")[:20]
            if match and count.isdigit():
                node = int(match.group(1))
                per_node[node] = per_node.get(node, 0) + int(count) * int(match.group(2)) * 1024
        total = info.get("HugePages_Total")
        if not total:
            return None
        size = info.get("Hugepagesize", 2048) * 1024
        free = info.get("HugePages_Free", 0)
        reserved = total * size
        ev = {"total": str(total), "free": str(free), "page_kb": str(size // 1024),
              "per_node": " ".join(f"node{n}={b // (1 << 20)}MiB" for n, b in
                                   sorted(per_node.items()))}
        notes = []
        if free == total:
            notes.append("none of them is in use (is the server configured to use them?)")
        if len(per_node) > 1 and sum(1 for b in per_node.values() if b) == 1:
            notes.append("all on one NUMA node: servers pinned to the others get none")
        shown = f"{reserved / GIB:.1f} GiB of explicit huge pages reserved ({total} x " \
                f"{size // 1024} kB)"
        if notes:
            return self.warned("hugepages", f"{shown}: {'; '.join(notes)}",
                               observed=f"{free}/{total} free", expected="in use, on every node",
                               fix="lower vm.nr_hugepages (or hugepages= on the command line) "
                                   "to what the server uses, per node", evidence=ev)
        return self.passed("hugepages", f"{shown}, {total - free} in use", evidence=ev)

    def remediate(self, host: Host, findings: Sequence[Finding], context: FixContext
                  ) -> list[Remedy]:
        """Select the wanted words now; keep them at boot (command line, tmpfiles.d)."""
        from auditor.remedy import Advice, Remedy, SetSelector, WriteFile
        env = where.environment(host)
        if env.in_container:
            return self.advice_on_the_host(findings, env.describe())
        remedies: list[Remedy] = []
        for finding in findings:
            if finding.subject == "defrag":
                runtime: list[Step] = [SetSelector(DEFRAG, self.options.defrag)]
                remedies.append(Remedy(
                    check=self.id, subject="defrag", title=f"THP defrag {self.options.defrag}",
                    runtime=tuple(runtime),
                    persistent=(WriteFile(TMPFILES, "# THP defrag: no stalls in direct "
                                          "compaction (host-auditor mem.thp)\n"
                                          f"w {DEFRAG} - - - - {self.options.defrag}\n"),),
                    notes=("tuned's [vm] transparent_hugepages and a tuned profile's [sysfs] "
                           "can set it again",)))
            elif finding.subject == "enabled":
                wanted = self.options.enabled
                remedies.append(Remedy(
                    check=self.id, subject="enabled", title=f"transparent huge pages {wanted}",
                    runtime=(SetSelector(ENABLED, wanted),),
                    boot_params=(f"transparent_hugepage={wanted}",)))
            elif finding.fix:
                remedies.append(Remedy(check=self.id, subject=finding.subject,
                                       title="huge page reservation",
                                       advice=(Advice(finding.fix),)))
        return remedies
