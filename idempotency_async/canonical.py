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

import base64
import dataclasses
import enum
import hashlib
import math
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
    "idempotency_key",
    "js_number",
]

Serializer = Callable[[Any], Any]
"""Turns an object the canonicalizer does not know into JSON values (dict, list, str, …)."""

HASH_ALGORITHMS: Final = frozenset({"md5", "sha1", "sha256", "sha384", "sha512"})

MAX_DEPTH: Final = 512
"""Deepest nesting accepted; deeper payloads raise :class:`PayloadError` (no RecursionError)."""

_MAX_SAFE_INTEGER: Final = 2**53 - 1
_MAX_ARRAY_INDEX: Final = 2**32 - 2
_FAST_OPTIONS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_ORDER_MEMO_LIMIT: Final = 4096
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


def canonical_bytes(value: Any, *, serializer: Serializer | None = None) -> bytes:
    """:func:`canonical_json` as UTF-8 bytes, ready to hash."""
    if serializer is None and _fast_path_applies(value):
        try:
            return orjson.dumps(value, option=_FAST_OPTIONS)
        except orjson.JSONEncodeError:
            pass  # lone surrogate: the general path names it
    return orjson.dumps(_to_js(value, serializer))


def digest(text: str | bytes, algorithm: str = "md5") -> str:
    """Padded standard Base64 of the ``algorithm`` digest of ``text`` (UTF-8)."""
    data = text.encode() if isinstance(text, str) else text
    return digest_bytes(data, algorithm)


def digest_bytes(data: bytes, algorithm: str = "md5") -> str:
    if algorithm not in HASH_ALGORITHMS:
        raise ConfigError(
            f"unknown hash algorithm {algorithm!r}: use one of {', '.join(sorted(HASH_ALGORITHMS))}"
        )
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode("ascii")


def idempotency_key(prefix: str, value_digest: str) -> str:
    """The record key ``<prefix>#<digest>`` (``#<digest>`` with an empty prefix)."""
    return f"{prefix}#{value_digest}"


def js_number(value: float) -> str:
    """Format a finite float as JavaScript's ``Number.prototype.toString`` does."""
    if value == 0:
        return "0"
    text = repr(abs(value))
    mantissa, _, exp_text = text.partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # Decimal point position n: value = 0.d1d2... x 10^n
    n = len(int_part) + (int(exp_text) if exp_text else 0)
    if int_part == "0":
        n -= len(frac_part) - len(frac_part.lstrip("0"))
    digits = digits.rstrip("0")
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


def _fast_path_applies(value: Any) -> bool:
    """True when orjson's sorted output is already the TypeScript text for ``value``.

    Walks containers only as deep as needed; leaves are type-checked, never copied.
    """
    stack = [value]
    # A cyclic value would loop forever here; past the budget the general path
    # reports it as too deep.
    budget = 1_000_000
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            keys = tuple(node)
            ordered = _order_memo.get(keys)
            if ordered is None:
                ordered = _memo_order(keys)
            if not ordered:
                return False
            children: Any = node.values()
        elif kind is list:
            children = node
        else:
            return _leaf_is_fast(node)
        for child in children:
            ckind = type(child)
            if ckind is str or ckind is int or ckind is bool or child is None:
                continue
            if ckind is float:
                if not (1e-5 <= abs(child) < 1e16) or child.is_integer():
                    return False
            elif ckind is dict or ckind is list:
                stack.append(child)
            else:
                return False
        budget -= 1
        if budget < 0:
            return False
    return True


def _leaf_is_fast(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return 1e-5 <= abs(value) < 1e16 and not value.is_integer()
    return kind is str or kind is int or kind is bool or value is None


def _memo_order(keys: tuple[str, ...]) -> bool:
    if len(_order_memo) >= _ORDER_MEMO_LIMIT:
        _order_memo.clear()
    ordered = _code_point_order_is_ts_order(keys)
    _order_memo[keys] = ordered
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


def _to_js(value: Any, serializer: Serializer | None) -> Any:
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
        node = _plain(node, path, serializer)
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


def _plain(value: Any, path: str, serializer: Serializer | None) -> Any:
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
        return _js_int(int(value), path)
    if isinstance(value, float):
        return _js_float(float(value), path)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PayloadError(f"{value} at {path} is not a JSON number", path=path)
        return _js_float(float(value), path)
    if isinstance(value, enum.Enum):
        return _plain(value.value, path, serializer)
    if isinstance(value, str):
        return _plain(str(value), path, serializer)
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
        return _plain(converted, path, None)
    raise PayloadError(
        f"{type(value).__name__} at {path} is not JSON: convert it first, or pass a "
        "serializer (Options(serializer=...)) that turns it into JSON values",
        path=path,
    )


def _js_int(value: int, path: str) -> Any:
    if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER:
        return value
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
    if value.is_integer() and abs(value) <= _MAX_SAFE_INTEGER:
        return int(value)
    if 1e-5 <= abs(value) < 1e16:
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


def _child_path(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{orjson.dumps(key).decode()}]"
