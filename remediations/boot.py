"""The boot command line: where this host keeps it, and the edit that adds parameters.

Detected through the Host seam: ``/etc/kernel/cmdline`` with proxmox-boot-tool
(systemd-boot), ``/etc/default/grub`` (and ``/etc/default/grub.d/*.cfg``, sourced
after it) with update-grub, grub2-mkconfig or grubby (or proxmox-boot-tool where
it keeps GRUB on several disks), or a plain ``/etc/kernel/cmdline``. A Proxmox
host with both files boots from the one its running kernel came through: GRUB
puts ``BOOT_IMAGE=`` on the command line, systemd-boot does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from auditor.hosts.base import Host
from auditor.parsing import kernel_cmdline_params
from auditor.remediations.steps import AppendLine, Remedy, ReplaceLine, RunCommand, Step

GRUB_DEFAULT = "/etc/default/grub"
GRUB_DROP_INS = "/etc/default/grub.d/*.cfg"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
PROXMOX_BOOT_UUIDS = "/etc/kernel/proxmox-boot-uuids"
GRUB_VARIABLE = "GRUB_CMDLINE_LINUX_DEFAULT"

#: What planning a boot command line edit reads (every fix may need one).
BOOT_READS: tuple[str, ...] = (GRUB_DEFAULT, GRUB_DROP_INS, KERNEL_CMDLINE, PROXMOX_BOOT_UUIDS,
                               "/proc/cmdline")

_GRUB_LINE = re.compile(
    r"^(?P<head>\s*(?:export\s+)?" + GRUB_VARIABLE + r"=)"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"']*)(?P=q)|(?P<bare>[^\s\"'#;]*))(?P<tail>.*)$"
)


def merge_params(tokens: Sequence[str], params: Sequence[str]) -> list[str]:
    """Return command-line tokens with each ``key=value`` set, replacing another value of key."""
    merged = list(tokens)
    for param in params:
        key = param.partition("=")[0]
        hits = [i for i, tok in enumerate(merged) if tok.partition("=")[0] == key]
        if hits:
            for index in hits:
                merged[index] = param
        else:
            merged.append(param)
    return merged


def _family(os_release: Mapping[str, str]) -> str:
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    if ids & {"debian", "ubuntu"}:
        return "debian"
    if ids & {"rhel", "fedora", "centos", "rocky", "almalinux", "ol"}:
        return "rhel"
    return ""


def _grub_setter(host: Host) -> tuple[str, int, str, re.Match[str]] | None:
    """Return the last assignment of the variable grub-mkconfig sees: (path, line, raw, match)."""
    found: tuple[str, int, str, re.Match[str]] | None = None
    for path in [GRUB_DEFAULT, *host.glob(GRUB_DROP_INS)]:
        try:
            text = host.read_text(path)
        except OSError:
            continue
        for number, raw in enumerate(text.split("\n"), start=1):
            match = _GRUB_LINE.match(raw)
            if match:
                found = (path, number, raw, match)
    return found


def boot_remedy(host: Host, params: Sequence[str], os_release: Mapping[str, str]) -> Remedy:
    """Return the remedy that puts ``params`` on the boot command line of this host."""
    params = list(dict.fromkeys(params))
    title = "kernel parameters " + " ".join(params)
    steps: list[Step] = []
    notes: list[str] = []
    family = _family(os_release)
    proxmox = host.exists(PROXMOX_BOOT_UUIDS)
    grub_booted = "BOOT_IMAGE" in kernel_cmdline_params(host.read_optional("/proc/cmdline") or "")
    if proxmox and host.exists(KERNEL_CMDLINE) and not (grub_booted
                                                         and host.exists(GRUB_DEFAULT)):
        steps += _cmdline_file(host, params)
        if steps:
            steps.append(RunCommand(("proxmox-boot-tool", "refresh"), after=(0,),
                                    undo=("proxmox-boot-tool", "refresh")))
    elif host.exists(GRUB_DEFAULT):
        setter = _grub_setter(host)
        if setter is None:
            steps.append(AppendLine(GRUB_DEFAULT, f'{GRUB_VARIABLE}="{" ".join(params)}"'))
            current: list[str] = []
        else:
            path, number, raw, match = setter
            quote = match.group("q") or '"'
            current = (match.group("quoted") if match.group("q") else match.group("bare")).split()
            merged = merge_params(current, params)
            if merged != current:
                new = f"{match.group('head')}{quote}{' '.join(merged)}{quote}{match.group('tail')}"
                steps.append(ReplaceLine(host.resolve(path), number, raw, new))
        if steps:
            if family == "rhel":
                added = [p for p in params if p.partition("=")[0] not in
                         {t.partition("=")[0] for t in current}]
                steps.append(RunCommand(("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"),
                                        after=(0,), undo=("grub2-mkconfig", "-o",
                                                          "/boot/grub2/grub.cfg")))
                steps.append(RunCommand(
                    ("grubby", "--update-kernel=ALL", "--args=" + " ".join(params)), after=(0,),
                    undo=("grubby", "--update-kernel=ALL", "--remove-args=" + " ".join(added))
                    if added else (),
                    optional=True,
                ))
            elif proxmox:
                # proxmox-boot-tool runs update-grub and copies the result to every ESP.
                steps.append(RunCommand(("proxmox-boot-tool", "refresh"), after=(0,),
                                        undo=("proxmox-boot-tool", "refresh")))
            else:
                steps.append(RunCommand(("update-grub",), after=(0,), undo=("update-grub",)))
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
    return Remedy(
        check="boot",
        subject="cmdline",
        title=title,
        persistent=tuple(steps),
        notes=tuple(notes),
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
