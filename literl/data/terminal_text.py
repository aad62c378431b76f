"""Text that came from data, a model or user code, made safe to print on a terminal.

A data set's ids, a model's response quoted in a reward function's error, a run directory's name: any of them can
hold terminal escape sequences (ESC [2J clears the screen, OSC 0/52 set the window title or the clipboard). Such
text is printed with its control characters written as Python escapes (`\\x1b`), so they are seen, not run.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 controls (0x9b is a one-byte CSI on some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """`str(text)` with every terminal control character shown as its escape: "\\x1b[2J" for ESC [2J."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), str(text))
