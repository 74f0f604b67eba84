"""The remedy model: fix steps as structured values, never pre-formatted shell.

A check's ``remediate`` turns its findings into :class:`Remedy` values. Each step
is a frozen dataclass naming what to change (a kernel value, a PCI register, a
file, a line of a file); the fix and rollback templates turn them into shell,
quoting every value. Every step kind has a fixed inverse the
rollback performs from what the fix recorded before changing anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from auditor.model import Finding

#: What every fix reads besides its checks' paths: the host's identity, which the
#: scripts check before they change anything, and the distribution.
GUARD_READS: tuple[str, ...] = ("/proc/sys/kernel/hostname", "/etc/hostname",
                                "/etc/machine-id", "/etc/os-release")


@dataclass(frozen=True)
class Verbs:
    """How both fix engines apply and undo one step kind: the one description of it.

    ``fix`` and ``undo`` name the function of the booted machine's bash scripts
    (``templates/fix.sh.j2``, ``templates/rollback.sh.j2``) and the method of the sysroot
    engine (``auditor/shipped/sysroot_fix.py``, prefixed ``step_``); ``fix_args`` and
    ``undo_args`` the step's fields each bash function takes after the step's id, in order
    (the sysroot engine reads them by name from the plan). A kind without either fails the
    per-check contract, which runs every fixable case through both engines.
    """

    fix: str
    fix_args: tuple[str, ...]
    undo: str
    undo_args: tuple[str, ...]


@dataclass(frozen=True)
class SetValue:
    """Write a value to a kernel file (sysfs, /proc/sys); the old bytes are recorded first."""

    kind: ClassVar[str] = "set_value"
    verbs: ClassVar[Verbs] = Verbs("set_value", ("path", "value", "sysctl"),
                                   "restore_value", ("path", "sysctl"))
    path: str
    value: str
    #: On a live host, write it with ``sysctl -w KEY=VALUE`` instead of the file.
    sysctl: str = ""


@dataclass(frozen=True)
class SetSelector:
    """Select ``value`` in a selector file (``always [madvise] never``); the word selected
    before is recorded first, and the rollback selects it again.

    A kernel attribute that offers a choice shows every word and brackets the one in force;
    it takes one word, and answers the whole line written back with EINVAL. The step
    compares the selected word (:func:`auditor.parsing.parse_selector`), refuses a word
    the file does not offer, writes the word and reads the selection back.
    """

    kind: ClassVar[str] = "set_selector"
    verbs: ClassVar[Verbs] = Verbs("set_selector", ("path", "value"),
                                   "restore_selector", ("path",))
    path: str
    value: str


#: Fields of the PCIe Device Control register (PCI Express capability + 0x08) that hold a
#: size as 128 << value, by (register, mask): the name a log line gives them, and their
#: shift (PCI Express Base Specification, Device Control Register: Max_Payload_Size is
#: bits 7:5, Max_Read_Request_Size bits 14:12).
PCI_SIZE_FIELDS: dict[tuple[str, str], tuple[str, int]] = {
    ("CAP_EXP+08.w", "7000"): ("MaxReadReq", 12),
    ("CAP_EXP+08.w", "00e0"): ("MaxPayload", 5),
}


@dataclass(frozen=True)
class SetPciBits:
    """Read-modify-write some bits of a PCI config register with setpci, then read back."""

    kind: ClassVar[str] = "set_pci_bits"
    verbs: ClassVar[Verbs] = Verbs(
        "set_pci_bits", ("address", "register", "value", "mask", "field_name", "field_shift"),
        "restore_pci_bits", ("address", "register", "mask"))
    address: str
    register: str
    value: str
    mask: str

    @property
    def field(self) -> tuple[str, int] | None:
        """Return (name, shift) when the bits are a known size field, else None."""
        return PCI_SIZE_FIELDS.get((self.register, self.mask.lower().zfill(4)))

    @property
    def field_name(self) -> str:
        """Return the size field's name, or "" where the bits are no known size field."""
        field = self.field
        return "" if field is None else field[0]

    @property
    def field_shift(self) -> str:
        """Return the size field's shift, or "" where the bits are no known size field."""
        field = self.field
        return "" if field is None else str(field[1])


@dataclass(frozen=True)
class WriteFile:
    """Make a file hold exactly ``content`` (created with ``mode`` if missing)."""

    kind: ClassVar[str] = "write_file"
    verbs: ClassVar[Verbs] = Verbs("write_file", ("path", "mode", "content"),
                                   "restore_file", ("path",))
    path: str
    content: str
    mode: str = "0644"


@dataclass(frozen=True)
class ReplaceLine:
    """Replace line ``line`` of a file, only while it still reads exactly ``old``."""

    kind: ClassVar[str] = "replace_line"
    verbs: ClassVar[Verbs] = Verbs("replace_line", ("path", "line", "old", "new"),
                                   "restore_file", ("path",))
    path: str
    line: int
    old: str
    new: str


@dataclass(frozen=True)
class InsertLine:
    """Insert ``text`` after line ``after`` (0: at the top) while that line reads ``anchor``."""

    kind: ClassVar[str] = "insert_line"
    verbs: ClassVar[Verbs] = Verbs("insert_line", ("path", "after", "anchor", "text"),
                                   "restore_file", ("path",))
    path: str
    after: int
    anchor: str
    text: str


@dataclass(frozen=True)
class AppendLine:
    """Append ``text`` as a line to a file unless a line already reads exactly that."""

    kind: ClassVar[str] = "append_line"
    verbs: ClassVar[Verbs] = Verbs("append_line", ("path", "text"), "restore_file", ("path",))
    path: str
    text: str


@dataclass(frozen=True)
class MakeSymlink:
    """Create a symlink (enabling a systemd unit) unless it already points there."""

    kind: ClassVar[str] = "make_symlink"
    verbs: ClassVar[Verbs] = Verbs("make_symlink", ("path", "target"),
                                   "remove_symlink", ("path",))
    path: str
    target: str


@dataclass(frozen=True)
class RunCommand:
    """Run a command on a live host after some steps changed something (never on a sysroot).

    ``after`` names steps by their index in the same remedy's persistent steps;
    ``undo`` runs in the rollback after those steps were restored.
    """

    kind: ClassVar[str] = "run_command"
    argv: tuple[str, ...]
    after: tuple[int, ...] = ()
    undo: tuple[str, ...] = ()
    #: Skip with a note where the command is not installed, instead of failing.
    optional: bool = False


Step = (SetValue | SetSelector | SetPciBits | WriteFile | ReplaceLine | InsertLine | AppendLine
        | MakeSymlink | RunCommand)

#: The step kinds that change a file or a register, in both engines, by kind.
CHANGES: dict[str, type[SetValue | SetSelector | SetPciBits | WriteFile | ReplaceLine
                         | InsertLine | AppendLine | MakeSymlink]] = {
    cls.kind: cls for cls in (SetValue, SetSelector, SetPciBits, WriteFile, ReplaceLine,
                              InsertLine, AppendLine, MakeSymlink)}


def verb_args(step: object, names: tuple[str, ...]) -> tuple[str, ...]:
    """Return the values of a step's fields, as text, in the order a bash verb takes them."""
    return tuple(str(getattr(step, name)) for name in names)


def describe(step: Step) -> str:
    """Return one line saying what a step makes true (paths and values as they are)."""
    if isinstance(step, SetValue):
        return f"{step.path} = {step.value}" + (f" (sysctl {step.sysctl})" if step.sysctl else "")
    if isinstance(step, SetSelector):
        return f"{step.path}: select {step.value}"
    if isinstance(step, SetPciBits):
        field = step.field
        if field is not None:
            size = 128 << ((int(step.value, 16) >> field[1]) & 7)
            return f"{step.address} {field[0]} -> {size} bytes"
        return f"{step.address} {step.register} bits {step.mask} = {step.value}"
    if isinstance(step, WriteFile):
        lines = step.content.count("\n") or 1
        return f"{step.path}: write {lines} line(s), mode {step.mode}"
    if isinstance(step, ReplaceLine):
        return f"{step.path}:{step.line}: {step.old} -> {step.new}"
    if isinstance(step, InsertLine):
        return f"{step.path}:{step.after + 1}: add {step.text}"
    if isinstance(step, AppendLine):
        return f"{step.path}: add {step.text}"
    if isinstance(step, MakeSymlink):
        return f"{step.path} -> {step.target} (symlink)"
    return "run " + " ".join(step.argv)


@dataclass(frozen=True)
class Advice:
    """A command the operator runs by hand (written commented out), with why."""

    text: str
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Remedy:
    """How to fix one problem: now, across reboots, and how to undo it."""

    check: str
    subject: str
    title: str
    runtime: tuple[Step, ...] = ()
    persistent: tuple[Step, ...] = ()
    #: Kernel parameters (``key=value``) the boot command line must carry; the
    #: plan merges them from every remedy into one edit of the boot configuration.
    boot_params: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    advice: tuple[Advice, ...] = ()
    reboot: bool = False

    @property
    def rollback(self) -> tuple[Step, ...]:
        """Return the steps the rollback undoes, in the order it undoes them."""
        return tuple(reversed((*self.runtime, *self.persistent)))


@dataclass(frozen=True)
class FixContext:
    """What a remediation knows besides its findings and its check's options."""

    #: True when the target is a sysroot directory, not a booted machine.
    sysroot: bool
    os_release: Mapping[str, str] = field(default_factory=dict)


def evidence(finding: Finding) -> dict[str, str]:
    """Return a finding's evidence as a dict."""
    return dict(finding.evidence)
