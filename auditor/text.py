"""Text read from a host, made safe to print: one printable line."""

from __future__ import annotations


def printable(text: str) -> str:
    """Return text as one printable line: control characters (ESC too) written ``\\xNN``.

    A host name, an error message or a file name read from a host may hold escape
    sequences that recolour, move the cursor or clear a terminal; printed through this
    they are visible text instead.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100
                                              else f"\\u{ord(c):04x}") for c in text)
