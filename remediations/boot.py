"""The boot command line: where this host keeps it, and the edit that adds parameters.

Every check's boot-time parameters (``Remedy.boot_params``) end up here, merged into one
edit of the boot configuration. Where the host keeps its command line is read with
:mod:`auditor.checks.lib.bootloader`, which ``boot.cmdline`` shares (so the check that
verifies a boot parameter and the fix that writes it agree on where it lives):

- ``/etc/kernel/cmdline`` with proxmox-boot-tool (systemd-boot): a Proxmox host with both
  files boots from the one its running kernel came through: GRUB puts ``BOOT_IMAGE=`` on the
  command line, systemd-boot does not;
- ``/etc/default/grub`` and ``/etc/default/grub.d/*.cfg``, expanded in order as
  grub-mkconfig sources them: a parameter already set on some assignment is changed on that
  line (the drop-in that sets it, not only the last one), a new one is added to the last
  assignment of ``GRUB_CMDLINE_LINUX_DEFAULT``; then update-grub, grub2-mkconfig and grubby
  (BLS entries), or proxmox-boot-tool where it keeps GRUB on several disks;
- a plain ``/etc/kernel/cmdline`` (kernel-install, UKI builders).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from auditor.checks.lib import bootloader
from auditor.checks.lib.bootloader import (
    GRUB_DEFAULT,
    GRUB_DROP_INS,
    KERNEL_CMDLINE,
    PROXMOX_BOOT_UUIDS,
    param_key,
)
from auditor.hosts.base import Host
from auditor.remedy import AppendLine, Remedy, ReplaceLine, RunCommand, Step

__all__ = ["BOOT_READS", "GRUB_DEFAULT", "GRUB_DROP_INS", "GRUB_VARIABLE", "KERNEL_CMDLINE",
           "PROXMOX_BOOT_UUIDS", "boot_remedy", "merge_params"]

GRUB_VARIABLE = "GRUB_CMDLINE_LINUX_DEFAULT"

#: What planning a boot command line edit reads (every fix may need one): the loaders'
#: files, and what says which kernel boots next (:func:`bootloader.next_boot`).
BOOT_READS: tuple[str, ...] = tuple(dict.fromkeys(
    (GRUB_DEFAULT, GRUB_DROP_INS, KERNEL_CMDLINE, PROXMOX_BOOT_UUIDS, "/proc/cmdline",
     *bootloader.NEXT_BOOT_READS)))

def merge_params(tokens: Sequence[str], params: Sequence[str]) -> list[str]:
    """Return command-line tokens with each ``key=value`` set, replacing another value of key."""
    merged = list(tokens)
    for param in params:
        key = param_key(param)
        hits = [i for i, tok in enumerate(merged) if param_key(tok) == key]
        if hits:
            for index in hits:
                merged[index] = param
        else:
            merged.append(param)
    return merged


def _grub_steps(host: Host, params: Sequence[str]) -> tuple[list[Step], list[str], list[str]]:
    """Return the edits of GRUB's defaults, the parameters that were new, and notes."""
    shell = bootloader.expand_grub_defaults(host)
    tokens = [t for name in bootloader.LINUX_VARIABLES for t in shell.variables.get(name, [])]
    # (path, line) -> (variable assigned there, token replacements, tokens to append)
    edits: dict[tuple[str, int], tuple[str, dict[str, list[str]], list[str]]] = {}
    added: list[str] = []
    for param in params:
        hits = [t for t in tokens if t.key == param_key(param)]
        if not hits:
            added.append(param)
        for token in hits:
            if token.text != param:
                where = (token.source.path, token.source.line)
                edits.setdefault(where, (token.source.variable, {}, []))[1][token.text] = [param]
    setter = shell.setters.get(GRUB_VARIABLE)
    if added and setter is not None:
        edits.setdefault((setter[0], setter[1]), (GRUB_VARIABLE, {}, []))[2].extend(added)
    steps: list[Step] = []
    notes: list[str] = []
    for (path, line), (variable, changes, extra) in edits.items():
        raw = bootloader.raw_line(host, path, line)
        new = bootloader.rewrite_line(raw, variable, changes, extra) if raw is not None else None
        if new is None:
            wanted = [w for words in changes.values() for w in words] + extra
            notes.append(f"{path}:{line} is not a plain assignment: set {' '.join(wanted)} "
                         "there by hand")
        elif new != raw:
            steps.append(ReplaceLine(host.resolve(path), line, raw or "", new))
    if added and setter is None:
        steps.append(AppendLine(GRUB_DEFAULT, f'{GRUB_VARIABLE}="{" ".join(added)}"'))
    return steps, added, notes


def boot_remedy(host: Host, params: Sequence[str], os_release: Mapping[str, str]) -> Remedy:
    """Return the remedy that puts ``params`` on the boot command line of this host."""
    params = list(dict.fromkeys(params))
    steps: list[Step] = []
    notes: list[str] = []
    # A parameter the next boot's line already carries (the view boot.cmdline and every
    # check share) is pending a reboot: written again it would be a duplicate.
    nxt = bootloader.next_boot(host)
    if nxt.known:
        pending = [p for p in params if any(bootloader.same_token(p, t) for t in nxt.tokens)]
        for param in pending:
            where = nxt.source(param) or nxt.describe()
            notes.append(f"{param} is already configured for the next boot ({where})"
                         + (": pending a reboot" if nxt.pending(param) else ""))
        params = [p for p in params if p not in pending]
        if not params:
            return Remedy(check="boot", subject="cmdline",
                          title="kernel parameters already configured", notes=tuple(notes),
                          reboot=any(nxt.pending(p) for p in pending))
    title = "kernel parameters " + " ".join(params)
    family = bootloader.family(os_release)
    proxmox = host.exists(PROXMOX_BOOT_UUIDS)
    if bootloader.uses_proxmox_boot_tool(host):
        steps += _cmdline_file(host, params)
        if steps:
            steps.append(RunCommand(("proxmox-boot-tool", "refresh"), after=(0,),
                                    undo=("proxmox-boot-tool", "refresh")))
    elif host.exists(GRUB_DEFAULT):
        steps, added, notes = _grub_steps(host, params)
        if steps:
            after = tuple(range(len(steps)))
            if family == "rhel":
                steps.append(RunCommand(("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"),
                                        after=after, undo=("grub2-mkconfig", "-o",
                                                           "/boot/grub2/grub.cfg")))
                steps.append(RunCommand(
                    ("grubby", "--update-kernel=ALL", "--args=" + " ".join(params)),
                    after=after,
                    undo=("grubby", "--update-kernel=ALL", "--remove-args=" + " ".join(added))
                    if added else (),
                    optional=True,
                ))
            elif proxmox:
                # proxmox-boot-tool runs update-grub and copies the result to every ESP.
                steps.append(RunCommand(("proxmox-boot-tool", "refresh"), after=after,
                                        undo=("proxmox-boot-tool", "refresh")))
            else:
                steps.append(RunCommand(("update-grub",), after=after, undo=("update-grub",)))
                if family != "debian":
                    notes.append("update-grub is the Debian name: regenerate grub.cfg with "
                                 "this distribution's tool if it is missing")
    elif host.exists(KERNEL_CMDLINE):
        steps += _cmdline_file(host, params)
        if steps:
            notes.append(f"{KERNEL_CMDLINE} changed: rebuild the boot entries or unified kernel "
                         "images (kernel-install, your UKI tooling) before the next boot")
    else:
        notes.append("no /etc/default/grub or /etc/kernel/cmdline found: add "
                     + " ".join(params) + " to the boot loader's kernel command line by hand")
    if steps:
        notes.append("the parameters take effect at the next boot; until then boot.cmdline "
                     "reports them as pending a reboot")
    return Remedy(
        check="boot",
        subject="cmdline",
        title=title,
        persistent=tuple(steps),
        notes=tuple(notes),
        reboot=bool(steps),
    )


def _cmdline_file(host: Host, params: Sequence[str]) -> list[Step]:
    try:
        text = host.read_text(KERNEL_CMDLINE)
    except OSError:
        return []
    first = text.split("\n", 1)[0]
    tokens = first.split()
    merged = merge_params(tokens, params)
    if merged == tokens or "\ufffd" in first:
        return []
    return [ReplaceLine(host.resolve(KERNEL_CMDLINE), 1, first, " ".join(merged))]
