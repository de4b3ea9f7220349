"""Redaction of a stored HTTP response: declared header and body fields kept out of the store.

A middleware's :class:`~idempotency_async.Redaction` names fields of the response as the
JSON value ``{"headers": {name: value}, "body": <the JSON body>}``: ``headers."x-token"``
(header names in lower case) and ``body.credentials.secret``.  The client whose request
ran gets the response as the endpoint sent it; the stored one (and so every replay) has
those fields removed and is marked redacted.  A body that a declared body field cannot be
looked for in — not JSON, or sent compressed — is not stored at all (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson

from idempotency_async._stored_redaction import Redaction, remove
from idempotency_async.errors import ConfigError

__all__ = ["NEVER_STORED", "Redacted", "RouteRedaction", "check_redaction", "redact_response"]

NEVER_STORED: Final = "never stored: the route is declared Redaction(never_store=True)"
_IDENTITY: Final = frozenset({"", "identity"})

Redacted = tuple[list[tuple[str, str]], bytes, bool]
"""The headers and body to store, and whether anything was removed."""

RouteRedaction = Redaction | Mapping[str, Redaction]
"""One redaction for every route, or one per route template (routes not named: none)."""


def check_redaction(redaction: Any) -> RouteRedaction | None:
    """``redaction`` (a mapping frozen) if every field it declares is a header or a body
    field, else ConfigError."""
    if redaction is None or isinstance(redaction, Redaction):
        return _checked(redaction)
    if not isinstance(redaction, Mapping):
        raise ConfigError(
            "redaction must be an idempotency_async.Redaction, or a mapping of route "
            f"templates to one, got {type(redaction).__name__}"
        )
    routes: dict[str, Redaction] = {}
    for route, declared in redaction.items():
        if not isinstance(route, str):
            raise ConfigError(f"redaction's routes are route templates (str), got {route!r:.60}")
        checked = _checked(declared)
        if checked is not None:
            routes[route] = checked
    return MappingProxyType(routes)


def _checked(redaction: Any) -> Redaction | None:
    if redaction is None:
        return None
    if not isinstance(redaction, Redaction):
        raise ConfigError(
            f"redaction must be an idempotency_async.Redaction, got {type(redaction).__name__}"
        )
    for path in redaction.paths:
        first, rest = path.steps[0], path.steps[1:]
        header = first == "headers" and len(rest) == 1 and isinstance(rest[0], str)
        if not header and not (first == "body" and rest):
            raise ConfigError(
                f"redacted field {path.text!r} names no part of an HTTP response: use "
                "'headers.\"<name>\"' or 'body.<path>' (e.g. 'body.credentials.secret')"
            )
    return redaction


def redact_response(
    redaction: Redaction, headers: list[tuple[str, str]], body: bytes
) -> Redacted | str:
    """The headers and body to store with the declared fields removed, or why the body
    cannot be stored (a declared body field could not be looked for in it)."""
    removed = False
    names = {str(path.steps[1]).lower() for path in redaction.paths if path.steps[0] == "headers"}
    if any(name in names for name, _ in headers):
        headers = [(name, value) for name, value in headers if name not in names]
        removed = True
    body_paths = [path.steps[1:] for path in redaction.paths if path.steps[0] == "body"]
    if not body_paths or not body:
        return headers, body, removed
    encoding = next((value for name, value in headers if name == "content-encoding"), "")
    if encoding.strip().lower() not in _IDENTITY:
        return f"declared body fields cannot be removed from a {encoding!r:.40}-encoded body"
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "declared body fields cannot be removed from a body that is not JSON"
    changed = False
    for steps in body_paths:
        value, hit = remove(value, steps)
        changed = changed or hit
    if not changed:
        return headers, body, removed
    # The ETag described the body as sent, not as stored.
    kept = [(name, text) for name, text in headers if name != "etag"]
    return kept, orjson.dumps(value), True
