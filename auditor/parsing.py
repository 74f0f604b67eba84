"""Small parsers for the formats kernel interfaces use (CPU lists, key-value files)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: ``re.Pattern``'s default end position.
MAX_POS = sys.maxsize
#: The highest CPU number a CPU list may name (Linux's NR_CPUS is at most 8192 today).
MAX_CPU = 65535
#: The most CPU numbers one list may spell out, counting repeats: a real list names each
#: CPU once; a hostile one repeating ``0-65535`` must not cost minutes.
MAX_CPULIST_WORK = 1 << 17
#: The longest CPU list read (a list of every one of 65536 CPUs, one by one, is ~400 KB).
MAX_CPULIST_TEXT = 1 << 19


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list (``0-3,8,10-11``) into sorted CPU numbers.

    Raise ValueError for what is not one: a number past MAX_CPU, a range backwards, a
    stride below 1, or a list that spells out more than MAX_CPULIST_WORK numbers.
    """
    if len(text) > MAX_CPULIST_TEXT:
        raise ValueError("CPU list too long")
    cpus: set[int] = set()
    work = 0
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low_text, _, high_text = part.partition("-")
            step = 1
            if ":" in high_text:  # 0-15:2 stride form
                high_text, _, stride = high_text.partition(":")
                step = int(stride.split("/")[0])
            low, high = int(low_text), int(high_text)
        else:
            low = high = int(part)
            step = 1
        if not 0 <= low <= high <= MAX_CPU or step < 1:
            raise ValueError(f"not a CPU range: {part[:40]!r}")
        work += (high - low) // step + 1
        if work > MAX_CPULIST_WORK:
            raise ValueError("CPU list names too many CPUs")
        cpus.update(range(low, high + 1, step))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU numbers as a compact kernel CPU list (``0-63,96-127``)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        ranges.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(ranges)


def kernel_cmdline_params(cmdline: str) -> dict[str, str]:
    """Split a kernel command line into parameters; a bare flag maps to an empty string."""
    params: dict[str, str] = {}
    for token in cmdline.split():
        key, _, value = token.partition("=")
        params[key] = value
    return params


def version_tuple(text: str) -> tuple[int, ...]:
    """Return the leading numeric components of a version (``6.8.0-45-generic`` -> 6, 8, 0)."""
    numbers: list[int] = []
    for part in text.replace("-", ".").replace("+", ".").split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)


class LazyPattern:
    """A regular expression compiled on its first use, so that importing a check is cheap.

    Compiling is most of the cost of importing a module that declares its patterns at
    the top (``re`` parses each in Python); an audit uses only the patterns the host in
    front of it calls for. Same methods as :class:`re.Pattern` for ``str``.
    """

    __slots__ = ("_compiled", "_flags", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        """Return the compiled pattern (compiling it the first time)."""
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self._flags)
        return self._compiled

    @property
    def flags(self) -> int:
        return self.compiled.flags

    def match(self, string: str, pos: int = 0, endpos: int = MAX_POS) -> re.Match[str] | None:
        return self.compiled.match(string, pos, endpos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = MAX_POS) -> re.Match[str] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def search(self, string: str, pos: int = 0, endpos: int = MAX_POS) -> re.Match[str] | None:
        return self.compiled.search(string, pos, endpos)

    def finditer(self, string: str, pos: int = 0, endpos: int = MAX_POS) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = MAX_POS) -> list[Any]:
        return self.compiled.findall(string, pos, endpos)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self.compiled.sub(repl, string, count)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return self.compiled.split(string, maxsplit)

    def __repr__(self) -> str:
        return f"lazy_re({self.pattern!r})"


def lazy_re(pattern: str, flags: int = 0) -> LazyPattern:
    """Return ``pattern`` to be compiled on its first use (see :class:`LazyPattern`)."""
    return LazyPattern(pattern, flags)


def parse_os_release(text: str) -> dict[str, str]:
    """Parse os-release ``KEY=value`` lines, unquoting values."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Z0-9_]+", key):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


_SAFE_WORD = LazyPattern(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*")


def safe_word(text: str) -> bool:
    """Return whether ``text`` is a plain word (a version, a codename, a device id)."""
    return bool(_SAFE_WORD.fullmatch(text))


# -- sysfs selector files ---------------------------------------------------------------------
#
# A kernel attribute that offers a choice shows every word and brackets the one in force:
# ``always [madvise] never`` (transparent_hugepage/enabled), ``[default] performance powersave
# powersupersave `` (pcie_aspm's policy, a blank before the newline), ``[mq-deadline] none``.
# Writing one word selects it; writing the whole line back is EINVAL. So a fix compares and
# saves the selected word and writes a word, as tuned's get/set pairs do
# (tuned/plugins/plugin_vm.py: ``get_active_option`` reads the bracketed word).
#
# These two functions are also the sysroot fix program's (auditor.render.sysroot_program
# sends their source with it): standard library only, and Python 3.6 syntax, annotations
# unevaluated there. The bash fix scripts mirror them (templates/fix_lib.sh.j2), pinned by
# tests/auditor/test_selector.py against this code.


# Quoted: Python 3.6 would evaluate it, and the sysroot fix program runs there.
def parse_selector(text: str) -> "tuple[tuple[str, ...], str] | None":  # noqa: UP037
    """Parse a selector line (``always [madvise] never``): its words and the selected one.

    Return None for anything else: more than one line, more than 4096 characters or 64
    words, no bracketed word or two, a word outside ``[A-Za-z0-9_.+-]{1,64}``. Words part at
    blanks and tabs; one trailing newline is allowed.
    """
    if text.endswith("\n"):
        text = text[:-1]
    if len(text) > 4096 or "\n" in text:
        return None
    allowed = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")
    words = [w for w in text.replace("\t", " ").split(" ") if w]
    if not 1 <= len(words) <= 64:
        return None
    names: list[str] = []
    selected = ""
    for word in words:
        name = word
        if len(word) > 2 and word.startswith("[") and word.endswith("]"):
            if selected:
                return None
            name = selected = word[1:-1]
        if not 1 <= len(name) <= 64 or not set(name) <= allowed:
            return None
        names.append(name)
    if not selected:
        return None
    return tuple(names), selected


def select_word(text: str, word: str) -> str:
    """Return a selector line with the brackets moved onto ``word``, its spacing kept.

    That is how the kernel shows the line once it took the word; a copy of the file (a
    sysroot's, a test's) is given that line, so its rollback is byte for byte.
    """
    out: list[str] = []
    token = ""
    for char in text + " ":
        if char in " \t\n":
            if token:
                if len(token) > 2 and token.startswith("[") and token.endswith("]"):
                    token = token[1:-1]
                out.append("[" + token + "]" if token == word else token)
                token = ""
            out.append(char)
        else:
            token += char
    return "".join(out)[:-1]
