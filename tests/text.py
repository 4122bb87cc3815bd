"""Reading a command's rich output in tests, whatever width its console took: a module's
console reads ``COLUMNS`` once, when first made, so a long value (a temporary path, longer
under pytest-xdist) may be folded across lines and table borders."""

from __future__ import annotations


def unwrapped(text: str) -> str:
    """``text`` without whitespace and box-drawing characters: a folded value reads whole."""
    return "".join(ch for ch in text if not ch.isspace() and not "\u2500" <= ch <= "\u257f")
