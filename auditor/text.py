"""Text read from a host, made safe to show: every character that is not printable made
visible as an escape.

Not printable (``str.isprintable``): C0 and C1 control characters (ESC and its terminal
sequences), Unicode format characters (category Cf: bidi overrides and isolates such as
U+202E, zero-width spaces and joiners, the BOM), line and paragraph separators,
surrogates and unassigned code points. A bidi override in a host name, a message or a
file name would reorder what a reader sees (CVE-2021-42574, "Trojan Source"); shown
through these helpers it is visible text (``\\u202e``) in every human format: the terminal,
text, markdown, HTML and JUnit reports, and error lines.
"""

from __future__ import annotations


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, keep: str = "") -> str:
    """Return text with each character that is not printable written as an escape
    (``\\x1b``, ``\\u202e``), but those in ``keep`` (``"\\n"`` for text of several lines)."""
    if text.isprintable():
        return text
    rest = text
    for char in keep:  # text of many lines: a page's row is printable but for them
        rest = rest.replace(char, "")
    if rest.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


def printable(text: str) -> str:
    """Return text as one printable line: control characters (ESC too) written ``\\xNN``,
    format characters (bidi overrides, zero-width) ``\\uNNNN``.

    A host name, an error message or a file name read from a host may hold escape
    sequences that recolour, move the cursor or clear a terminal, or bidi controls that
    reorder what is shown; printed through this they are visible text instead.
    """
    return visible(text)
