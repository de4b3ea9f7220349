"""The fast path: orjson writes the TypeScript text after one Python pass over the value.

The pass checks every value's type and visits every object and array once.  Most objects
keep their members where they are, because orjson's ``OPT_SORT_KEYS`` (code-point order)
already is their TypeScript order (:mod:`._orders`); most floats too, because orjson
already prints them as JavaScript does (:mod:`._numbers`).  What differs is replaced copy
on write — only the replaced value's containers and their ancestors are copied, on the
way back up, and the caller's value is never changed:

* a float orjson would misprint by the ``int`` or ``orjson.Fragment`` JavaScript's text
  calls for;
* an object whose code-point order is not its TypeScript order by an ``orjson.Fragment``
  of its subtree, written by a separate ``orjson.dumps`` without key sorting after the
  subtree was rebuilt with every object's members in TypeScript order.  Objects below it
  are rebuilt only if their own order is not already the TypeScript order.

Anything else unusual (a type that is not plain JSON, a non-string key, NaN, a lone
surrogate, an integer beyond 2**53, nesting past ``_MAX_DEPTH``, a cycle) makes
:func:`fast_bytes` return ``None``: the general path then decides, and it also produces
every error message.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from idempotency_async.canonical._numbers import js_float
from idempotency_async.canonical._orders import (
    KeyOrder,
    cached_order,
    completed,
    learn_order,
)

_SORTED: Final = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_AS_GIVEN: Final = orjson.OPT_STRICT_INTEGER
# Below orjson's recursion limit of 255; deeper values and cycles go to the general path.
_MAX_DEPTH: Final = 200
_NOT_FAST: Final[Any] = object()

# Types whose values orjson writes exactly as JavaScript does (integers beyond 2**53 and
# lone surrogates make orjson raise, which sends the value to the general path).
_LEAVES: Final = frozenset({str, int, bool, type(None)})


def fast_bytes(value: Any) -> bytes | None:
    """The canonical text of ``value``, or ``None`` when the general path must decide."""
    kind = type(value)
    try:
        if kind is dict:
            keys = tuple(value)  # (_order_of inlined: every key derivation comes here)
            entry = cached_order(keys)
            if entry is None:
                entry = learn_order(keys)
                if entry is None:
                    return None
            if entry.sortable:
                form = _sorted(value, value.values(), 0)
                return None if form is _NOT_FAST else orjson.dumps(form, option=_SORTED)
            form = _ordered(value, 0, entry)
            return None if form is _NOT_FAST else orjson.dumps(form, option=_AS_GIVEN)
        if kind is list:
            form = _sorted(value, value, 0)
            return None if form is _NOT_FAST else orjson.dumps(form, option=_SORTED)
        if kind is float:
            form = js_float(value)
            return None if form is None else orjson.dumps(form)
        if kind is str or kind is int or kind is bool or value is None:
            return orjson.dumps(value, option=_SORTED)
    except orjson.JSONEncodeError:
        return None  # lone surrogate, integer beyond 2**53: the general path decides
    except RecursionError:
        return None  # a deep value met a deep caller; the general path is iterative
    return None


def _order_of(node: dict[Any, Any]) -> KeyOrder | None:
    keys = tuple(node)
    entry = cached_order(keys)
    return entry if entry is not None else learn_order(keys)


# ------------------------------------------------------------- while orjson sorts keys


def _sorted(node: Any, children: Any, depth: int) -> Any:
    """``node`` if none of ``children`` changes, else a patched copy; or ``_NOT_FAST``.

    ``node`` is written by orjson with sorted keys; so are the objects below it, except
    those whose code-point order is not their TypeScript order: they become Fragments.
    """
    # Recursion keeps the parent chain for free: a container is copied only when
    # something below it changed (copy on write), so one pass serves both cases.  This
    # loop is the hot path: one-child work is inlined rather than left to _sorted_child.
    for child in children:
        kind = type(child)
        if kind is str:
            continue
        if kind is dict:
            keys = tuple(child)
            entry = cached_order(keys)
            if entry is None:
                entry = learn_order(keys)
                if entry is None:
                    return _NOT_FAST
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            if entry.sortable:
                new = _sorted(child, child.values(), depth + 1)
                if new is child:
                    continue
            else:
                new = _fragment(child, depth + 1, entry)
        elif kind in _LEAVES:
            continue
        elif kind is float:
            # The common float inline: 1e-5 <= |x| < 1e16, not integral: printed alike.
            if (1e-5 <= child < 1e16 or -1e16 < child <= -1e-5) and child % 1.0:
                continue
            new = js_float(child)
            if new is child:
                continue
            if new is None:
                return _NOT_FAST
        elif kind is list:
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            new = _sorted(child, child, depth + 1)
            if new is child:
                continue
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
        if kind in _LEAVES:
            continue
        new = _sorted_child(child, kind, depth)
        if new is _NOT_FAST:
            return new
        if new is not child:
            copy[slot] = new
    return copy


def _sorted_child(child: Any, kind: type, depth: int) -> Any:
    """What a non-string child of a sorted-mode container becomes (``_sorted``'s loop body)."""
    if kind is float:
        new = js_float(child)
        return _NOT_FAST if new is None else new
    if depth >= _MAX_DEPTH:
        return _NOT_FAST
    if kind is list:
        return _sorted(child, child, depth + 1)
    if kind is not dict:
        return _NOT_FAST
    entry = _order_of(child)
    if entry is None:
        return _NOT_FAST
    if entry.sortable:
        return _sorted(child, child.values(), depth + 1)
    return _fragment(child, depth + 1, entry)


def _fragment(node: dict[Any, Any], depth: int, entry: KeyOrder) -> Any:
    """An object whose keys orjson must not sort: its subtree, written in TypeScript order."""
    ordered = _ordered(node, depth, entry)
    if ordered is _NOT_FAST:
        return ordered
    return orjson.Fragment(orjson.dumps(ordered, option=_AS_GIVEN))


# ------------------------------------------------------- while orjson keeps key order


def _rebuilding(keys: tuple[Any, ...]) -> KeyOrder | None:
    """The key order of an object, with these keys, about to be rebuilt in that order."""
    entry = cached_order(keys)
    if entry is None:
        entry = learn_order(keys)
        if entry is None:
            return None
    if entry.template is None and not entry.in_order:
        entry = completed(keys, entry)
    return entry


def _ordered(node: dict[Any, Any], depth: int, entry: KeyOrder) -> Any:
    """``node`` (or a copy) with its members, and every object's below, in TypeScript order.

    ``entry`` is the order of ``node`` with its template (unless it is in order).
    """
    if entry.in_order:
        out, owned = node, False
    else:
        # A new dict in TypeScript order, built at C speed; it is ours to patch in place.
        out, owned = entry.template | node, True  # type: ignore[operator]
        if entry.has_proto:
            del out["__proto__"]  # the union appended it; JavaScript never writes it
    for key, child in out.items():
        kind = type(child)
        if kind in _LEAVES:
            continue
        if kind is float:
            if (1e-5 <= child < 1e16 or -1e16 < child <= -1e-5) and child % 1.0:
                continue
            new = js_float(child)
            if new is None:
                return _NOT_FAST
        elif depth >= _MAX_DEPTH:
            return _NOT_FAST
        elif kind is dict:
            keys = tuple(child)
            inner = cached_order(keys)
            if inner is None or (inner.template is None and not inner.in_order):
                inner = _rebuilding(keys)
                if inner is None:
                    return _NOT_FAST
            new = _ordered(child, depth + 1, inner)
        elif kind is list:
            new = _ordered_list(child, depth + 1)
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        if new is not child:
            if not owned:
                out, owned = out.copy(), True  # the loop goes on over the original's items
            out[key] = new
    return out


def _ordered_list(node: list[Any], depth: int) -> Any:
    """``node`` (or a copy) with every object in it, and below, in TypeScript order.

    Neighbours with the same keys (a batch) share one key-order lookup: comparing two key
    tuples that ``json.loads`` built from the same strings is a pointer comparison per key.
    """
    out = node
    last_keys: tuple[Any, ...] = ()
    entry: KeyOrder | None = None
    for index, child in enumerate(node):
        kind = type(child)
        if kind in _LEAVES:
            continue
        if kind is float:
            if (1e-5 <= child < 1e16 or -1e16 < child <= -1e-5) and child % 1.0:
                continue
            new = js_float(child)
            if new is None:
                return _NOT_FAST
        elif depth >= _MAX_DEPTH:
            return _NOT_FAST
        elif kind is dict:
            keys = tuple(child)
            if entry is None or keys != last_keys:
                entry = _rebuilding(keys)
                if entry is None:
                    return _NOT_FAST
                last_keys = keys
            new = _ordered(child, depth + 1, entry)
        elif kind is list:
            new = _ordered_list(child, depth + 1)
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        if new is not child:
            if out is node:
                out = node.copy()
            out[index] = new
    return out
