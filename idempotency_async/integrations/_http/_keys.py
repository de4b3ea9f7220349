"""What a request is keyed by: its Idempotency-Key header and its scope.

::

    Idempotency-Key header ──> parse_key ──> request_scope {method, route, caller, key}

The route is the template the router matched (``/orders/{order_id}``), preceded on host-
or domain-routed routes by the host it matched (:func:`host_route`).
"""

from __future__ import annotations

from typing import Any, Final

from idempotency_async.integrations._http._responses import HttpResponse, Rejection, problem

__all__ = ["KEY_HEADER", "MAX_KEY_LENGTH", "host_route", "parse_key", "request_scope"]

KEY_HEADER: Final = "idempotency-key"
MAX_KEY_LENGTH: Final = 255
_DEFAULT_PORTS: Final = {"http": ":80", "ws": ":80", "https": ":443", "wss": ":443"}


def parse_key(values: list[str], *, required: bool) -> str | None:
    """The Idempotency-Key of a request, from all its header values (RFC 8941 sf-string).

    Accepts the quoted form (``"abc"``, with ``\\"`` and ``\\\\`` escapes) and, leniently,
    a bare value (``abc``).  Raises :class:`Rejection` (400) when invalid, or missing and
    ``required``.
    """
    if not values:
        if required:
            raise Rejection(
                _bad_key(
                    "this endpoint requires an Idempotency-Key header: send a "
                    "unique value (e.g. a UUID) per operation, and the same "
                    "value when retrying it"
                )
            )
        return None
    if len(values) > 1:
        raise Rejection(_bad_key("send exactly one Idempotency-Key header"))
    raw = values[0].strip(" \t")
    key = _unquote(raw) if raw.startswith('"') else _bare(raw)
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise Rejection(
            _bad_key(
                f"the Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters long, got {len(key)}"
            )
        )
    return key


def _unquote(raw: str) -> str:
    chars: list[str] = []
    index = 1
    while index < len(raw):
        char = raw[index]
        if char == "\\":
            nxt = raw[index + 1 : index + 2]
            if nxt not in ('"', "\\"):
                raise Rejection(
                    _bad_key('a quoted Idempotency-Key may only use the escapes \\" and \\\\')
                )
            chars.append(nxt)
            index += 2
            continue
        if char == '"':
            if index != len(raw) - 1:
                raise Rejection(
                    _bad_key("unexpected characters after the closing quote of the Idempotency-Key")
                )
            return "".join(chars)
        if not " " <= char <= "~":
            raise Rejection(_bad_key("the Idempotency-Key must be printable ASCII"))
        chars.append(char)
        index += 1
    raise Rejection(_bad_key("the quoted Idempotency-Key has no closing quote"))


def _bare(raw: str) -> str:
    for char in raw:
        if not "!" <= char <= "~" or char in '"\\':
            raise Rejection(
                _bad_key(
                    "the Idempotency-Key must be printable ASCII without spaces, quotes or "
                    'backslashes, or a quoted string such as "abc"'
                )
            )
    return raw


def _bad_key(detail: str) -> HttpResponse:
    return problem(400, "Invalid Idempotency-Key", detail)


def request_scope(method: str, route: str, caller: str | None, key: str) -> dict[str, Any]:
    """What the key is derived from: the request's method, route template, caller and key
    (also used by the command-line tool's ``key --http``)."""
    return {"method": method.upper(), "route": route, "caller": caller, "key": key}


def host_route(host: str, scheme: str, template: str) -> str:
    """The route of a host- or domain-routed request: the host the router matched
    (lowercased, without the scheme's default port) before the path template, so tenants
    served under one host pattern (``{tenant}.example.com``) never share a key."""
    host = host.strip().lower()
    default = _DEFAULT_PORTS.get(scheme.lower())
    if default is not None and host.endswith(default):
        host = host[: -len(default)]
    return f"{host.rstrip('.')}{template}"
