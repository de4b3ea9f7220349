"""Payload variants: copies of a payload with one field changed, and answers compared while
ignoring the parts a handler makes up on every run (ids, timestamps).

The kit keeps the variants whose key is the payload's own: if a duplicate sending one gets
the payload's answer replayed, although the variant alone is answered differently, the
key expression ignores a field that changes the response.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

__all__ = ["differing", "same_apart_from", "variants_of"]

Path = tuple[Any, ...]


def variants_of(payload: Any, limit: int = 8) -> list[tuple[Path, Any]]:
    """Up to ``limit`` copies of ``payload`` with one leaf changed, with the leaf's path."""
    found: list[tuple[Path, Any]] = []
    for path, value in _leaves(payload, ()):
        changed = _changed(value)
        if changed is _SAME or not path:
            continue
        variant = copy.deepcopy(payload)
        target = variant
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = changed
        found.append((path, variant))
        if len(found) >= limit:
            break
    return found


_SAME = object()


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "-other"
    if value is None:
        return "other"
    return _SAME


def _leaves(value: Any, path: Path, depth: int = 0) -> Iterator[tuple[Path, Any]]:
    if isinstance(value, dict) and depth < 4:
        for key, item in value.items():
            yield from _leaves(item, (*path, key), depth + 1)
    elif isinstance(value, list) and depth < 4:
        for index, item in enumerate(value[:3]):
            yield from _leaves(item, (*path, index), depth + 1)
    else:
        yield path, value


def differing(first: Any, second: Any, path: Path = ()) -> set[Path]:
    """The paths at which two JSON values differ (a whole subtree counts once)."""
    if isinstance(first, dict) and isinstance(second, dict):
        paths: set[Path] = set()
        for key in first.keys() | second.keys():
            if key not in first or key not in second:
                paths.add((*path, key))
            else:
                paths |= differing(first[key], second[key], (*path, key))
        return paths
    if isinstance(first, list) and isinstance(second, list) and len(first) == len(second):
        paths = set()
        for index, (a, b) in enumerate(zip(first, second, strict=True)):
            paths |= differing(a, b, (*path, index))
        return paths
    return set() if first == second else {path}


def same_apart_from(first: Any, second: Any, noise: set[Path]) -> set[Path]:
    """Where ``first`` and ``second`` differ outside the paths in ``noise`` (and below)."""
    return {
        path
        for path in differing(first, second)
        if not any(path[: len(skip)] == skip for skip in noise)
    }
