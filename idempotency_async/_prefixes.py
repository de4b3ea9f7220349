"""Key prefixes: when one counts as set, and how the TypeScript port trims it.

Shared by the options (the prefix keys use) and the key derivation (whether a decorator
may append the function's name); not part of the API.
"""

from __future__ import annotations

from typing import Final

from idempotency_async._key_formats import POWERTOOLS_PYTHON

__all__ = ["has_explicit_prefix", "js_trim"]

# JavaScript's String.prototype.trim() set: WhiteSpace and LineTerminator code points.
# It differs from str.strip(), which also strips U+001C-U+001F but not U+FEFF.
_JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    """``text.trim()`` as JavaScript does it."""
    return text.strip(_JS_WHITESPACE)


def has_explicit_prefix(key_prefix: str | None, key_format: str) -> bool:
    """Whether ``key_prefix`` was set to something non-blank (blank counts as unset).

    With ``key_format="powertools-python"``, any non-empty prefix counts, as in Powertools.
    """
    if key_format == POWERTOOLS_PYTHON:
        return bool(key_prefix)
    return bool(key_prefix and js_trim(key_prefix))
