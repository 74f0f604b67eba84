"""Format characters from a host (bidi overrides and isolates, zero-width characters, the
BOM, C0 and C1 controls) are escaped in every human format: text, markdown, HTML, JUnit
and line. Shown raw, U+202E reverses what follows it ("Trojan Source", CVE-2021-42574)
and a zero-width space makes two names look alike."""

from __future__ import annotations

import pytest

from tests.checks.test_cpu_cstates import INTEL, plant_states
from tests.hostile.conftest import audit_cmd, run_limited
from tests.support.sysroot import Sysroot

#: RLO, LRI, PDI, ZWSP, ZWJ, BOM, word joiner, soft hyphen, C1 CSI and NEL, ESC, BEL.
FORMAT_CHARS = "\u202e\u2066\u2069\u200b\u200d\ufeff\u2060\u00ad\x9b\x85\x1b\x07"
NAME = "C8" + "".join(f"{c}x" for c in FORMAT_CHARS)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "junit", "line"])
def test_format_characters_are_escaped_in_every_human_format(h200: Sysroot, fmt: str) -> None:
    # A C-state's name, as the idle driver names it: a deep state enabled is a finding on it.
    plant_states(h200, range(2), [*INTEL, (NAME, 300)])
    result = run_limited(audit_cmd("local", "--root", str(h200.root), "--format", fmt,
                                   "--check", "cpu.cstates"), timeout=60)
    assert result.code in (0, 1), result.err
    raw = [f"U+{ord(c):04X}" for c in FORMAT_CHARS if c in result.out + result.err]
    assert raw == []
    if fmt != "line":  # line is printable ASCII only, cut at 80 bytes
        # The control: the name did reach the report, each character as its escape
        # (markdown escapes the backslash itself: it renders as one).
        slash = "\\\\" if fmt == "markdown" else "\\"
        shown = result.out.replace(slash, "\\")
        assert "C8\\u202ex\\u2066x" in shown, result.out[:2000]
        assert "\\xadx\\x9bx" in shown and "\\x1bx\\x07x" in shown  # NEL: a space


def test_the_text_helpers_escape_every_format_character() -> None:
    from auditor.render import md_escape, one_line, printable_lines
    from auditor.text import printable, visible

    for helper in (printable, one_line, md_escape, visible):
        shown = helper(NAME)
        assert shown.isprintable() and "\\u202e" in shown, helper
    # Several lines (a fix's log): each one printable, the line breaks kept.
    shown = printable_lines(f"a{NAME}\nb\u2028c\n")
    assert shown.startswith("aC8\\u202ex") and shown.endswith("\nb\nc\n")
    assert all(line.isprintable() for line in shown.split("\n"))


def test_kept_line_breaks_never_let_a_format_character_through() -> None:
    from auditor.text import visible

    rows = "<tr>\n<td>pass</td>\n\t<td>ok</td>\n</tr>\n" * 200
    assert visible(rows, keep="\n\t") is rows  # printable but for the kept breaks: as is
    # One bidi override or escape among the kept breaks is still written as an escape.
    for bad in ("\u202e", "\x1b[2J", "\u200b"):
        shown = visible(rows + bad + rows, keep="\n\t")
        assert bad not in shown and shown.count("\n") == 2 * rows.count("\n")
        assert all(line.isprintable() for line in shown.replace("\t", "").split("\n"))
    assert visible("a\nb", keep="") == "a\\x0ab"
