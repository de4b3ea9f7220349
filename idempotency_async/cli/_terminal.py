"""Text for a terminal: stored bytes are data, never instructions to the terminal.

Keys, owners, reasons, headers and bodies come from the store, which other writers share
(and a stored response may echo a client's text).  Written raw, an escape sequence in them
would be run by the operator's terminal: clear the screen, set the title, or write the
clipboard (OSC 52).  Every control character is shown as an escape instead.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["printable"]

# C0 controls (ESC, BEL, CR, backspace, tab…), DEL and C1 controls (CSI U+009B, OSC
# U+009D…), plus the Unicode characters that reorder or break displayed lines (bidi
# overrides and isolates, line and paragraph separators).
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` (``\\uNNNN`` above U+00FF).

    Line breaks are escaped too: split multi-line text first and pass each line.
    """
    return _CONTROL.sub(_escaped, text)
