"""Canonical JSON text and digests, byte-compatible with the TypeScript Powertools port.

The TypeScript port hashes ``JSON.stringify(deepSort(value))``.  This module produces
the same text for the same JSON value, and rejects what it cannot hash faithfully.
Pure functions: no I/O, no mutable module state beyond a bounded memo of key orders.

Two paths produce the same text:

* the fast path lets orjson serialize with code-point key order after a cheap check
  that, for this value, code-point order *is* the TypeScript order and every number
  prints as JavaScript prints it;
* the general path rebuilds the value in TypeScript order (lower-cased UTF-16 key
  order, array-index keys first, ``__proto__`` dropped) with JavaScript number text.
"""

from __future__ import annotations

import binascii
import bisect
import dataclasses
import enum
import hashlib
import math
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final

import orjson

from idempotency_async.errors import ConfigError, PayloadError

__all__ = [
    "HASH_ALGORITHMS",
    "MAX_DEPTH",
    "Serializer",
    "canonical_bytes",
    "canonical_json",
    "digest",
    "digest_bytes",
    "digester",
    "idempotency_key",
    "js_number",
]

Serializer = Callable[[Any], Any]
"""Turns an object the canonicalizer does not know into JSON values (dict, list, str, …)."""

HASH_ALGORITHMS: Final = frozenset({"md5", "sha1", "sha256", "sha384", "sha512"})
# The named constructors are faster than ``hashlib.new``, which matters for small payloads.
_HASHERS: Final[dict[str, Callable[[bytes], Any]]] = {
    "md5": hashlib.md5,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}

MAX_DEPTH: Final = 512
"""Deepest nesting accepted; deeper payloads raise :class:`PayloadError` (no RecursionError)."""

_MAX_SAFE_INTEGER: Final = 2**53 - 1
_MAX_ARRAY_INDEX: Final = 2**32 - 2
_FAST_OPTIONS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_ORDER_MEMO_LIMIT: Final = 4096
_MEMO_MAX_KEYS: Final = 64
_MEMO_MAX_CHARS: Final = 4096
_order_memo: dict[tuple[str, ...], bool] = {}


def canonical_json(value: Any, *, serializer: Serializer | None = None) -> str:
    """Return the text the TypeScript port hashes for ``value``.

    Accepts JSON values (dict with str keys, list, tuple, str, int, float, bool, None)
    plus ``Decimal`` (as the float64 JavaScript would see), ``Enum`` (its value) and
    dataclasses (their fields).  Other objects go through ``serializer`` when given.

    Raises :class:`~idempotency_async.errors.PayloadError`, naming the path of the
    offending value, for NaN/±Infinity, lone surrogates, non-string keys, objects that
    are not JSON, and nesting deeper than :data:`MAX_DEPTH`.
    """
    return canonical_bytes(value, serializer=serializer).decode()


def canonical_bytes(
    value: Any, *, serializer: Serializer | None = None, strict_integers: bool = False
) -> bytes:
    """:func:`canonical_json` as UTF-8 bytes, ready to hash.

    With ``strict_integers``, integers beyond ±(2**53-1) raise :class:`PayloadError`
    instead of being rounded to the nearest double as JavaScript would: two distinct
    64-bit ids would otherwise hash alike.
    """
    # The fast path only accepts plain JSON types, so a serializer never matters there.
    fast = _fast_form(value)
    if fast is not _NOT_FAST:
        try:
            return orjson.dumps(fast, option=_FAST_OPTIONS)
        except orjson.JSONEncodeError:
            pass  # lone surrogate, wide integer, deep nesting: the general path decides
    plain = _to_js(value, serializer, strict_integers)
    try:
        return orjson.dumps(plain)
    except orjson.JSONEncodeError:
        return _dumps_deep(plain)  # deeper than orjson's recursion limit (255 levels)


def digest(text: str | bytes, algorithm: str = "md5") -> str:
    """Padded standard Base64 of the ``algorithm`` digest of ``text`` (UTF-8)."""
    data = text.encode() if isinstance(text, str) else text
    return digest_bytes(data, algorithm)


def digest_bytes(data: bytes, algorithm: str = "md5") -> str:
    """:func:`digest` of bytes."""
    return digester(algorithm)(data)


def digester(algorithm: str = "md5") -> Callable[[bytes], str]:
    """The function :func:`digest_bytes` applies, resolved once (for hot paths)."""
    new = _HASHERS.get(algorithm)
    if new is None:
        raise ConfigError(
            f"unknown hash algorithm {algorithm!r}: use one of {', '.join(sorted(HASH_ALGORITHMS))}"
        )

    def digest_of(data: bytes) -> str:
        return binascii.b2a_base64(new(data).digest(), newline=False).decode("ascii")

    return digest_of


def idempotency_key(prefix: str, value_digest: str) -> str:
    """The record key ``<prefix>#<digest>`` (``#<digest>`` with an empty prefix)."""
    return f"{prefix}#{value_digest}"


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


# --------------------------------------------------------------------------- fast path
#
# orjson with OPT_SORT_KEYS writes keys in code-point order and numbers its own way.
# For most payloads that is already the TypeScript text; the check below proves it in
# one recursive pass over the value (cheaper than any C-iterator pipeline measured here,
# see BENCHMARKS.md).  Floats that orjson prints differently from JavaScript (integral
# ones such as ``132.0``, tiny or huge ones) are common in real payloads, so instead of
# giving up, the pass replaces them copy-on-write: only the containers holding them, and
# their ancestors, are copied on the way back up.  Anything else unusual goes to the
# general path, which also produces every error message.

_NOT_FAST: Final = object()
# Past this depth the general path (iterative) takes over; it also stops cyclic values,
# and stays below orjson's own recursion limit of 255.
_MAX_FAST_DEPTH: Final = 200


class _KnownKeys:
    """Keys whose code-point order is their TypeScript order in every combination.

    A dict whose keys all belong here needs no ordering check (any subset of a totally
    ordered set sorts alike both ways).  Kept as one list in that common order, so a new
    key is admitted by comparing it with its two neighbours (a bisect), not by re-sorting
    the set.  Bounded in count and key length, since keys come from payloads.
    """

    LIMIT: Final = 4096
    MAX_KEY_LENGTH: Final = 128

    def __init__(self) -> None:
        self.members: set[str] = set()
        self._ordered: list[str] = []
        self._ts_keys: list[bytes] = []
        # Readers only probe ``members``; writers keep the lists and the set in step.
        self._lock = threading.Lock()

    def learn(self, keys: tuple[str, ...]) -> None:
        with self._lock:
            for key in keys:
                if len(self.members) >= self.LIMIT:
                    return
                if key in self.members or not self._admissible(key):
                    continue
                index = bisect.bisect_left(self._ordered, key)
                ts_key = _ts_sort_key(key)
                below = index == 0 or self._ts_keys[index - 1] < ts_key
                above = index == len(self._ordered) or ts_key < self._ts_keys[index]
                if below and above:
                    self._ordered.insert(index, key)
                    self._ts_keys.insert(index, ts_key)
                    self.members.add(key)

    def _admissible(self, key: str) -> bool:
        # Array-index keys never: a dict holding two of them needs JavaScript's numeric order.
        return (
            len(key) <= self.MAX_KEY_LENGTH and key != "__proto__" and not _is_array_index(key)
        )


_known_keys = _KnownKeys()


def _fast_form(value: Any) -> Any:
    """What orjson may serialize (sorted keys, strict integers) to get the TypeScript text.

    That is ``value`` itself, or a copy in which the containers holding floats orjson
    misprints (and their ancestors) are replaced; ``_NOT_FAST`` when the general path
    must decide (odd keys or types, NaN, nesting past ``_MAX_FAST_DEPTH``, cycles).
    The caller's value is never changed.
    """
    kind = type(value)
    if kind is dict or kind is list:
        return _fast_container(value, 0)
    if kind is float and not _float_is_fast(value):
        return _fast_float(value)
    return value if kind is str or kind is int or kind is bool or value is None else _NOT_FAST


def _fast_container(
    node: Any, depth: int, _known: Callable[[Any], bool] = _known_keys.members.issuperset
) -> Any:
    # Recursion keeps the parent chain for free: a container is copied only when
    # something below it changed (copy on write), so one pass serves both cases.
    # ``_known`` is bound once (the set is only ever mutated in place): this runs for
    # every container of every payload, and a local lookup is the cheapest there is.
    if type(node) is dict:
        if not _known(node) and not _keys_in_ts_order(node):
            return _NOT_FAST
        children: Any = node.values()
    else:
        children = node
    for child in children:
        kind = type(child)
        if kind is str:
            continue
        if kind is dict or kind is list:
            if depth >= _MAX_FAST_DEPTH:
                return _NOT_FAST
            new = _fast_container(child, depth + 1)
            if new is child:
                continue
        elif kind is int or kind is bool or child is None:
            continue
        elif kind is float:
            if 1e-5 <= abs(child) < 1e16 and not child.is_integer():
                continue
            new = _fast_float(child)
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        return _patched(node, child, new, depth)
    return node


def _patched(node: Any, changed: Any, new: Any, depth: int) -> Any:
    """A copy of ``node`` from its first changed child on; earlier children were checked."""
    copy = node.copy()
    slots = iter(node.items() if type(node) is dict else enumerate(node))
    for slot, child in slots:
        if child is changed:
            copy[slot] = new
            break
    for slot, child in slots:
        kind = type(child)
        if kind is dict or kind is list:
            new = _fast_child(child, depth)
        elif kind is float:
            new = child if _float_is_fast(child) else _fast_float(child)
        elif kind is str or kind is int or kind is bool or child is None:
            continue
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        if new is not child:
            copy[slot] = new
    return copy


def _fast_child(child: Any, depth: int) -> Any:
    if depth >= _MAX_FAST_DEPTH:
        return _NOT_FAST
    return _fast_container(child, depth + 1)


def _fast_float(value: float) -> Any:
    """The JavaScript form of a float orjson would misprint; NaN/Infinity are not fast."""
    if not math.isfinite(value):
        return _NOT_FAST  # the general path names the path in its error
    return _js_float(value, "$")


def _float_is_fast(value: float) -> bool:
    """orjson prints exactly what JavaScript prints: finite, non-integral, 1e-5 <= |x| < 1e16."""
    return 1e-5 <= abs(value) < 1e16 and not value.is_integer()


def _keys_in_ts_order(node: dict[Any, Any]) -> bool:
    """Whether orjson's code-point key order is the TypeScript order for this dict."""
    keys = tuple(node)
    ordered = _order_memo.get(keys)
    if ordered is None:
        ordered = _memo_order(keys)
    return ordered


def _memo_order(keys: tuple[Any, ...]) -> bool:
    ordered = _code_point_order_is_ts_order(keys)
    size = sum(len(key) if type(key) is str else 1 for key in keys)
    if len(keys) > _MEMO_MAX_KEYS or size > _MEMO_MAX_CHARS:
        return ordered  # payload-sized key sets are checked each time, never kept
    if len(_order_memo) >= _ORDER_MEMO_LIMIT:
        _order_memo.clear()
    _order_memo[keys] = ordered
    if ordered:
        _known_keys.learn(keys)
    return ordered


def _code_point_order_is_ts_order(keys: tuple[Any, ...]) -> bool:
    if not all(type(key) is str for key in keys):
        return False
    if "__proto__" in keys:
        return False
    if len(keys) > 1 and any(_is_array_index(key) for key in keys):
        return False
    lowered = [_ts_sort_key(key) for key in keys]
    if len(set(lowered)) != len(keys):
        # Keys equal after lower-casing keep insertion order in TypeScript.
        return False
    return sorted(keys) == sorted(keys, key=_ts_sort_key)


# ------------------------------------------------------------------------ general path


def _ts_sort_key(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as JavaScript compares code units.
    return key.lower().encode("utf-16-be", "surrogatepass")


def _is_array_index(key: str) -> bool:
    return (
        key.isascii()
        and key.isdigit()
        and (key == "0" or key[0] != "0")
        and int(key) <= _MAX_ARRAY_INDEX
    )


def _ts_ordered_keys(keys: list[str]) -> list[str]:
    ordered = sorted(keys, key=_ts_sort_key)
    indices = [key for key in ordered if _is_array_index(key)]
    if not indices:
        return ordered
    indices.sort(key=int)
    return indices + [key for key in ordered if not _is_array_index(key)]


def _to_js(value: Any, serializer: Serializer | None, strict_integers: bool = False) -> Any:
    """Rebuild ``value`` as plain JSON values in TypeScript order (iteratively)."""
    root: list[Any] = [None]
    # Work items: (value, container to write into, slot, path, depth)
    work: list[tuple[Any, Any, Any, str, int]] = [(value, root, 0, "$", 0)]
    while work:
        node, target, slot, path, depth = work.pop()
        if depth > MAX_DEPTH:
            raise PayloadError(
                f"payload nested deeper than {MAX_DEPTH} levels at {path}: flatten it or "
                "select a smaller part with event_key_jmespath",
                path=path,
            )
        node = _plain(node, path, serializer, strict_integers)
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            target[slot] = out
            keys = list(node)
            for key in keys:
                if not isinstance(key, str):
                    raise PayloadError(
                        f"object key {key!r} at {path} is a {type(key).__name__}; JSON object "
                        "keys must be strings",
                        path=path,
                    )
                _check_string(key, f"{path} (key {key!r})")
            for key in _ts_ordered_keys(keys):
                if key == "__proto__":
                    continue
                out[key] = None
                work.append((node[key], out, key, _child_path(path, key), depth + 1))
        elif isinstance(node, list):
            items: list[Any] = [None] * len(node)
            target[slot] = items
            for index, item in enumerate(node):
                work.append((item, items, index, f"{path}[{index}]", depth + 1))
        else:
            target[slot] = node
    return root[0]


def _plain(value: Any, path: str, serializer: Serializer | None, strict: bool = False) -> Any:
    """Map one node to a JSON scalar (final), or a dict/list whose children are mapped later."""
    kind = type(value)
    if kind is str:
        _check_string(value, path)
        return value
    if value is None or kind is bool:
        return value
    if kind is dict or kind is list:
        return value
    if kind is tuple:
        return list(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _js_int(int(value), path, strict)
    if isinstance(value, float):
        return _js_float(float(value), path)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PayloadError(f"{value} at {path} is not a JSON number", path=path)
        return _js_float(float(value), path)
    if isinstance(value, enum.Enum):
        return _plain(value.value, path, serializer, strict)
    if isinstance(value, str):
        return _plain(str(value), path, serializer, strict)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if serializer is not None:
        converted = serializer(value)
        if converted is value:
            raise PayloadError(
                f"the serializer returned {type(value).__name__} at {path} unchanged; it must "
                "return JSON values",
                path=path,
            )
        return _plain(converted, path, None, strict)
    raise PayloadError(
        f"{type(value).__name__} at {path} is not JSON: convert it first, or pass a "
        "serializer (Options(serializer=...)) that turns it into JSON values",
        path=path,
    )


def _js_int(value: int, path: str, strict: bool) -> Any:
    if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER:
        return value
    if strict:
        raise PayloadError(
            f"integer {value} at {path} is beyond ±(2**53-1): hashed as a float64 (as the "
            "TypeScript port does) it would share a key with its neighbours. Send it as a "
            "string, or set Options(integer_precision='float64') for TypeScript parity",
            path=path,
        )
    try:
        as_double = float(value)
    except OverflowError:
        raise PayloadError(
            f"integer at {path} is too large for a JSON number (beyond float64)", path=path
        ) from None
    return orjson.Fragment(js_number(as_double))


def _js_float(value: float, path: str) -> Any:
    if not math.isfinite(value):
        raise PayloadError(
            f"{value} at {path} is not a JSON number: replace NaN/Infinity before hashing",
            path=path,
        )
    if value.is_integer():
        if abs(value) <= _MAX_SAFE_INTEGER:
            return int(value)
    elif 1e-5 <= abs(value) < 1e16:
        return value  # orjson prints these exactly as JavaScript does
    return orjson.Fragment(js_number(value))


def _check_string(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"string at {path} contains a lone surrogate at index {exc.start}: it is not "
            "valid Unicode and cannot be hashed like the TypeScript port does",
            path=path,
        ) from None


def _dumps_deep(plain: Any) -> bytes:
    """Serialize a value already in TypeScript form without recursion (slow, rarely used)."""
    out: list[bytes] = []
    stack: list[Any] = [plain]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is bytes:  # punctuation pushed below; values are never bytes here
            out.append(node)
        elif kind is dict:
            stack.append(b"}")
            items = list(node.items())
            for index in range(len(items) - 1, -1, -1):
                key, item = items[index]
                stack.append(item)
                stack.append(orjson.dumps(key) + b":")
                if index:
                    stack.append(b",")
            stack.append(b"{")
        elif kind is list:
            stack.append(b"]")
            for index in range(len(node) - 1, -1, -1):
                stack.append(node[index])
                if index:
                    stack.append(b",")
            stack.append(b"[")
        else:
            out.append(orjson.dumps(node))
    return b"".join(out)


def _child_path(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{orjson.dumps(key).decode()}]"
