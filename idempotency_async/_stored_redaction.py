"""Redaction of stored responses: declared fields kept out of the store.

Not :mod:`._redact` (credentials out of messages and logs): this module decides what of a
callback's *result* reaches the store.  A :class:`Redaction` is built once (its field
paths compiled, a bad one a :class:`~idempotency_async.errors.ConfigError`) and applied to
the JSON value about to be encoded for the store — before the store write, never after —
so the store, this process's cache and its waiting duplicates all get the same redacted
value, and the first caller keeps its own result untouched (the removal copies only the
containers on the way to a removed member).

A field path is the subset of JMESPath that names members: ``a.b``, ``"set-cookie"``,
``items[0].secret``, ``items[*].secret``, ``accounts.*.secret``; it ends with a member
name, and that member is removed from its object wherever the path finds it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

import jmespath
from jmespath.exceptions import JMESPathError

from idempotency_async.errors import ConfigError

__all__ = ["Each", "FieldPath", "Redaction", "Step", "compile_path", "remove"]


class Each(enum.Enum):
    """A wildcard step: every element of an array, or every value of an object."""

    ELEMENT = "[*]"
    VALUE = ".*"


Step: TypeAlias = "str | int | Each"
"""One step of a field path: a member name, an array index, or a wildcard."""


class FieldPath(NamedTuple):
    """A declared field: its expression as written, and its steps."""

    text: str
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Redaction:
    """What of a callback's result is kept out of the store.

    ``fields``: JMESPath paths to members removed from the stored response (e.g.
    ``"credentials.secret"``, ``"items[*].token"``); the caller whose call ran gets its
    whole result, every duplicate the redacted one.  ``never_store``: store no response at
    all — the key completes without one, and duplicates get the not-stored answer
    (:class:`~idempotency_async.errors.ResponseNotStoredError`, HTTP: the original status
    with ``Idempotency-Response-Stored: false``).  A path that is not a field path is a
    :class:`~idempotency_async.errors.ConfigError` here.

    .. versionadded:: 0.1.0
    """

    fields: Iterable[str] = ()
    never_store: bool = False
    paths: tuple[FieldPath, ...] = field(init=False, repr=False, compare=False)
    """The compiled ``fields`` (for integrations that redact their own envelopes)."""

    def __post_init__(self) -> None:
        if not isinstance(self.never_store, bool):
            raise ConfigError(f"never_store must be True or False, got {self.never_store!r}")
        texts = (self.fields,) if isinstance(self.fields, str) else tuple(self.fields)
        paths = tuple(compile_path(text) for text in texts)
        if self.never_store and paths:
            raise ConfigError(
                "Redaction(never_store=True) stores no response, so fields have nothing to "
                "redact: give one or the other"
            )
        object.__setattr__(self, "fields", tuple(path.text for path in paths))
        object.__setattr__(self, "paths", paths)

    def apply(self, value: Any) -> tuple[Any, tuple[str, ...]]:
        """``value`` without the declared fields (a copy where something was removed;
        ``value`` itself is never changed), and the fields that were found."""
        found: list[str] = []
        for path in self.paths:
            value, removed = remove(value, path.steps)
            if removed:
                found.append(path.text)
        return value, tuple(found)


def compile_path(text: Any) -> FieldPath:
    """The steps of a field path, or ConfigError saying what a field path is."""
    if not isinstance(text, str):
        raise ConfigError(f"a redacted field is a JMESPath string, got {type(text).__name__}")
    try:
        parsed = jmespath.compile(text).parsed
    except JMESPathError as exc:
        raise ConfigError(f"redacted field {text!r} is not a JMESPath expression: {exc}") from exc
    steps = _steps(dict(parsed), text)
    if not steps or not isinstance(steps[-1], str):
        raise ConfigError(
            f"redacted field {text!r} must end with a member name (e.g. 'credentials.secret'): "
            "the member is removed from its object"
        )
    return FieldPath(text, steps)


def _steps(node: dict[str, Any], text: str) -> tuple[Step, ...]:
    kind, children = node["type"], node.get("children", [])
    if kind == "field":
        return (node["value"],)
    if kind == "identity":
        return ()
    if kind == "subexpression":  # n-ary: a.b.c is one node of three fields
        return tuple(step for child in children for step in _steps(child, text))
    if kind == "index_expression" and children[1]["type"] == "index":
        return (*_steps(children[0], text), children[1]["value"])
    if kind == "projection" and children[0]["type"] != "flatten":
        return (*_steps(children[0], text), Each.ELEMENT, *_steps(children[1], text))
    if kind == "value_projection":
        return (*_steps(children[0], text), Each.VALUE, *_steps(children[1], text))
    raise ConfigError(
        f"redacted field {text!r} is not a field path: use member names, quoted names, "
        "[index], [*] and .* only (no functions, filters, slices or flattening)"
    )


def remove(value: Any, steps: tuple[Step, ...]) -> tuple[Any, bool]:
    """``value`` with the member ``steps`` names removed wherever found, and whether any
    was; the containers on the way are copied, ``value`` is never changed."""
    step, rest = steps[0], steps[1:]
    if isinstance(step, str):
        if not isinstance(value, dict) or step not in value:
            return value, False
        if not rest:
            copy = dict(value)
            del copy[step]
            return copy, True
        child, removed = remove(value[step], rest)
        if not removed:
            return value, False
        copy = dict(value)
        copy[step] = child
        return copy, True
    if isinstance(step, int):
        if not isinstance(value, list | tuple) or not -len(value) <= step < len(value):
            return value, False
        child, removed = remove(value[step], rest)
        if not removed:
            return value, False
        items = list(value)
        items[step] = child
        return items, True
    return _remove_each(value, step, rest)


def _remove_each(value: Any, each: Each, rest: tuple[Step, ...]) -> tuple[Any, bool]:
    if each is Each.ELEMENT and isinstance(value, list | tuple):
        results = [remove(item, rest) for item in value]
        if not any(removed for _, removed in results):
            return value, False
        return [item for item, _ in results], True
    if each is Each.VALUE and isinstance(value, dict):
        pairs = {name: remove(item, rest) for name, item in value.items()}
        if not any(removed for _, removed in pairs.values()):
            return value, False
        return {name: item for name, (item, _) in pairs.items()}, True
    return value, False
