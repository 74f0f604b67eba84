"""boot.cmdline: the boot line as configured against the one booted, and tokens that do nothing.

Every durable fix of a boot parameter (IOMMU, ACS, C-states, governor, HMM) lands in a boot
loader's configuration and takes effect only at the next boot. This check is where every
other check's boot-time fix is verified: once a fix wrote a parameter, the audit shows it
*pending a reboot* here until the kernel was booted with it.

Two subjects:

- ``cmdline``: the tokens the next boot will pass (GRUB's defaults expanded in order, the BLS
  entry of the next kernel, ``/etc/kernel/cmdline``, tuned's ``bootcmdline``; see
  :mod:`auditor.checks.lib.bootloader`) against ``/proc/cmdline``. A configured token the
  running kernel did not get is *pending*: the message names the file and line, the command
  that writes the loader's configuration where it is still stale (``grub.cfg`` without the
  token), and the reboot.
- ``tokens``: parameters that do nothing or not what they look like:
  ``amd_iommu=pt`` (not a value of amd_iommu: the kernel logs "AMD-Vi: Unknown option - 'pt'"
  and stays translated; ``iommu=pt`` is the passthrough switch, drivers/iommu/amd/init.c
  ``parse_amd_iommu_options``), ``pcie_acs_override=`` on a kernel without the out-of-tree
  ACS-override patch (Proxmox's kernels carry it, stock ones do not), several
  ``pci=disable_acs_redir=`` / ``pci=config_acs=`` (``pci_setup`` keeps a pointer to the last
  one only), tokens glued to their neighbour (``...115200n8spectre_v2=off``,
  redhat-performance/tuned#268), and contradictory IOMMU switches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from auditor.check import Check, CheckOptions
from auditor.checks.lib import bootloader, files, kernels
from auditor.checks.lib.bootloader import Configured, Token, param_key, same_token
from auditor.environment import READS as ENVIRONMENT_READS
from auditor.environment import environment
from auditor.hosts.base import Host
from auditor.model import Finding, Severity
from auditor.parsing import lazy_re, parse_os_release

if TYPE_CHECKING:
    from auditor.remedy import Advice, FixContext, Remedy, Step

PROC_CMDLINE = "/proc/cmdline"
OS_RELEASE = "/etc/os-release"
#: Tokens boot loaders add themselves (GRUB's 10_linux: root= and ro, BOOT_IMAGE=, Ubuntu's
#: vt.handoff; the EFI stub's initrd=): never "dropped" by a configuration that lacks them.
LOADER_KEYS = frozenset({"BOOT_IMAGE", "root", "ro", "rw", "initrd", "vt.handoff", "rootflags",
                         "rootfstype", "single"})
#: Parameters a glued token hides: what this project and GPU tuning guides put on the line.
KNOWN_PARAMS = (
    "spectre_v2", "mitigations", "iommu", "intel_iommu", "amd_iommu", "iommu.passthrough",
    "iommu.strict", "pci", "pcie_aspm", "pcie_port_pm", "pcie_acs_override",
    "processor.max_cstate", "intel_idle.max_cstate", "idle", "cpufreq.default_governor",
    "amd_pstate", "intel_pstate", "numa_balancing", "isolcpus", "nohz_full", "rcu_nocbs",
    "hugepages", "hugepagesz", "default_hugepagesz", "transparent_hugepage", "init_on_alloc",
    "nvidia_uvm.uvm_disable_hmm", "nvidia-drm.modeset", "nvidia_drm.modeset", "nokaslr",
    "console", "crashkernel", "modprobe.blacklist", "rd.driver.blacklist", "nouveau.modeset",
    "amdgpu.ppfeaturemask", "tsc", "nosmt", "selinux", "apparmor", "audit",
)
_GLUED = lazy_re(r"[A-Za-z0-9]((?:" + "|".join(re.escape(p) for p in sorted(
    KNOWN_PARAMS, key=len, reverse=True)) + r")=)")
ACS_OPTIONS = ("disable_acs_redir=", "config_acs=")


class Problem(NamedTuple):
    """A token that does nothing or not what it looks like, and what it should be."""

    token: str
    why: str
    #: What to write instead (no words: remove it), or None when the choice is the operator's.
    replacement: tuple[str, ...] | None


def lint(tokens: Sequence[str], line_name: str) -> list[Problem]:
    """Return the ineffective or misleading tokens of a command line."""
    problems: list[Problem] = []
    keys = {param_key(t) for t in tokens}
    for token in tokens:
        key, _, value = token.partition("=")
        if key == "amd_iommu" and "pt" in value.split(","):
            problems.append(Problem(
                token, "amd_iommu has no 'pt' value: the kernel logs \"AMD-Vi: Unknown option - "
                "'pt'\" and keeps the IOMMU translating; iommu=pt is the passthrough switch",
                () if "iommu" in keys else ("iommu=pt",)))
        elif key == "pcie_acs_override" and line_name != "pve":
            problems.append(Problem(
                token, "pcie_acs_override= belongs to an out-of-tree patch (Proxmox and some "
                "gaming kernels): this kernel ignores it; it changes IOMMU grouping only, "
                "never ACS redirection (pci=disable_acs_redir= does that)", ()))
        glued = _GLUED.search(token)
        if glued and glued.start(1) > 0:
            cut = glued.start(1)
            problems.append(Problem(
                token, f"two parameters glued together: {token[:cut]!r} and "
                f"{token[cut:]!r} (a missing space)", (token[:cut], token[cut:])))
    problems += _acs_repeats(tokens)
    iommu = {param_key(t): t.partition("=")[2] for t in tokens if "iommu" in param_key(t)}
    if iommu.get("iommu") == "off" and (iommu.get("intel_iommu") == "on"
                                        or iommu.get("amd_iommu") == "on"):
        problems.append(Problem(
            "iommu=off", "iommu=off next to intel_iommu=on/amd_iommu=on: the switches "
            "contradict each other; say which you want", None))
    for name in ("intel_iommu", "amd_iommu", "iommu"):
        values = [t for t in tokens if param_key(t) == name]
        if len({v.partition("=")[2] for v in values}) > 1:
            problems.append(Problem(
                values[0], f"{name} is given {len(values)} different values "
                f"({', '.join(values)}): only the last counts", None))
    return problems


def _acs_repeats(tokens: Sequence[str]) -> list[Problem]:
    """Return a problem for each ACS option of ``pci=`` given more than once (the last wins)."""
    problems: list[Problem] = []
    for option in ACS_OPTIONS:
        holders = [t for t in tokens if param_key(t) == "pci"
                   and any(o.startswith(option) for o in t.partition("=")[2].split(","))]
        values = [o for t in holders for o in t.partition("=")[2].split(",")
                  if o.startswith(option)]
        count = len(values)
        # The same list given twice loses nothing: only different lists lose devices.
        if len({v.replace("\\;", ";") for v in values}) < 2:
            continue
        devices: list[str] = []
        for token in holders:
            for part in token.partition("=")[2].split(","):
                if part.startswith(option):
                    devices += [d for d in part[len(option):].split(";") if d]
        merged = f"pci={option}{';'.join(dict.fromkeys(devices))}"
        for index, token in enumerate(holders):
            others = [p for p in token.partition("=")[2].split(",") if not p.startswith(option)]
            keep = ([f"pci={','.join(others)}"] if others else [])
            if index == len(holders) - 1:
                keep.append(merged)
            problems.append(Problem(
                token, f"pci={option} is given {count} times: pci_setup keeps only the last, "
                "so the devices of the others keep ACS redirection on; merge them into one",
                tuple(keep)))
    return problems


class BootCmdline(Check[CheckOptions]):
    """Boot parameters configured but not booted, and boot parameters that do nothing."""

    id: ClassVar[str] = "boot.cmdline"
    severity: ClassVar[Severity] = Severity.MEDIUM
    version_added: ClassVar[str] = "0.1.0"
    reads: ClassVar[tuple[str, ...]] = (
        *bootloader.NEXT_BOOT_READS,
        OS_RELEASE,
        *ENVIRONMENT_READS,
    )
    rationale: ClassVar[str] = (
        "Every durable fix of a boot parameter (IOMMU passthrough, ACS redirection off, "
        "C-state limits, UVM HMM off) is written to the boot loader's configuration and "
        "takes effect only at the next boot, and only if the loader's own files were "
        "regenerated from it. A parameter written but never booted is a fix that did not "
        "land; a parameter that does nothing (amd_iommu=pt, a repeated "
        "pci=disable_acs_redir=, two tokens glued together) looks like a fix and is not one."
    )
    remedy: ClassVar[str] = (
        "Regenerate the loader's configuration (update-grub, grub2-mkconfig, grubby, "
        "proxmox-boot-tool refresh) and reboot; rewrite ineffective tokens where they are "
        "configured (iommu=pt for amd_iommu=pt, one merged pci=disable_acs_redir=, a space "
        "between glued tokens)."
    )

    def evaluate(self, host: Host) -> Iterable[Finding]:
        env = environment(host)
        if env.in_container:
            reason = (f"inside a {env.describe()}: the kernel and its boot line are the "
                      "host's; audit the host")
            yield self.skipped("cmdline", reason)
            yield self.skipped("tokens", reason)
            return
        os_release = parse_os_release(files.read_optional(host, OS_RELEASE) or "")
        # The one view of the next boot every check shares (checks/lib/bootloader.py).
        nxt = bootloader.next_boot(host)
        live = list(nxt.live)
        running, release, configured = nxt.running, nxt.release, nxt.configured
        line_name = kernels.classify(running, os_release).name if running else ""
        yield self._pending(configured, live, running, release, nxt)
        yield self._tokens(configured, live, line_name)

    # -- configured against booted --------------------------------------------------------

    def _pending(self, configured: Configured | None, live: list[str], running: str,
                 release: str, nxt: bootloader.NextBootLine) -> Finding:
        base = {"running": running, "next_boot": release, "next_boot_how": nxt.how,
                "live": " ".join(live)[:2048], **nxt.evidence()}
        if configured is None:
            return self.skipped(
                "cmdline", "no boot loader configuration found (/etc/default/grub, BLS entries, "
                "/etc/kernel/cmdline): the configured command line cannot be read",
                evidence=base)
        tokens = list(configured.tokens)
        ev = {**base, "loader": configured.loader, "files": " ".join(configured.files),
              "configured": " ".join(t.text for t in tokens)[:2048]}
        if configured.unexpanded:
            ev["unexpanded"] = " ".join(configured.unexpanded)
        missing = [t for t in tokens if not any(same_token(t.text, w) for w in live)]
        configured_keys = {t.key for t in tokens}
        dropped = [] if configured.unexpanded else [
            tok for tok in live if param_key(tok) not in configured_keys
            and param_key(tok) not in LOADER_KEYS and not tok.startswith("$")]
        stale: list[Token] = []
        if configured.generated is not None:
            stale = [t for t in tokens
                     if not any(same_token(t.text, g) for g in configured.generated)]
        parts: list[str] = []
        if missing:
            ev["pending"] = " ".join(t.text for t in missing)
            ev["pending_sources"] = " ".join(sorted({t.source.where for t in missing}))
            parts.append("configured but not booted: " + ", ".join(
                f"{t.text} ({t.source.where})" for t in missing[:8]))
        if dropped:
            ev["dropped"] = " ".join(dropped)
            parts.append("booted but no longer configured (the next boot drops them): "
                         + ", ".join(dropped[:8]))
        if stale and configured.regenerate:
            ev["stale"] = " ".join(t.text for t in stale)
            ev["generated_file"] = configured.generated_file
            parts.append(f"{configured.generated_file} was not regenerated since "
                         f"(it lacks {', '.join(t.text for t in stale[:8])}): run "
                         + " ".join(configured.regenerate))
        if configured.grub_only:
            ev["grub_only"] = " ".join(t.text for t in configured.grub_only)
            parts.append("set in /etc/default/grub but not in the boot entry of " + release
                         + ": " + ", ".join(t.text for t in configured.grub_only[:8])
                         + " (grubby --update-kernel=ALL --args=...)")
        if configured.regenerate:
            ev["regenerate"] = " ".join(configured.regenerate)
        if not parts:
            return self.passed(
                "cmdline", f"the running kernel was booted with the {configured.loader} "
                f"configuration ({len(tokens)} configured token(s), all on /proc/cmdline)",
                observed=" ".join(live)[:512], expected=" ".join(t.text for t in tokens)[:512],
                evidence=ev)
        return self.warned(
            "cmdline",
            "reboot pending: " + "; ".join(parts) + f"; the next boot starts {release}",
            observed=" ".join(live)[:512], expected=" ".join(t.text for t in tokens)[:512],
            fix="reboot" if not stale else f"{' '.join(configured.regenerate)}, then reboot",
            evidence=ev)

    # -- tokens that do nothing -------------------------------------------------------------

    def _tokens(self, configured: Configured | None, live: list[str], line_name: str
                ) -> Finding:
        configured_tokens = [t.text for t in configured.tokens] if configured else []
        ev = {"kernel_line": line_name}
        found = lint(configured_tokens, line_name) if configured else []
        where = {t.text: t.source.where for t in (configured.tokens if configured else ())}
        if configured is None:
            found = lint(live, line_name)
        if not found:
            return self.passed("tokens", "no ineffective or contradictory boot parameter "
                               f"configured ({len(configured_tokens or live)} token(s))",
                               evidence=ev)
        for index, problem in enumerate(found[:16]):
            ev[f"problem{index}"] = problem.token
            ev[f"problem{index}_why"] = problem.why
            ev[f"problem{index}_where"] = where.get(problem.token, PROC_CMDLINE)
            if problem.replacement is not None:
                ev[f"problem{index}_fix"] = " ".join(problem.replacement) or "(remove)"
        return self.warned(
            "tokens",
            "; ".join(f"{p.token} ({where.get(p.token, PROC_CMDLINE)}): {p.why}"
                      for p in found[:6]),
            observed=" ".join(p.token for p in found)[:512],
            expected="no ineffective boot parameter", evidence=ev)

    # -- the fix -----------------------------------------------------------------------------

    def remediate(
        self, host: Host, findings: Sequence[Finding], context: FixContext
    ) -> list[Remedy]:
        """Rewrite ineffective tokens where they are configured; say how to boot what is set."""
        from auditor.remedy import Advice, Remedy, evidence
        remedies: list[Remedy] = []
        for finding in findings:
            ev = evidence(finding)
            if finding.subject == "tokens":
                remedy = self._fix_tokens(host, ev, context)
                if remedy is not None:
                    remedies.append(remedy)
            elif finding.subject == "cmdline":
                advice: list[Advice] = []
                regenerate = tuple(ev.get("regenerate", "").split())
                if ev.get("stale") and regenerate and regenerate[0] != "grubby":
                    advice.append(Advice(f"{ev.get('generated_file', 'the loader config')} "
                                         "is stale: regenerate it", regenerate))
                if ev.get("grub_only"):
                    advice.append(Advice(
                        "write the parameters into the boot entries (BLS)",
                        ("grubby", "--update-kernel=ALL", "--args=" + ev["grub_only"])))
                advice.append(Advice(f"reboot into {ev.get('next_boot', 'the next kernel')} "
                                     "to boot with the configured command line"))
                remedies.append(Remedy(
                    check=self.id, subject="cmdline",
                    title="boot parameters configured but not booted",
                    advice=tuple(advice), reboot=True,
                    notes=(f"pending: {ev['pending']}",) if ev.get("pending") else (),
                ))
        return remedies

    def _fix_tokens(self, host: Host, ev: dict[str, str], context: FixContext
                    ) -> Remedy | None:
        from auditor.remedy import Advice, Remedy, ReplaceLine, RunCommand
        configured = bootloader.next_boot(host).configured
        if configured is None:
            return Remedy(check=self.id, subject="tokens", title="ineffective boot parameters",
                          notes=("no boot loader configuration was found: change the "
                                 "parameters where your boot loader keeps them",))
        line_name = ev.get("kernel_line", "")
        problems = lint([t.text for t in configured.tokens], line_name)
        edits: dict[tuple[str, int], tuple[str, dict[str, list[str]]]] = {}
        notes: list[str] = []
        for problem in problems:
            holders = [t for t in configured.tokens if t.text == problem.token]
            if problem.replacement is None:
                notes.append(f"{problem.token}: {problem.why}: choose by hand")
                continue
            for token in holders:
                key = (token.source.path, token.source.line)
                edits.setdefault(key, (token.source.variable, {}))[1][token.text] = list(
                    problem.replacement)
        steps: list[Step] = []
        for (path, line), (variable, changes) in edits.items():
            raw = bootloader.raw_line(host, path, line) if line else None
            new = bootloader.rewrite_line(raw, variable, changes) if raw is not None else None
            if new is None:
                notes.append(f"{path}:{line}: rewrite {', '.join(changes)} by hand")
            elif new != raw:
                steps.append(ReplaceLine(host.resolve(path), line, raw or "", new))
        if steps and configured.regenerate and configured.regenerate[0] != "grubby":
            steps.append(RunCommand(configured.regenerate, after=tuple(range(len(steps))),
                                    undo=configured.regenerate))
        elif steps and configured.loader == "bls":
            notes.append("the boot entries were edited in place (what grubby does)")
        return Remedy(
            check=self.id, subject="tokens", title="rewrite ineffective boot parameters",
            persistent=tuple(steps), notes=tuple(notes), reboot=bool(steps),
            advice=(Advice("reboot to boot with the corrected command line"),) if steps else (),
        )
