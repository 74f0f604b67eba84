"""The selector step: a sysfs choice (``always [madvise] never``) fixed and undone by its word.

The parse lives in :mod:`auditor.parsing`; the sysroot fix program carries its source and
the bash scripts mirror it (``templates/fix_selector.sh.j2``). One table pins the three
together, and the step runs through both engines on the same tree.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest

from auditor.fix import Action, FixPlan, Section
from auditor.parsing import parse_selector, select_word
from auditor.remedy import Remedy, SetSelector, describe
from auditor.render import make_environment, render_fix
from tests.support import livefix
from tests.support.fixkit import copy_tree, live_plan, run, tree_hash

#: (the file's text, what parse_selector returns).
PARSES: list[tuple[str, tuple[tuple[str, ...], str] | None]] = [
    ("always [madvise] never\n", (("always", "madvise", "never"), "madvise")),
    ("[always] madvise never", (("always", "madvise", "never"), "always")),
    ("always defer defer+madvise [madvise] never\n",
     (("always", "defer", "defer+madvise", "madvise", "never"), "madvise")),
    ("[default] performance powersave powersupersave \n",
     (("default", "performance", "powersave", "powersupersave"), "default")),
    ("[mq-deadline] kyber bfq none\n", (("mq-deadline", "kyber", "bfq", "none"), "mq-deadline")),
    ("s2idle\t[deep]\n", (("s2idle", "deep"), "deep")),
    ("  [x]  ", (("x",), "x")),
    ("always madvise never\n", None),                 # nothing selected
    ("[always] [madvise] never\n", None),             # two selected
    ("always [madvise] never\nsecond line\n", None),  # two lines
    ("always [madvise] never\n\n", None),             # a blank second line
    ("", None),
    ("\n", None),
    ("[]", None),
    ("[[x]]", None),
    ("[x", None),
    ("a [b] c$(reboot)", None),                       # a word outside the alphabet
    ("a [b] c\u00e9", None),
    ("a [b] c\r\n", None),
    ("a\x0b[b]", None),
    ("[" + "w" * 64 + "]", (("w" * 64,), "w" * 64)),
    ("[" + "w" * 65 + "]", None),
    (" ".join(["[a]"] + ["b"] * 63), (("a",) + ("b",) * 63, "a")),
    (" ".join(["[a]"] + ["b"] * 64), None),           # 65 words
    ("[a] " + " " * 4092, (("a",), "a")),             # 4096 characters
    ("[a] " + " " * 4093, None),
]

#: (the file's text, the word, the line once the word is selected).
SELECTS = [
    ("always [madvise] never", "never", "always madvise [never]"),
    ("[default] performance powersave powersupersave ", "performance",
     "default [performance] powersave powersupersave "),
    ("s2idle\t[deep]", "s2idle", "[s2idle]\tdeep"),
    ("  always  [madvise]\tnever  ", "always", "  [always]  madvise\tnever  "),
    ("a [b] c", "b", "a [b] c"),
    ("a [b] c", "zz", "a b c"),
]


def _bash_library(tmp_path: Path) -> Path:
    library = tmp_path / "selector.sh"
    library.write_text(make_environment("shell").get_template("fix_selector.sh.j2").render())
    return library


@pytest.mark.parametrize(("text", "expected"), PARSES,
                         ids=[repr(t)[:40] for t, _ in PARSES])
def test_parse_selector(text: str, expected: object) -> None:
    assert parse_selector(text) == expected


def test_the_bash_parse_agrees_with_the_python_parse(tmp_path: Path) -> None:
    """Every row through bash's parse_selector at once: the words and the pick, or 1."""
    library = _bash_library(tmp_path)
    texts = [t for t, _ in PARSES]
    script = (f'. {library}\n'
              'for text in "$@"; do\n'
              '    if parse_selector "$text"; then printf "%s|" "$SEL_PICK" "${SEL_WORDS[@]}"\n'
              '    else printf "none"; fi\n'
              '    printf "\\n"\n'
              'done\n')
    # bash reads its values without one trailing newline, as the scripts' read_value does.
    values = [t[:-1] if t.endswith("\n") else t for t in texts]
    out = subprocess.run(["bash", "-c", script, "parse", *values], capture_output=True,
                         text=True, check=True).stdout.split("\n")[:-1]
    assert len(out) == len(texts)
    for text, line in zip(texts, out, strict=True):
        found = parse_selector(text)
        expected = "none" if found is None else "|".join((found[1], *found[0])) + "|"
        assert line == expected, repr(text)


@pytest.mark.parametrize(("text", "word", "expected"), SELECTS)
def test_select_word_in_python_and_bash(text: str, word: str, expected: str,
                                        tmp_path: Path) -> None:
    assert select_word(text, word) == expected
    library = _bash_library(tmp_path)
    out = subprocess.run(["bash", "-c", f'. {library}; select_word "$1" "$2"', "s", text, word],
                         capture_output=True, text=True, check=True).stdout
    assert out == expected


# -- the step, through both engines ----------------------------------------------------------

THP = "/sys/kernel/mm/transparent_hugepage/enabled"
POLICY = "/sys/module/pcie_aspm/parameters/policy"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in {"/etc/hostname": "gpu-01\n", **files}.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def _plan(root: Path, *steps: SetSelector) -> FixPlan:
    actions = tuple(Action(f"s{i:03d}", "runtime", s) for i, s in enumerate(steps, 1))
    remedy = Remedy(check="mem.thp", subject="thp", title="select", runtime=steps)
    return FixPlan(host="gpu-01", target="local", hostname="gpu-01", machine_id="",
                   root=str(root), fix_id="20261204T000000Z-0123456789ab",
                   created=dt.datetime(2026, 12, 4, tzinfo=dt.timezone.utc).isoformat(),
                   sections=(Section(remedy, actions),))


def _scripts(plan: FixPlan, where: Path) -> tuple[Path, Path]:
    where.mkdir()
    rendered = render_fix(plan)
    fix, rollback = where / "fix.sh", where / "rollback.sh"
    fix.write_text(rendered.script)
    rollback.write_text(rendered.rollback)
    return fix, rollback


class _Engines:
    """One plan on two copies of a tree: the sysroot program and the booted machine's bash."""

    def __init__(self, tree: Path, tmp: Path, *steps: SetSelector) -> None:
        self.python_tree = copy_tree(tree, tmp / "python")
        self.bash_tree = copy_tree(tree, tmp / "bash")
        plan = _plan(tree, *steps)
        self.python = _scripts(plan, tmp / "python-scripts")
        self.live = live_plan(plan, tree)
        self.bash = _scripts(self.live, tmp / "bash-scripts")
        self.work = tmp / "live"

    def run(self, which: int) -> tuple[str, str]:
        """Run the fix (0) or the rollback (1) in both; return both outputs."""
        py = run(self.python[which], self.python_tree)
        sh = livefix.run_live(self.bash[which], self.bash_tree, self.live, self.work)
        return (f"{py.returncode} {py.stdout}{py.stderr}",
                f"{sh.process.returncode} {sh.output}")


needs_live = pytest.mark.skipif(bool(livefix.available()), reason=livefix.available() or "-")


@pytest.mark.root
@needs_live
@pytest.mark.parametrize(("path", "text", "word"), [
    (THP, "always [madvise] never\n", "never"),
    (POLICY, "[default] performance powersave powersupersave \n", "performance"),
])
def test_both_engines_select_the_word_and_restore_the_line(path: str, text: str, word: str,
                                                           tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree", {path: text})
    engines = _Engines(tree, tmp_path, SetSelector(path, word))
    before = tree_hash(tree)
    for _ in range(2):  # the second run finds the word selected and changes nothing
        py, sh = engines.run(0)
        assert py.startswith("0 ") and sh.startswith("0 "), (py, sh)
        for copy in (engines.python_tree, engines.bash_tree):
            assert (copy / path.lstrip("/")).read_text() == select_word(text[:-1], word) + "\n"
        assert tree_hash(engines.python_tree) == tree_hash(engines.bash_tree)
    assert "selects" in py and "selects" in sh
    py, sh = engines.run(1)
    assert py.startswith("0 ") and sh.startswith("0 "), (py, sh)
    assert tree_hash(engines.python_tree) == tree_hash(engines.bash_tree) == before
    assert livefix.leftovers(engines.work) == []


@pytest.mark.root
@needs_live
@pytest.mark.parametrize(("text", "word", "why"), [
    ("always [madvise] never\n", "sometimes", "offers no sometimes"),
    ("always madvise never\n", "never", "is not a selector file"),
    ("always [madvise] never\nmore\n", "never", "is not a selector file"),
])
def test_both_engines_refuse_a_word_not_offered_and_a_file_that_is_no_selector(
        text: str, word: str, why: str, tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree", {THP: text})
    engines = _Engines(tree, tmp_path, SetSelector(THP, word))
    before = tree_hash(tree)
    py, sh = engines.run(0)
    assert py.startswith("1 ") and sh.startswith("1 "), (py, sh)
    assert why in py and why in sh
    assert tree_hash(engines.python_tree) == tree_hash(engines.bash_tree) == before


def test_a_selector_step_describes_itself() -> None:
    assert describe(SetSelector(THP, "madvise")) == f"{THP}: select madvise"
