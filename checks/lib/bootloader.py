"""The kernel command line the boot loader is configured to pass, and where each token is set.

:func:`next_boot` is the one view of the next boot: the kernel that boots next
(kernels.next_boot: a pin, grubenv's saved_entry, else the newest installed), that kernel's
configured line, and the running one, computed once per host (``host.fact``). Every check
that judges a boot parameter at the next boot reads it there (``boot.cmdline``,
``iommu.mode``, ``pcie.acs``, ``cpu.cstates``, ``cpu.isolation``, ``numa.balancing``), and so
does ``remediations/boot.py``, which writes no parameter the next boot already carries. What
each boot loader reads:

- GRUB: ``grub-mkconfig`` sources ``/etc/default/grub``, then each
  ``/etc/default/grub.d/*.cfg`` in glob order (Debian's grub-mkconfig), and ``10_linux``
  writes ``${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}`` on each normal entry's
  ``linux`` line. The files are shell: an assignment may extend a variable
  (``GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"``). They are expanded here in order
  *without being run*: assignments with ``$VAR``, ``${VAR}``, ``${VAR:-x}``, ``${VAR:+x}`` and
  quotes are followed; a line that is not a plain assignment (``if``, a command, ``$(...)``)
  is not, and is listed in :attr:`Configured.unexpanded`.
- BLS (RHEL, Fedora, grubby): each ``/boot/loader/entries/*.conf`` carries its own
  ``options`` lines, combined in order (Boot Loader Specification, "options"), so the line
  is per kernel: the next kernel's entry, not the running one's; ``$kernelopts`` and
  ``$tuned_params`` in it come from grubenv.
- proxmox-boot-tool (systemd-boot on ZFS), kernel-install and UKI builders read
  ``/etc/kernel/cmdline``.
- tuned's bootloader plugin keeps its parameters in ``/etc/tuned/bootcmdline``
  (``TUNED_BOOT_CMDLINE``) and reaches the boot line through ``$tuned_params`` (grubenv and
  BLS entries, or ``/etc/grub.d/00_tuned`` on GRUB) — redhat-performance/tuned
  plugin_bootloader.py and consts.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from auditor.checks.lib import files, kernels
from auditor.hosts.base import Host
from auditor.parsing import kernel_cmdline_params, lazy_re, parse_os_release

GRUB_DEFAULT = "/etc/default/grub"
GRUB_DROP_INS = "/etc/default/grub.d/*.cfg"
GRUB_CFGS = ("/boot/grub/grub.cfg", "/boot/grub2/grub.cfg")
GRUBENVS = ("/boot/grub2/grubenv", "/boot/grub/grubenv")
GRUB_TUNED_SCRIPT = "/etc/grub.d/00_tuned"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
PROXMOX_BOOT_UUIDS = "/etc/kernel/proxmox-boot-uuids"
BLS_ENTRIES = "/boot/loader/entries/*.conf"
TUNED_BOOTCMDLINE = "/etc/tuned/bootcmdline"
PROC_CMDLINE = "/proc/cmdline"
LINUX_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")

#: Every path :func:`configured` reads.
READS: tuple[str, ...] = (GRUB_DEFAULT, GRUB_DROP_INS, *GRUB_CFGS, *GRUBENVS, GRUB_TUNED_SCRIPT,
                          KERNEL_CMDLINE, PROXMOX_BOOT_UUIDS, BLS_ENTRIES, TUNED_BOOTCMDLINE,
                          PROC_CMDLINE, "/etc/os-release")

_MAX_LINES = 2048
_MAX_LINE = 4096
_MAX_TOKENS = 512
_NAME = lazy_re(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_BACKSLASH = lazy_re(r"\\(.)")
_ASSIGNMENT = lazy_re(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]{0,63})=")


class Source(NamedTuple):
    """Where a configured token is written: a file and line (0: a whole file)."""

    path: str
    line: int
    #: The variable or key that carries it (``GRUB_CMDLINE_LINUX``, ``options``...).
    variable: str = ""

    @property
    def where(self) -> str:
        """Return ``path:line`` (or the path alone)."""
        return f"{self.path}:{self.line}" if self.line else self.path


class Token(NamedTuple):
    """One token of a configured command line and the line that wrote it."""

    text: str
    source: Source

    @property
    def key(self) -> str:
        """Return the parameter name as the kernel compares it (``-`` is ``_``)."""
        return param_key(self.text)


def param_key(token: str) -> str:
    """Return a token's parameter name, dashes as underscores (the kernel's ``parameq``)."""
    return token.partition("=")[0].replace("-", "_")


def same_token(a: str, b: str) -> bool:
    """Return whether two tokens set the same parameter to the same value."""
    return param_key(a) == param_key(b) and a.partition("=")[1:] == b.partition("=")[1:]


# -- shell expansion of GRUB's defaults, without running them ------------------------------

Piece = tuple[str, Source | None]


class _Unexpandable(ValueError):
    """A value uses shell the expander does not follow (command substitution, arithmetic)."""


def _lookup(variables: Mapping[str, list[Token]], name: str) -> list[Token]:
    return variables.get(name, [])


def _tokens_text(tokens: Sequence[Token]) -> str:
    return " ".join(t.text for t in tokens)


def _expand_braced(body: str, variables: Mapping[str, list[Token]], here: Source,
                   depth: int) -> list[Piece]:
    name_match = _NAME.match(body)
    if name_match is None:
        raise _Unexpandable(body)
    name = name_match.group(0)
    rest = body[name_match.end():]
    value = _lookup(variables, name)
    if not rest:
        return _variable(value)
    for operator in (":-", ":+", "-", "+"):
        if rest.startswith(operator):
            word = rest[len(operator):]
            is_set = bool(value) if operator.startswith(":") else name in variables
            use_word = (not is_set) if operator.endswith("-") else is_set
            if operator.endswith("-") and is_set:
                return _variable(value)
            if use_word:
                return _expand(word, variables, here, depth + 1, quoted=True)
            return []
    raise _Unexpandable(body)


def _expand(text: str, variables: Mapping[str, list[Token]], here: Source, depth: int = 0,
            quoted: bool = False) -> list[Piece]:
    """Expand one shell word (quotes, $VAR, ${VAR...}) into pieces of text and their source."""
    return _expand_word(text, variables, here, depth, quoted)[0]


def _expand_word(text: str, variables: Mapping[str, list[Token]], here: Source, depth: int,
                 quoted: bool) -> tuple[list[Piece], int]:
    """Expand one shell word; return its pieces and the index where the word ended."""
    if depth > 4:
        raise _Unexpandable(text)
    pieces: list[Piece] = []
    index, size = 0, len(text)
    in_double = quoted
    while index < size:
        char = text[index]
        if char == "'" and not in_double:
            end = text.find("'", index + 1)
            if end < 0:
                raise _Unexpandable(text)
            pieces.append((text[index + 1:end], here))
            index = end + 1
        elif char == '"':
            in_double = not in_double
            index += 1
        elif char == "\\" and index + 1 < size:
            # Outside and inside quotes alike the character is kept without its backslash:
            # what GRUB's script passes to the kernel (``\;`` reaches it as ``;``).
            pieces.append((text[index + 1], here))
            index += 2
        elif char == "`":
            raise _Unexpandable(text)
        elif char == "$":
            following = text[index + 1:index + 2]
            if following == "{":
                end = text.find("}", index + 2)
                if end < 0:
                    raise _Unexpandable(text)
                pieces.extend(_expand_braced(text[index + 2:end], variables, here, depth))
                index = end + 1
            elif following == "(":
                raise _Unexpandable(text)
            else:
                match = _NAME.match(text, index + 1)
                if match is None:
                    pieces.append(("$", here))
                    index += 1
                    continue
                pieces.extend(_variable(_lookup(variables, match.group(0))))
                index = match.end()
        elif not in_double and char.isspace():
            break
        elif not in_double and char in ";#&|<>":
            break
        else:
            pieces.append((char, here))
            index += 1
    if in_double and not quoted:
        raise _Unexpandable(text)
    return pieces, index


def _split(pieces: Sequence[Piece]) -> list[Token]:
    """Split expanded pieces into tokens; a token glued across pieces takes the later source."""
    tokens: list[Token] = []
    current: list[str] = []
    source: Source | None = None
    for text, where in pieces:
        for char in text:
            if char.isspace():
                if current and source is not None:
                    tokens.append(Token("".join(current), source))
                current, source = [], None
            else:
                current.append(char)
                source = where if where is not None else source
    if current and source is not None:
        tokens.append(Token("".join(current), source))
    return tokens[:_MAX_TOKENS]


def _variable(tokens: Sequence[Token]) -> list[Piece]:
    """Return a variable's value as pieces: its tokens with their sources, space-separated."""
    pieces: list[Piece] = []
    for index, token in enumerate(tokens):
        if index:
            pieces.append((" ", None))
        pieces.append((token.text, token.source))
    return pieces


@dataclass
class ShellDefaults:
    """The variables of GRUB's default files after expanding them in order."""

    variables: dict[str, list[Token]] = field(default_factory=dict)
    #: The last assignment of each variable: (path, line number, raw line).
    setters: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: Lines that mention a command-line variable but are not plain assignments.
    unexpanded: list[str] = field(default_factory=list)


def _logical(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.split("\n")[:_MAX_LINES], start=1):
        raw = raw[:_MAX_LINE]
        if not pending:
            start = number
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            pending += raw[:-1]
            continue
        lines.append((start, pending + raw))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


def grub_files(host: Host) -> list[str]:
    """Return the files grub-mkconfig sources, in order."""
    files = [GRUB_DEFAULT] if host.exists(GRUB_DEFAULT) else []
    files += sorted(host.glob(GRUB_DROP_INS))[:128]
    return files


def expand_grub_defaults(host: Host) -> ShellDefaults:
    """Expand /etc/default/grub and its drop-ins in order, as sourcing them would, unrun."""
    result = ShellDefaults()
    for path in grub_files(host):
        text = files.read_text(host, path, 1 << 20)
        if text is None:
            continue
        result.files.append(path)
        for number, line in _logical(text):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            match = _ASSIGNMENT.match(line)
            if match is None or match.group(1) not in (*LINUX_VARIABLES, "GRUB_DEFAULT"):
                if any(v in line for v in LINUX_VARIABLES):
                    result.unexpanded.append(f"{path}:{number}")
                continue
            name = match.group(1)
            value = line[match.end():]
            here = Source(path, number, name)
            try:
                pieces, end = _expand_word(value, result.variables, here, 0, False)
            except _Unexpandable:
                result.unexpanded.append(f"{path}:{number}")
                continue
            rest = value[end:].strip()
            if rest and not rest.startswith(("#", ";")):
                # "VAR=a b" runs command b with VAR set: not an assignment of the shell.
                result.unexpanded.append(f"{path}:{number}")
                continue
            result.variables[name] = _split(pieces)
            result.setters[name] = (path, number, line)
    return result


# -- what each boot loader passes -----------------------------------------------------------


class Configured(NamedTuple):
    """The command line the next boot gets, as configured, and where it is configured."""

    #: ``grub``, ``bls``, ``proxmox-boot-tool``, ``kernel-install``.
    loader: str
    tokens: tuple[Token, ...]
    #: The command that writes the configuration where the loader reads it (argv), or ().
    regenerate: tuple[str, ...] = ()
    #: Lines that may change the line but were not expanded.
    unexpanded: tuple[str, ...] = ()
    #: The files the configuration is read from.
    files: tuple[str, ...] = ()
    #: For GRUB, the tokens grub.cfg's entry for the next kernel carries (None: unreadable).
    generated: tuple[str, ...] | None = None
    generated_file: str = ""
    #: Tokens configured in /etc/default/grub that a BLS host's entries lack.
    grub_only: tuple[Token, ...] = ()


def family(os_release: Mapping[str, str]) -> str:
    """Return ``debian``, ``rhel`` or "" from os-release."""
    ids = {os_release.get("ID", ""), *os_release.get("ID_LIKE", "").split()}
    if ids & {"debian", "ubuntu"}:
        return "debian"
    if ids & {"rhel", "fedora", "centos", "rocky", "almalinux", "ol"}:
        return "rhel"
    return ""


def booted_through_grub(host: Host) -> bool:
    """Return whether the running kernel came through GRUB (it adds ``BOOT_IMAGE=``)."""
    return "BOOT_IMAGE" in kernel_cmdline_params(files.read_optional(host, PROC_CMDLINE) or "")


def uses_proxmox_boot_tool(host: Host) -> bool:
    """Return whether proxmox-boot-tool boots this host through systemd-boot."""
    return (host.exists(PROXMOX_BOOT_UUIDS) and host.exists(KERNEL_CMDLINE)
            and not (booted_through_grub(host) and host.exists(GRUB_DEFAULT)))


def _words(text: str, source: Source) -> list[Token]:
    return [Token(w, source) for w in text.split()[:_MAX_TOKENS]]


def kernel_cmdline_tokens(host: Host) -> list[Token] | None:
    """Return /etc/kernel/cmdline's tokens (the whole file, as kernel-install reads it)."""
    text = files.read_optional(host, KERNEL_CMDLINE)
    if text is None:
        return None
    tokens: list[Token] = []
    for number, line in enumerate(text.split("\n")[:64], start=1):
        tokens += _words(line[:_MAX_LINE], Source(KERNEL_CMDLINE, number, "cmdline"))
    return tokens


def tuned_tokens(host: Host) -> list[Token]:
    """Return tuned's boot parameters (``TUNED_BOOT_CMDLINE`` in /etc/tuned/bootcmdline)."""
    for number, line in enumerate((files.read_optional(host, TUNED_BOOTCMDLINE) or "")
                                  .split("\n")[:64], start=1):
        key, sep, value = line.strip().partition("=")
        if sep and key == "TUNED_BOOT_CMDLINE":
            return _words(value.strip().strip("\"'")[:_MAX_LINE],
                          Source(TUNED_BOOTCMDLINE, number, "TUNED_BOOT_CMDLINE"))
    return []


def _grubenv(host: Host) -> dict[str, str]:
    for path in GRUBENVS:
        text = files.read_optional(host, path)
        if text is None:
            continue
        values: dict[str, str] = {}
        for line in text.split("\n")[:64]:
            key, sep, value = line.partition("=")
            if sep and _NAME.fullmatch(key):
                values[key] = value[:_MAX_LINE]
        return values
    return {}


def bls_entries(host: Host, release: str) -> tuple[str, list[tuple[int, str]]] | None:
    """Return the BLS entry that boots ``release``: its path and every ``options`` line
    (line number, text), in order.

    The Boot Loader Specification (uapi-group.org/specifications/specs/
    boot_loader_specification, "options"): the key "may appear more than once in which case
    all specified parameters are combined in the order they are listed".
    """
    for path in host.glob(BLS_ENTRIES)[:256]:
        text = files.read_optional(host, path) or ""
        linux = ""
        options: list[tuple[int, str]] = []
        for number, line in enumerate(text.split("\n")[:256], start=1):
            key, _, value = line.strip().partition(" ")
            if key == "linux":
                linux = value.strip()
            elif key == "options":
                options.append((number, value.strip()[:_MAX_LINE]))
        if options and linux.rsplit("/", 1)[-1] == f"vmlinuz-{release}":
            return path, options[:16]
    return None


def bls_entry(host: Host, release: str) -> tuple[str, int, str] | None:
    """Return the BLS entry that boots ``release``: (path, last options line number, the
    options of every line joined)."""
    found = bls_entries(host, release)
    if found is None:
        return None
    path, options = found
    return path, options[-1][0], " ".join(text for _, text in options)


def _bls_tokens(host: Host, release: str) -> list[Token] | None:
    found = bls_entries(host, release)
    if found is None:
        return None
    path, lines = found
    env = _grubenv(host)
    tokens: list[Token] = []
    for number, options in lines:
        for word in options.split()[:_MAX_TOKENS]:
            if word.startswith("$"):
                name = word[1:].strip("{}")
                if name == "tuned_params" and not env.get(name):
                    tokens += tuned_tokens(host)
                else:
                    tokens += _words(env.get(name, ""), Source(GRUBENVS[0], 0, name))
            else:
                tokens.append(Token(word, Source(path, number, "options")))
    return tokens[:_MAX_TOKENS]


def grub_cfg_tokens(host: Host, release: str) -> tuple[str, tuple[str, ...] | None]:
    """Return (file, tokens) of grub.cfg's first ``linux`` line booting ``release``."""
    for path in GRUB_CFGS:
        text = files.read_text(host, path, 4 << 20)
        if text is None:
            continue
        for line in text.split("\n")[:200000]:
            words = line.strip()[:_MAX_LINE].split()
            if len(words) >= 2 and words[0] in ("linux", "linux16", "linuxefi") and \
                    words[1].rsplit("/", 1)[-1] == f"vmlinuz-{release}":
                # GRUB's script drops a backslash before a character (``\;`` passes ``;``).
                return path, tuple(_BACKSLASH.sub(r"\1", w) for w in words[2:_MAX_TOKENS])
        return path, None
    return "", None


def configured(host: Host, release: str, os_release: Mapping[str, str]) -> Configured | None:
    """Return the command line the boot of kernel ``release`` is configured with, or None."""
    kind = family(os_release)
    if uses_proxmox_boot_tool(host):
        tokens = kernel_cmdline_tokens(host) or []
        return Configured("proxmox-boot-tool", tuple(tokens), ("proxmox-boot-tool", "refresh"),
                          files=(KERNEL_CMDLINE,))
    grub = expand_grub_defaults(host) if host.exists(GRUB_DEFAULT) else None
    grub_tokens: list[Token] = []
    if grub is not None:
        for name in LINUX_VARIABLES:
            grub_tokens += grub.variables.get(name, [])
    bls = _bls_tokens(host, release) if kind == "rhel" or not grub else None
    if bls is not None:
        have = {t.text for t in bls}
        missing = tuple(t for t in grub_tokens if t.text not in have)
        return Configured("bls", tuple(bls), ("grubby", "--update-kernel=ALL"),
                          tuple(grub.unexpanded) if grub else (),
                          tuple(sorted({t.source.path for t in bls})), grub_only=missing)
    if grub is not None:
        tokens = list(grub_tokens)
        if host.exists(GRUB_TUNED_SCRIPT):
            tokens += tuned_tokens(host)
        if host.exists(PROXMOX_BOOT_UUIDS):
            regenerate: tuple[str, ...] = ("proxmox-boot-tool", "refresh")
        elif kind == "rhel":
            regenerate = ("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg")
        else:
            regenerate = ("update-grub",)
        cfg, generated = grub_cfg_tokens(host, release)
        return Configured("grub", tuple(tokens), regenerate, tuple(grub.unexpanded),
                          tuple(grub.files), generated, cfg)
    tokens_or_none = kernel_cmdline_tokens(host)
    if tokens_or_none is not None:
        return Configured("kernel-install", tuple(tokens_or_none), (), files=(KERNEL_CMDLINE,))
    return None


# -- editing a configured token where it is written ---------------------------------------

_ASSIGNED_VALUE = lazy_re(
    r"^(?P<head>\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]{0,63})=)"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"']*)(?P=q)|(?P<bare>[^\s\"'#;]*))(?P<tail>.*)$"
)


def rewrite_line(raw: str, variable: str, replace: Mapping[str, Sequence[str]],
                 append: Sequence[str] = ()) -> str | None:
    """Return a configuration line with some tokens replaced (by none, one or more) and others
    appended, or None when the line is not one this can edit safely.

    ``variable`` says what kind of line it is: a shell assignment (``GRUB_CMDLINE_LINUX``,
    ``TUNED_BOOT_CMDLINE``), a BLS ``options`` line, or a ``cmdline`` file's line.
    """
    def edit(words: list[str]) -> list[str]:
        out: list[str] = []
        for word in words:
            out.extend(replace.get(word, [word]))
        out += [p for p in append if p not in out]
        return out

    if variable == "cmdline":
        words = raw.split()
        return " ".join(edit(words)) if edit(words) != words else raw
    if variable == "options":
        key, _, value = raw.strip().partition(" ")
        if key != "options":
            return None
        indent = raw[: len(raw) - len(raw.lstrip())]
        words = value.split()
        return f"{indent}options {' '.join(edit(words))}" if edit(words) != words else raw
    match = _ASSIGNED_VALUE.match(raw)
    if match is None or match.group("name") != variable:
        return None
    quote = match.group("q") or '"'
    value = match.group("quoted") if match.group("q") else match.group("bare")
    words = value.split()
    new = edit(words)
    if new == words:
        return raw
    return f"{match.group('head')}{quote}{' '.join(new)}{quote}{match.group('tail')}"


def raw_line(host: Host, path: str, line: int) -> str | None:
    """Return line ``line`` of a file as written, or None (missing, continued, not UTF-8)."""
    text = files.read_text(host, path)
    if text is None:
        return None
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    raw = lines[line - 1]
    return None if raw.endswith("\\") or "\ufffd" in raw else raw


# -- the next boot, computed once and shared ------------------------------------------------

#: Every path :func:`next_boot` reads: the loaders' files, the kernels, which one boots next.
NEXT_BOOT_READS: tuple[str, ...] = tuple(dict.fromkeys(
    (*READS, *kernels.RELEASE_READS, *kernels.NEXT_BOOT_READS)))


class NextBootLine(NamedTuple):
    """The command line the next boot passes, against the one the running kernel got.

    Every check that judges a boot parameter at the next boot reads it here, so none
    contradicts another (or ``boot.cmdline``) about which kernel boots next, which loader
    file it takes its line from, and what is pending a reboot.
    """

    #: The running kernel's release ("" when unknown).
    running: str
    #: The release the next boot starts (the running one when nothing else is known).
    release: str
    #: How the next kernel was found (pin, saved_entry, newest installed).
    how: str
    #: The configured line, None when no loader configuration was found.
    configured: Configured | None
    #: The running kernel's tokens (/proc/cmdline).
    live: tuple[str, ...]

    @property
    def known(self) -> bool:
        """Return whether the next boot's line was read from a loader's configuration."""
        return self.configured is not None

    @property
    def tokens(self) -> tuple[str, ...]:
        """Return the next boot's tokens: the configured line, or the live one when unknown."""
        if self.configured is None:
            return self.live
        return tuple(t.text for t in self.configured.tokens)

    def source(self, token: str) -> str:
        """Return where a configured token is written (``path:line``), or ""."""
        if self.configured is None:
            return ""
        for configured in self.configured.tokens:
            if configured.text == token:
                return configured.source.where
        return ""

    def pending(self, token: str) -> bool:
        """Return whether ``token`` is configured for the next boot but not on /proc/cmdline."""
        return self.configured is not None and token in self.tokens and not any(
            same_token(token, live) for live in self.live)

    def configured_value(self, key: str) -> str | None:
        """Return the value of the last configured ``key=`` token (the kernel keeps the last
        of most parameters), "" for a bare ``key``, None when the next boot has none."""
        found: str | None = None
        for token in self.tokens:
            if param_key(token) == param_key(key):
                found = token.partition("=")[2]
        return found

    def describe(self) -> str:
        """Return where the next boot's line comes from, in words."""
        if self.configured is None:
            return "no boot loader configuration was found: the running line stands for it"
        files_ = " ".join(self.configured.files[:4]) or self.configured.loader
        return f"the {self.configured.loader} configuration ({files_}) for {self.release}"

    def evidence(self) -> dict[str, str]:
        """Return what every check that consulted the next boot puts in its evidence."""
        return {"next_boot_release": self.release,
                "next_boot_loader": self.configured.loader if self.configured else ""}


def next_boot(host: Host) -> NextBootLine:
    """Return the next boot's command line and the running one, computed once per host."""
    def compute(h: Host) -> NextBootLine:
        os_release = parse_os_release(files.read_text(h, "/etc/os-release", 1 << 16) or "")
        live = tuple((files.read_optional(h, PROC_CMDLINE) or "")[:8192].split()[:1024])
        running = kernels.running_kernel(h) or ""
        nxt = kernels.next_boot(h, running, kernels.installed_kernels(h))
        release = nxt.release if nxt else running
        conf = configured(h, release, os_release)
        return NextBootLine(running, release, nxt.how if nxt else "", conf, live)

    return host.fact("bootloader.next_boot", compute)


def edits_grub(host: Host) -> bool:
    """Return whether a boot parameter fix edits GRUB's defaults (where ``;`` separates
    commands and must be escaped) rather than /etc/kernel/cmdline."""
    return not uses_proxmox_boot_tool(host) and host.exists(GRUB_DEFAULT)
