"""The middleware's own answers, and the stored form of a response (written and read here).

A stored response is the JSON value ``{"v": 1, "status", "headers", "body_b64"}`` (with
``"redacted": true`` when declared fields were removed from it: :mod:`._redacting`) (or,
when its body could not be stored, ``{"v": 1, "status", "stored": false, "reason"}``); its
writers (:func:`stored_response`, :func:`not_stored_response`) and its reader
(:func:`replay`) sit side by side so the format has one definition.  Every other answer
is an RFC 9457 problem.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from idempotency_async._stored_redaction import Redaction
from idempotency_async.integrations._http._redacting import NEVER_STORED, redact_response
from idempotency_async.integrations._http._settings import (
    NEVER_REPLAYED,
    REDACTED_HEADER,
    REPLAYED_HEADER,
    STORED_HEADER,
)

__all__ = [
    "NO_BODY",
    "HttpResponse",
    "RETRY_LATER",
    "Rejection",
    "content_length",
    "not_available",
    "not_stored_response",
    "problem",
    "replay",
    "stored_response",
    "stores_status",
]

_FORMAT: Final = 1
# RFC 9110 field names (tokens) and values (no control characters: CR, LF and NUL split
# or end a header).
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_FIELD_VALUE: Final = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
NO_BODY: Final = frozenset({204, 304})
"""Final statuses that carry no body (nor a Content-Length): a replay of one has none."""
RETRY_LATER: Final = frozenset({408, 409, 425, 429})
"""4xx statuses that ask for the same request again later (Request Timeout, Conflict, Too
Early, Too Many Requests): never stored, so the retry they ask for runs again."""
_REASON: Final = re.compile(r"HTTP ([1-5][0-9][0-9]): (.*)", re.DOTALL)
_ENCODING: Final = "content-encoding"


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete response an adapter sends as it is (problems and replays)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


class Rejection(Exception):
    """Raised by the rules to answer the request with ``response`` instead of running it."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status)
        self.response = response


def problem(
    status: int, title: str, detail: str, *, headers: Iterable[tuple[str, str]] = ()
) -> HttpResponse:
    """An RFC 9457 ``application/problem+json`` response."""
    body = orjson.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return HttpResponse(status, (("content-type", "application/problem+json"), *headers), body)


def not_available(reason: str | None, replayed_header: str = REPLAYED_HEADER) -> HttpResponse:
    """The answer to a duplicate of a request whose response was not stored: the original
    status (written first in the record's reason) when it can carry a body, else 409, and
    the reason it was not stored; marked with ``replayed_header``."""
    match = None if reason is None else _REASON.fullmatch(reason)
    status = 409 if match is None else int(match[1])
    why = reason if match is None else match[2]
    if not 200 <= status <= 599 or status in NO_BODY:
        # The reason comes from the record (another writer may have put it there): only a
        # final status that carries this answer's body is used; 1xx, 204 and 304 would
        # leave the body on the connection, to be read as the next response.
        status, why = 409, reason
    return problem(
        status,
        "Response not available",
        f"the request with this Idempotency-Key was processed, but its response was not "
        f"stored ({why or 'no reason recorded'}), so it cannot be replayed: use a new key to "
        "run the request again",
        headers=((STORED_HEADER, "false"), (replayed_header, "true")),
    )


def stores_status(status: int, store_server_errors: bool) -> bool:
    """The status policy, in one place: whether a response the endpoint produced with
    ``status`` completes the record (and is replayed to every retry) or releases the key.

    The Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header, "Idempotency
    Enforcement Scenarios") has a retry answered with "the result of the previously
    completed operation, success or an error", and leaves other 4xx/5xx to the server's
    documentation.  Here: 2xx to 4xx are completed results, except the statuses that ask the
    client to send the same request again (:data:`RETRY_LATER`); 5xx usually mean the work
    did not happen and are released, unless ``store_server_errors`` (Stripe replays them).
    """
    if status >= 500:
        return store_server_errors
    return status not in RETRY_LATER


def content_length(headers: list[tuple[str, str]]) -> int | None:
    """The declared Content-Length of a response head (lower-cased names), if readable."""
    for name, value in headers:
        if name == "content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def stored_response(
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    replay_headers: Iterable[str],
    max_body_bytes: int,
    max_stored_bytes: int,
    redaction: Redaction | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The JSON value to store for a whole response, or why it cannot be stored.

    ``max_body_bytes`` bounds the body, ``max_stored_bytes`` (the store's limit) the
    encoded value; only the ``replay_headers`` are kept, without the fields ``redaction``
    declares (or nothing, when it declares the route never-stored).
    """
    if redaction is not None and redaction.never_store:
        return None, NEVER_STORED
    declared = content_length(headers)
    if declared is not None and declared != len(body):
        return None, f"the body ({len(body)} bytes) did not match its Content-Length"
    if len(body) > max_body_bytes:
        return None, (
            f"too large: the body ({len(body)} bytes) is over the limit of {max_body_bytes}"
        )
    kept = _with_body(headers, replay_headers)
    headers = [(name, value) for name, value in headers if name in kept]
    redacted = False
    if redaction is not None and redaction.paths:
        # After the allow-list: a declared header that is never stored anyway (Set-Cookie,
        # one not replayed) does not mark the response redacted.
        outcome = redact_response(redaction, headers, body)
        if isinstance(outcome, str):
            return None, outcome
        headers, body, redacted = outcome
    result: dict[str, Any] = {
        "v": _FORMAT,
        "status": status,
        "headers": [[name, value] for name, value in headers],
        "body_b64": base64.b64encode(body).decode("ascii"),
    }
    if redacted:
        result["redacted"] = True
    size = len(orjson.dumps(result))
    if size > max_stored_bytes:
        return (
            None,
            f"too large: {size} bytes to store, over the store's limit of {max_stored_bytes}",
        )
    return result, ""


def _with_body(headers: Iterable[tuple[str, str]], allowed: Iterable[str]) -> frozenset[str]:
    """The header names kept with a body: the allowed ones, and those that say what the
    body's bytes are — its Content-Encoding (a compressed body replayed without it is
    unreadable) and, beside it, the Vary that tells caches the coding was negotiated."""
    names = {name for name, _ in headers}
    kept = {*allowed, _ENCODING}
    if _ENCODING in names:
        kept.add("vary")
    return frozenset(kept)


def not_stored_response(status: int, reason: str) -> dict[str, Any]:
    """The stored form of a response whose body could not be stored, written where the
    record completes with a value (transactional routes): its status and why, so a
    duplicate gets "not available" with the original status."""
    return {"v": _FORMAT, "status": status, "stored": False, "reason": reason}


def replay(
    stored: Any, replay_headers: Iterable[str], replayed_header: str = REPLAYED_HEADER
) -> HttpResponse:
    """The response a duplicate gets for a stored result, marked with ``replayed_header``.

    A stored response is untrusted input (other writers share the store): one that is
    not what :func:`stored_response` writes answers as "not stored", and its headers pass
    the allow-list again.
    """
    response = _replay(stored, replay_headers)
    if replayed_header == REPLAYED_HEADER:
        return response
    headers = tuple(
        (replayed_header if name == REPLAYED_HEADER else name, value)
        for name, value in response.headers
    )
    return HttpResponse(response.status, headers, response.body)


def _replay(stored: Any, replay_headers: Iterable[str]) -> HttpResponse:
    if not isinstance(stored, dict) or stored.get("v") != _FORMAT:
        return not_available("the stored response is not one this middleware wrote")
    status = stored.get("status")
    if type(status) is not int or not 100 <= status <= 599:
        return not_available(f"the stored response has an invalid status ({status!r:.40})")
    if stored.get("stored") is False:
        # A transactional route's response that could not be stored (and why); earlier
        # versions wrote it without a reason.
        reason = stored.get("reason")
        why = reason[:300] if isinstance(reason, str) and reason else "too large or not complete"
        return not_available(f"HTTP {status}: {why}")
    if status < 200:
        return not_available(f"HTTP {status}: an informational status is not a response")
    headers, why = _stored_headers(stored.get("headers"), replay_headers)
    if why:
        return not_available(f"HTTP {status}: the stored response {why}")
    encoded = stored.get("body_b64")
    try:
        if not isinstance(encoded, str):
            raise ValueError("not a string")
        body = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error):
        return not_available(f"HTTP {status}: the stored response has no valid body")
    if body and status in NO_BODY:
        return not_available(f"HTTP {status}: the stored response has a body it cannot carry")
    if stored.get("redacted") is True:
        headers = (*headers, (REDACTED_HEADER, "true"))
    return HttpResponse(status, (*headers, (REPLAYED_HEADER, "true")), body)


def _stored_headers(stored: Any, allowed: Iterable[str]) -> tuple[tuple[tuple[str, str], ...], str]:
    """The stored headers the allow-list passes, or why the stored ones are unusable."""
    if not isinstance(stored, list):
        return (), "has no header list"
    names = [pair[0].lower() for pair in stored if _is_pair(pair)]
    allowed = _with_body(((name, "") for name in names), allowed)
    kept: list[tuple[str, str]] = []
    for pair in stored:
        if not _is_pair(pair):
            return (), "has a malformed header"
        name, value = pair[0].lower(), pair[1]
        if _TOKEN.fullmatch(name) is None or _FIELD_VALUE.fullmatch(value) is None:
            return (), "has a header with characters HTTP does not allow"
        if name in NEVER_REPLAYED:
            return (), f"holds a {name} header, which is never replayed"
        if name in allowed:
            kept.append((name, value))
    return tuple(kept), ""


def _is_pair(pair: Any) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
