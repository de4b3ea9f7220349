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

from collections.abc import Callable
from typing import Any, Final

import orjson

from idempotency_async.canonical._numbers import js_float
from idempotency_async.canonical._orders import KeyOrder, cached_order, learn_order

_SORTED: Final = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_AS_GIVEN: Final = orjson.OPT_STRICT_INTEGER
# Below orjson's recursion limit of 255; deeper values and cycles go to the general path.
_MAX_DEPTH: Final = 200
_NOT_FAST: Final[Any] = object()

_Form = Callable[[Any, int], Any]


def fast_bytes(value: Any) -> bytes | None:
    """The canonical text of ``value``, or ``None`` when the general path must decide."""
    kind = type(value)
    try:
        if kind is dict:
            entry = _order_of(value)
            if entry is None:
                return None
            if entry.sortable:
                form = _walk(value, value.values(), 0, _sorted_form)
                return None if form is _NOT_FAST else orjson.dumps(form, option=_SORTED)
            form = _as_ordered(value, entry, 0)
            return None if form is _NOT_FAST else orjson.dumps(form, option=_AS_GIVEN)
        if kind is list:
            form = _walk(value, value, 0, _sorted_form)
            return None if form is _NOT_FAST else orjson.dumps(form, option=_SORTED)
        if kind is float:
            form = js_float(value)
            return None if form is None else orjson.dumps(form)
        if kind is str or kind is int or kind is bool or value is None:
            return orjson.dumps(value, option=_SORTED)
    except orjson.JSONEncodeError:
        return None  # lone surrogate, integer beyond 2**53: the general path decides
    return None


def _order_of(node: dict[Any, Any]) -> KeyOrder | None:
    keys = tuple(node)
    entry = cached_order(keys)
    return entry if entry is not None else learn_order(keys)


def _sorted_form(node: dict[Any, Any], depth: int) -> Any:
    """``node`` (or a patched copy) for orjson to write with sorted keys, or a Fragment."""
    keys = tuple(node)
    entry = cached_order(keys)
    if entry is None:
        entry = learn_order(keys)
        if entry is None:
            return _NOT_FAST
    if entry.sortable:
        return _walk(node, node.values(), depth, _sorted_form)
    ordered = _as_ordered(node, entry, depth)
    if ordered is _NOT_FAST:
        return ordered
    return orjson.Fragment(orjson.dumps(ordered, option=_AS_GIVEN))


def _ordered_form(node: dict[Any, Any], depth: int) -> Any:
    """``node`` (or a copy) with every object's members in TypeScript order."""
    keys = tuple(node)
    entry = cached_order(keys)
    if entry is None:
        entry = learn_order(keys)
        if entry is None:
            return _NOT_FAST
    return _as_ordered(node, entry, depth)


def _as_ordered(node: dict[Any, Any], entry: KeyOrder, depth: int) -> Any:
    if entry.in_order:
        return _walk(node, node.values(), depth, _ordered_form)
    # A new dict in TypeScript order, built at C speed; it is ours, so patch it in place.
    out = entry.rebuilt(node)
    for key, child in out.items():
        kind = type(child)
        if kind is str or kind is int or kind is bool or child is None:
            continue
        if kind is dict:
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            new = _ordered_form(child, depth + 1)
        elif kind is list:
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            new = _walk(child, child, depth + 1, _ordered_form)
        elif kind is float:
            if 1e-5 <= child < 1e16 and child % 1.0:
                continue
            new = js_float(child)
            if new is None:
                return _NOT_FAST
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        if new is not child:
            out[key] = new
    return out


def _walk(node: Any, children: Any, depth: int, form: _Form) -> Any:
    """``node`` if none of ``children`` changes, else a patched copy; ``_NOT_FAST``.

    ``form`` is what objects below become: :func:`_sorted_form` while orjson sorts keys,
    :func:`_ordered_form` inside a subtree written in TypeScript order.
    """
    # Recursion keeps the parent chain for free: a container is copied only when
    # something below it changed (copy on write), so one pass serves both cases.
    for child in children:
        kind = type(child)
        if kind is str:
            continue
        if kind is dict:
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            new = form(child, depth + 1)
            if new is child:
                continue
        elif kind is list:
            if depth >= _MAX_DEPTH:
                return _NOT_FAST
            new = _walk(child, child, depth + 1, form)
            if new is child:
                continue
        elif kind is int or kind is bool or child is None:
            continue
        elif kind is float:
            # The common float inline: positive, not integral, printed alike by both.
            if 1e-5 <= child < 1e16 and child % 1.0:
                continue
            new = js_float(child)
            if new is child:
                continue
            if new is None:
                return _NOT_FAST
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        return _patched(node, child, new, depth, form)
    return node


def _patched(node: Any, changed: Any, new: Any, depth: int, form: _Form) -> Any:
    """A copy of ``node`` from its first changed child on; earlier children were checked."""
    copy = node.copy()
    slots = iter(node.items() if type(node) is dict else enumerate(node))
    for slot, child in slots:
        if child is changed:
            copy[slot] = new
            break
    for slot, child in slots:
        kind = type(child)
        if kind is str or kind is int or kind is bool or child is None:
            continue
        if kind is dict:
            new = form(child, depth + 1) if depth < _MAX_DEPTH else _NOT_FAST
        elif kind is list:
            new = _walk(child, child, depth + 1, form) if depth < _MAX_DEPTH else _NOT_FAST
        elif kind is float:
            new = js_float(child)
            if new is None:
                return _NOT_FAST
        else:
            return _NOT_FAST
        if new is _NOT_FAST:
            return new
        if new is not child:
            copy[slot] = new
    return copy
