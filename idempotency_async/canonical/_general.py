"""The general path: any accepted value rebuilt in TypeScript form, or a precise error.

A direct port of the TypeScript rules, iterative so that no nesting depth up to
:data:`MAX_DEPTH` can overflow the stack.  It accepts what the fast path declines —
``Decimal``, ``Enum``, dataclasses, tuples, mappings, ``str``/``int`` subclasses, objects
a serializer converts — and is the only place that raises :class:`PayloadError`, with the
path of the offending value.  It is also the reference the fast path is tested against.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from idempotency_async.canonical._numbers import MAX_SAFE_INTEGER, checked_js_float, js_int
from idempotency_async.canonical._orders import ts_order
from idempotency_async.errors import PayloadError

Serializer = Callable[[Any], Any]
"""Turns an object the canonicalizer does not know into JSON values (dict, list, str, …)."""

MAX_DEPTH: Final = 512
"""Deepest nesting accepted; deeper payloads raise :class:`PayloadError` (no RecursionError)."""


def general_bytes(
    value: Any, serializer: Serializer | None = None, strict_integers: bool = False
) -> bytes:
    """The canonical text of ``value`` by the general path (raises :class:`PayloadError`)."""
    plain = to_js(value, serializer, strict_integers)
    try:
        return orjson.dumps(plain)
    except orjson.JSONEncodeError:
        return _dumps_deep(plain)  # deeper than orjson's recursion limit (255 levels)


def to_js(value: Any, serializer: Serializer | None, strict_integers: bool = False) -> Any:
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
            for text, key in _member_order(node, path):
                out[text] = None
                work.append((node[key], out, text, _child_path(path, text), depth + 1))
        elif isinstance(node, list):
            items: list[Any] = [None] * len(node)
            target[slot] = items
            for index, item in enumerate(node):
                work.append((item, items, index, f"{path}[{index}]", depth + 1))
        else:
            target[slot] = node
    return root[0]


def _member_order(node: dict[Any, Any], path: str) -> list[tuple[str, Any]]:
    """The members' texts in TypeScript order, each with the key as ``node`` holds it."""
    texts: dict[str, Any] = {}
    for key in node:
        if not isinstance(key, str):
            raise PayloadError(
                f"object key {key!r} at {path} is a {type(key).__name__}; JSON object "
                "keys must be strings",
                path=path,
            )
        check_string(key, f"{path} (key {key!r})")
        # A ``str`` subclass (a str-valued Enum member, say) is written as its text, as
        # ``json.dumps`` writes it and as an Enum value is hashed.
        text = str.__str__(key)
        if text in texts:
            raise PayloadError(
                f"object at {path} has two keys written as {text!r} ({texts[text]!r} and "
                f"{key!r}): JSON members need distinct names",
                path=path,
            )
        texts[text] = key
    return [(text, texts[text]) for text in ts_order(tuple(texts))]


def _plain(value: Any, path: str, serializer: Serializer | None, strict: bool = False) -> Any:
    """Map one node to a JSON scalar (final), or a dict/list whose children are mapped later."""
    kind = type(value)
    if kind is str:
        check_string(value, path)
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
        return checked_js_float(float(value), path)
    # ``decimal`` is imported only by those who use it (it is not a small import): no
    # Decimal can exist before it is.
    decimal = sys.modules.get("decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise PayloadError(f"{value} at {path} is not a JSON number", path=path)
        return checked_js_float(float(value), path)
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
    if strict and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise PayloadError(
            f"integer {value} at {path} is beyond ±(2**53-1): hashed as a float64 (as the "
            "TypeScript port does) it would share a key with its neighbours. Send it as a "
            "string, or set Options(integer_precision='float64') for TypeScript parity",
            path=path,
        )
    form = js_int(value)
    if form is None:
        raise PayloadError(
            f"integer at {path} is too large for a JSON number (beyond float64)", path=path
        )
    return form


def check_string(text: str, path: str) -> None:
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
