"""What a trainer prints, made safe to show on a terminal. A trainer may print anything: a
window-title or clipboard escape (OSC 52), a screen clear, a carriage return that overwrites
the line with a forged `orchestrate: job succeeded`. On a terminal every control character is
shown escaped (`\\x1b`, `\\r`); the durable copies stay byte for byte what the task wrote."""

from __future__ import annotations

import re

# C0 controls but tab, DEL, C1 controls, and the bidirectional overrides and isolates that
# reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return {"\r": "\\r", "\n": "\\n"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def safe(text: str) -> str:
    """`text` with every control character escaped (for a terminal)."""
    return _CONTROL.sub(_escaped, text)
