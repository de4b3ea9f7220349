"""Numbers as JavaScript prints them, and which of them orjson already prints that way.

JavaScript numbers are float64 and ``Number.prototype.toString`` writes the shortest
digits that round-trip: in positional notation from 1e-6 up to (not including) 1e21, in
exponent notation (``1e+21``, ``1.5e-7``) outside that range, integral values without a
fraction, ``-0`` as ``0``.  orjson (≥ 3.11.7) writes the same shortest digits and the same
exponent notation; it differs only where it adds ``.0`` to integral floats (``132.0``,
``-0.0``), and where it switches notation at other thresholds: exponents from 1e16 (all
integral there), and for 1e-6 ≤ |x| < 1e-5.  Those floats — and only those — are replaced
before orjson writes: by an ``int`` when it is exact, else by an ``orjson.Fragment`` of
:func:`js_number`'s text.
"""

from __future__ import annotations

import math
from typing import Any, Final

import orjson

from idempotency_async.errors import PayloadError

MAX_SAFE_INTEGER: Final = 2**53 - 1
_INFINITY: Final = math.inf


def js_number(value: float) -> str:
    """Format a finite float as JavaScript's ``Number.prototype.toString`` does."""
    if value == 0:
        return "0"
    text = repr(abs(value))  # the shortest digits that round-trip, as JavaScript uses
    mantissa, _, exp_text = text.partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    all_digits = int_part + frac_part
    significant = all_digits.lstrip("0")
    # Decimal point position n: value = 0.d1d2... x 10^n
    n = len(int_part) + (int(exp_text) if exp_text else 0) - (len(all_digits) - len(significant))
    digits = significant.rstrip("0")
    k = len(digits)
    sign = "-" if value < 0 else ""
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        exponent = n - 1
        exp_sign = "+" if exponent >= 0 else "-"
        head = digits[0] if k == 1 else f"{digits[0]}.{digits[1:]}"
        body = f"{head}e{exp_sign}{abs(exponent)}"
    return sign + body


def js_float(value: float) -> Any:
    """What orjson must write for ``value`` to print it as JavaScript does.

    ``value`` itself when orjson already does; an ``int`` for integral values that are
    exact as integers (``132.0``, ``-0.0``); an ``orjson.Fragment`` otherwise; ``None``
    for NaN and ±Infinity, which are not JSON.  The common case (not integral,
    1e-5 ≤ |x| < 1e16) is tested inline by the fast path before it calls this.
    """
    size = abs(value)
    if 1e-5 <= size < 1e16:
        if value % 1.0:
            return value
        # An exact int prints as JavaScript prints the double; past 2**53 the fast path's
        # strict-integer option would refuse it, so those get their text instead.
        return int(value) if size <= MAX_SAFE_INTEGER else orjson.Fragment(js_number(value))
    if size < 1e-6:
        return value if size else 0
    if 1e21 <= size < _INFINITY:
        return value
    if size != size or size == _INFINITY:
        return None
    return orjson.Fragment(_positional(value))


def _positional(value: float) -> str:
    """:func:`js_number` for 1e-6 ≤ |x| < 1e-5 and 1e16 ≤ |x| < 1e21, straight from ``repr``.

    ``repr`` writes these with an exponent (``2.5e-06``, ``1.2345e+17``) and the same
    shortest digits JavaScript uses; JavaScript writes them positionally.
    """
    mantissa, _, exponent = repr(value).partition("e")
    sign = "-" if mantissa[0] == "-" else ""
    digits = mantissa.lstrip("-").replace(".", "")
    if exponent[0] == "-":  # always e-06 in this range
        return f"{sign}0.00000{digits}"
    return sign + digits + "0" * (int(exponent) + 1 - len(digits))


def js_int(value: int) -> Any:
    """A wide integer as JavaScript sees it: the nearest double (``None`` beyond float64)."""
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    try:
        return orjson.Fragment(js_number(float(value)))
    except OverflowError:
        return None


def checked_js_float(value: float, path: str) -> Any:
    """:func:`js_float`, raising :class:`PayloadError` for NaN and ±Infinity."""
    form = js_float(value)
    if form is None:
        raise PayloadError(
            f"{value} at {path} is not a JSON number: replace NaN/Infinity before hashing",
            path=path,
        )
    return form
