"""The canonical text: the fast path first, the general path when it declines."""

from __future__ import annotations

from binascii import b2a_base64
from collections.abc import Callable
from typing import Any

from idempotency_async.canonical._digests import SMALL_INPUT, hash_constructor, small_constructor
from idempotency_async.canonical._fast import fast_bytes
from idempotency_async.canonical._general import Serializer, general_bytes


def canonical_json(value: Any, *, serializer: Serializer | None = None) -> str:
    """Return the text the TypeScript port hashes for ``value``.

    Accepts JSON values (dict with str keys, list, tuple, str, int, float, bool, None)
    plus ``Decimal`` (as the float64 JavaScript would see), ``Enum`` (its value) and
    dataclasses (their fields).  Other objects go through ``serializer`` when given.

    Raises :class:`~idempotency_async.errors.PayloadError`, naming the path of the
    offending value, for NaN/±Infinity, lone surrogates, non-string keys, objects that
    are not JSON, and nesting deeper than :data:`MAX_DEPTH`.
    """
    data = fast_bytes(value)
    if data is None:
        data = general_bytes(value, serializer)
    return data.decode()


def canonical_bytes(
    value: Any, *, serializer: Serializer | None = None, strict_integers: bool = False
) -> bytes:
    """:func:`canonical_json` as UTF-8 bytes, ready to hash.

    With ``strict_integers``, integers beyond ±(2**53-1) raise :class:`PayloadError`
    instead of being rounded to the nearest double as JavaScript would: two distinct
    64-bit ids would otherwise hash alike.
    """
    # The fast path accepts only plain JSON types and integers within ±(2**53-1), so
    # neither the serializer nor strictness can change what it returns.
    data = fast_bytes(value)
    if data is None:
        data = general_bytes(value, serializer, strict_integers)
    return data


def canonical_digester(
    algorithm: str = "md5",
    *,
    serializer: Serializer | None = None,
    strict_integers: bool = False,
) -> Callable[[Any], str]:
    """``digest_bytes(canonical_bytes(value, ...), algorithm)`` as one function of
    ``value``, its settings resolved once: a manager derives a key on every call, and on a
    small payload the calls around the hash (three frames when composed) cost as much as
    the hash itself.  ConfigError for an unknown ``algorithm``."""
    new = hash_constructor(algorithm)
    small = small_constructor(algorithm)

    def canonical_digest(value: Any) -> str:
        data = fast_bytes(value)
        if data is None:
            data = general_bytes(value, serializer, strict_integers)
        hashed = (small if len(data) < SMALL_INPUT else new)(data)
        return b2a_base64(hashed.digest(), newline=False).decode("ascii")

    return canonical_digest
