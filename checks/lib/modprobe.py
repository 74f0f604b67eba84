"""Module options as modprobe applies them: modprobe.d files in kmod's order, then the boot line.

Shared by the NVIDIA checks (``nvidia.uvm_hmm``, ``nvidia.modparams``, ``rdma.peermem``) and
their fixes. It follows kmod (libkmod/libkmod.c ``default_config_paths``,
libkmod-config.c ``kmod_config_new`` / ``kmod_config_parse`` / ``kmod_config_parse_kcmdline``,
and modprobe.d(5)):

- files ``*.conf`` in ``/etc/modprobe.d``, ``/run/modprobe.d``, ``/usr/local/lib/modprobe.d``,
  ``/usr/lib/modprobe.d``, ``/lib/modprobe.d``; a file name found in an earlier directory
  hides the same name in later ones; the files are read sorted by name, whatever their
  directory; names starting with ``.`` are skipped;
- a line ending in ``\\`` continues on the next; a line starting with ``#`` is a comment;
- ``-`` and ``_`` are the same in module names;
- ``module.param=value`` tokens of ``/proc/cmdline`` are added after every file, so the
  kernel's parser (``parse_args``, which takes options in order) lets them win.

Everything read is bounded: at most :data:`MAX_FILES` files, :data:`MAX_LINES` lines each.
"""

from __future__ import annotations

from typing import NamedTuple

from auditor.checks.lib import files
from auditor.hosts.base import Host
from auditor.parsing import lazy_re

#: kmod's configuration directories, in precedence order.
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d",
                 "/usr/lib/modprobe.d", "/lib/modprobe.d")
CMDLINE = "/proc/cmdline"
#: Every path :func:`read_config` reads: a check that uses it lists these in its ``reads``.
READS: tuple[str, ...] = (*(f"{d}/*.conf" for d in MODPROBE_DIRS), CMDLINE)

MAX_FILES = 512
MAX_LINES = 4096
#: Longer than any real options line; a longer one is cut (the rest is not options).
MAX_LINE = 8192
_READ_LIMIT = 1 << 20

#: A module name as modprobe takes it (after ``-`` became ``_``).
_MODULE = lazy_re(r"[A-Za-z0-9_]{1,64}")
#: A parameter name.
_PARAM = lazy_re(r"[A-Za-z0-9_]{1,128}")


def module_name(name: str) -> str:
    """Return a module name as the kernel spells it (``nvidia-uvm`` -> ``nvidia_uvm``)."""
    return name.replace("-", "_")


class ModOption(NamedTuple):
    """One ``param=value`` for a module, and where it was set."""

    module: str
    name: str
    value: str
    #: The file it is in; "" for the kernel command line.
    path: str = ""
    #: 1-based line number of the (first physical) line; 0 on the command line.
    line: int = 0
    #: The logical line as written (continuations joined).
    raw: str = ""

    @property
    def where(self) -> str:
        """Return ``path:line``, or ``the kernel command line``."""
        return f"{self.path}:{self.line}" if self.path else "the kernel command line"


class Directive(NamedTuple):
    """A ``blacklist``, ``install`` or ``remove`` line for a module."""

    kind: str
    module: str
    argument: str
    path: str
    line: int


class ModprobeConfig(NamedTuple):
    """What modprobe will apply: options in the order they are applied, and directives."""

    options: tuple[ModOption, ...] = ()
    directives: tuple[Directive, ...] = ()
    files: tuple[str, ...] = ()

    def options_for(self, module: str) -> list[ModOption]:
        """Return the options of a module, in the order modprobe passes them."""
        wanted = module_name(module)
        return [o for o in self.options if o.module == wanted]

    def effective(self, module: str) -> dict[str, ModOption]:
        """Return each parameter's last setting for a module (the one the kernel keeps)."""
        found: dict[str, ModOption] = {}
        for option in self.options_for(module):
            found[option.name] = option
        return found

    def directives_for(self, module: str, kind: str) -> list[Directive]:
        """Return the ``blacklist`` / ``install`` / ``remove`` lines naming a module."""
        wanted = module_name(module)
        return [d for d in self.directives if d.module == wanted and d.kind == kind]


def config_files(host: Host) -> list[str]:
    """Return the modprobe.d files kmod reads, in the order it reads them."""
    chosen: dict[str, str] = {}
    for directory in MODPROBE_DIRS:
        for path in host.glob(f"{directory}/*.conf")[:MAX_FILES]:
            name = path.rsplit("/", 1)[1]
            if host.is_dir(path):
                continue
            chosen.setdefault(name, path)
    return [chosen[name] for name in sorted(chosen)][:MAX_FILES]


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Return (first line number, text) of each logical line, continuations joined."""
    found: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.split("\n")[:MAX_LINES], start=1):
        raw = raw[:MAX_LINE]
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending.append(raw[:-1])
            continue
        pending.append(raw)
        found.append((start, "".join(pending)[:MAX_LINE]))
        pending = []
    if pending:
        found.append((start, "".join(pending)[:MAX_LINE]))
    return found


def split_params(text: str) -> list[tuple[str, str]]:
    """Split ``a=1 b="x y" c`` as the kernel's ``next_arg`` does: quotes group a value.

    A bare name maps to "" (a boolean parameter set to true).
    """
    params: list[tuple[str, str]] = []
    index, size = 0, len(text)
    while index < size and len(params) < 256:
        while index < size and text[index].isspace():
            index += 1
        if index >= size:
            break
        quoted = False
        start = index
        while index < size and (quoted or not text[index].isspace()):
            if text[index] == '"':
                quoted = not quoted
            index += 1
        token = text[start:index].replace('"', "")
        name, sep, value = token.partition("=")
        params.append((name, value if sep else ""))
    return params


def parse(text: str, path: str) -> tuple[list[ModOption], list[Directive]]:
    """Parse one modprobe.d file's text: its options and its directives."""
    options: list[ModOption] = []
    directives: list[Directive] = []
    for number, line in logical_lines(text):
        stripped = line.strip()
        if not stripped or line.startswith("#"):
            continue
        words = stripped.split(None, 2)
        command = words[0]
        module = module_name(words[1]) if len(words) > 1 else ""
        if not _MODULE.fullmatch(module):
            continue
        rest = words[2] if len(words) > 2 else ""
        if command == "options":
            for name, value in split_params(rest):
                if _PARAM.fullmatch(name):
                    options.append(ModOption(module, name, value, path, number, line))
        elif command in ("blacklist", "install", "remove"):
            directives.append(Directive(command, module, rest, path, number))
    return options, directives


def cmdline_options(cmdline: str) -> list[ModOption]:
    """Return the ``module.param=value`` tokens of a kernel command line."""
    found: list[ModOption] = []
    for token, value in split_params(cmdline):
        module, dot, name = token.partition(".")
        if not dot or not _PARAM.fullmatch(name):
            continue
        module = module_name(module)
        if _MODULE.fullmatch(module):
            raw = f"{token}={value}" if value else token
            found.append(ModOption(module, name, value, "", 0, raw))
    return found


def _read(host: Host) -> ModprobeConfig:
    options: list[ModOption] = []
    directives: list[Directive] = []
    paths = config_files(host)
    for path in paths:
        text = files.read_text(host, path, _READ_LIMIT)
        if text is None:
            continue
        found, more = parse(text, path)
        options.extend(found)
        directives.extend(more)
    options.extend(cmdline_options(files.read_optional(host, CMDLINE) or ""))
    return ModprobeConfig(tuple(options), tuple(directives), tuple(paths))


def read_config(host: Host) -> ModprobeConfig:
    """Return the modprobe configuration of the host, read once per host."""
    return host.fact("modprobe.config", _read)


def truthy(value: str) -> bool | None:
    """Return a boolean parameter's value as the kernel reads it (``kstrtobool``).

    A bare name (``""``) is true; a value starting ``1 y Y t T`` is true, ``0 n N f F``
    false, ``on`` / ``off`` as written; anything else None (the kernel refuses it and
    the module does not load).
    """
    text = value.strip()
    if not text:
        return True
    if text[0] in "1yYtT":
        return True
    if text[0] in "0nNfF":
        return False
    if text[:2].lower() == "on":
        return True
    if text[:2].lower() == "of":
        return False
    return None


# -- the initramfs ----------------------------------------------------------------------------

DRACUT_CONFS = ("/usr/lib/dracut/dracut.conf.d/*.conf", "/etc/dracut.conf.d/*.conf",
                "/etc/dracut.conf")
INITRAMFS_TOOLS_MODULES = "/etc/initramfs-tools/modules"
INITRAMFS_TOOLS_HOOKS = ("/etc/initramfs-tools/hooks/*", "/usr/share/initramfs-tools/hooks/*")
MKINITCPIO_CONFS = ("/etc/mkinitcpio.conf", "/etc/mkinitcpio.conf.d/*.conf")
#: What :func:`initramfs` reads.
INITRAMFS_READS: tuple[str, ...] = (*DRACUT_CONFS, INITRAMFS_TOOLS_MODULES, "/etc/initramfs-tools",
                                    *INITRAMFS_TOOLS_HOOKS, *MKINITCPIO_CONFS)

_DRACUT_DRIVERS = lazy_re(
    r"^\s*(add_drivers|force_drivers|omit_drivers)\+?=\s*[\"']([^\"']*)[\"']")
_MKINITCPIO_MODULES = lazy_re(r"^\s*MODULES=\(([^)]*)\)")


class Initramfs(NamedTuple):
    """How the initramfs is built and whether it carries some modules."""

    #: ``dracut``, ``initramfs-tools``, ``mkinitcpio`` or "" (none recognised).
    tool: str
    #: True: the modules are put in it (so it carries its own copy of modprobe.d);
    #: False: they are not; None: cannot tell.
    carries: bool | None
    #: The file and line that say so.
    where: str = ""

    @property
    def rebuild(self) -> tuple[str, ...]:
        """Return the command that rebuilds every kernel's initramfs, or ()."""
        return {"dracut": ("dracut", "-f", "--regenerate-all"),
                "initramfs-tools": ("update-initramfs", "-u", "-k", "all"),
                "mkinitcpio": ("mkinitcpio", "-P")}.get(self.tool, ())


def _mentions(words: str, modules: tuple[str, ...]) -> bool:
    return any(module_name(w) in modules for w in words.split())


def initramfs(host: Host, modules: tuple[str, ...]) -> Initramfs:
    """Return whether the initramfs carries any of ``modules`` (kernel names, ``_`` spelt)."""
    # dracut reads dracut.conf, then the drop-ins of /usr/lib and /etc by name (a name in
    # /etc replaces the same name in /usr/lib); a later setting wins.
    drop_ins: dict[str, str] = {}
    for pattern in DRACUT_CONFS[:2]:
        for path in host.glob(pattern)[:128]:
            drop_ins[path.rsplit("/", 1)[1]] = path
    dracut_files = ([DRACUT_CONFS[2]] if host.exists(DRACUT_CONFS[2]) else []) + [
        drop_ins[name] for name in sorted(drop_ins)]
    if dracut_files:
        carries: bool | None = None
        where = ""
        for path in dracut_files:
            text = files.read_optional(host, path) or ""
            for number, line in enumerate(text.split("\n")[:2048], start=1):
                match = _DRACUT_DRIVERS.match(line[:MAX_LINE])
                if match and _mentions(match.group(2), modules):
                    carries = match.group(1) != "omit_drivers"
                    where = f"{path}:{number}"
        return Initramfs("dracut", carries, where)
    if host.exists("/etc/initramfs-tools"):
        text = files.read_optional(host, INITRAMFS_TOOLS_MODULES) or ""
        for number, line in enumerate(text.split("\n")[:2048], start=1):
            word = line.split("#", 1)[0].strip()
            if word and module_name(word.split()[0]) in modules:
                return Initramfs("initramfs-tools", True, f"{INITRAMFS_TOOLS_MODULES}:{number}")
        for pattern in INITRAMFS_TOOLS_HOOKS:
            hooks = [p for p in host.glob(pattern)[:256] if "nvidia" in p.rsplit("/", 1)[1]]
            if hooks:
                return Initramfs("initramfs-tools", True, hooks[0])
        return Initramfs("initramfs-tools", False, "")
    for pattern in MKINITCPIO_CONFS:
        for path in (host.glob(pattern)[:64] if "*" in pattern else [pattern]):
            text = files.read_optional(host, path) or ""
            for number, line in enumerate(text.split("\n")[:2048], start=1):
                match = _MKINITCPIO_MODULES.match(line[:MAX_LINE])
                if match:
                    return Initramfs("mkinitcpio", _mentions(match.group(1), modules),
                                     f"{path}:{number}")
    if host.exists(MKINITCPIO_CONFS[0]):
        return Initramfs("mkinitcpio", False)
    return Initramfs("", None)


# -- whether the initramfs holds the current configuration ------------------------------------

#: Initramfs images by kernel release: initramfs-tools writes ``/boot/initrd.img-<release>``
#: (mkinitramfs(8), update-initramfs(8)); dracut and mkinitcpio ``/boot/initramfs-<release>.img``
#: (dracut(8) "--regenerate-all", dracut.conf(5)).
IMAGE_PATTERNS = ("/boot/initrd.img-{release}", "/boot/initramfs-{release}.img")
#: What :func:`initramfs_age` reads (besides :data:`READS` and :data:`INITRAMFS_READS`).
IMAGE_READS: tuple[str, ...] = ("/boot/initrd.img-*", "/boot/initramfs-*.img")
#: modprobe.d directories a build copies into the image. initramfs-tools' mkinitramfs copies
#: ``/etc/modprobe.d/*.conf`` and ``/lib/modprobe.d/*.conf`` (``copy_file config``); dracut's
#: modules.d/90kernel-modules/module-setup.sh installs the modprobe.d ``*.conf`` files of
#: /etc, /lib and /usr/lib (``inst_multiple -H -o``). /run/modprobe.d is not persistent and
#: is read from the root file system at boot, never from the image.
IMAGE_MODPROBE_DIRS = ("/etc/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d",
                       "/lib/modprobe.d")


class ImageAge(NamedTuple):
    """Whether a kernel's initramfs image was built after the modprobe files it must carry."""

    #: The image judged ("" when none was found).
    image: str
    #: The files (path) setting options or directives for the modules, written after the
    #: image was built: the image holds an older copy of them, or none.
    newer: tuple[str, ...] = ()
    #: The files judged (every one that names the modules).
    files: tuple[str, ...] = ()
    #: Why it cannot be told ("" when it was judged).
    unknown: str = ""


def _module_files(config: ModprobeConfig, modules: tuple[str, ...]) -> list[str]:
    """Return the modprobe.d files that set options or directives for any of ``modules``."""
    wanted = {module_name(m) for m in modules}
    found: dict[str, None] = {}
    named = [(o.path, o.module) for o in config.options]
    named += [(d.path, d.module) for d in config.directives]
    for path, module in named:
        if path and module in wanted and path.rsplit("/", 1)[0] in IMAGE_MODPROBE_DIRS:
            found.setdefault(path)
    # In the order kmod reads them (by name across directories).
    return [p for p in config.files if p in found][:MAX_FILES]


def initramfs_age(host: Host, release: str, config: ModprobeConfig,
                  modules: tuple[str, ...]) -> ImageAge:
    """Return whether ``release``'s initramfs image is older than the modules' modprobe files.

    Only meaningful where the image carries the modules (:func:`initramfs`): a module loaded
    from the image reads the image's copy of modprobe.d, and a file changed after the build
    does not reach it until the image is rebuilt. Missing is not absent: an image that is not
    there, or whose time (or a file's) this collection did not carry, is ``unknown``.
    """
    judged = _module_files(config, modules)
    if not judged:
        return ImageAge("", (), (), "no modprobe.d file sets options for these modules")
    if not release:
        return ImageAge("", (), tuple(judged), "the running kernel's release cannot be read")
    candidates = [t.format(release=release) for t in IMAGE_PATTERNS]
    image = next((p for p in candidates if host.exists(p)), "")
    if not image:
        return ImageAge("", (), tuple(judged), f"no initramfs image for kernel {release} "
                        f"({' or '.join(candidates)})")
    built = host.mtime(image)
    if built is None:
        return ImageAge(image, (), tuple(judged), f"the time {image} was built is not known "
                        "(this collection keeps no file times)")
    newer: list[str] = []
    for path in judged:
        written = host.mtime(path)
        if written is None:
            return ImageAge(image, (), tuple(judged), f"the time {path} was written is not "
                            "known (this collection keeps no file times)")
        # Whole seconds: a capture keeps no more, and a build in the same second as the
        # edit read the edited file.
        if int(written) > int(built):
            newer.append(path)
    return ImageAge(image, tuple(newer), tuple(judged))
