"""The HTTP Idempotency-Key rules, shared by every server adapter (no framework imports).

What a request is keyed and validated by::

    Idempotency-Key header ──> parse_key ──> scope {method, route, caller, key}   (the key)
    body (≤ max_body_bytes) ──> fingerprint {path, query, media type, body}       (validation)

and how a stored response is replayed.  Running the endpoint and recording its response
(the response lifecycle) is :mod:`._exchange`.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl

import orjson

from idempotency_async._codec import loads_strict, nesting_depth
from idempotency_async._derive import HTTP_OWNED, derive
from idempotency_async.canonical import (
    HASH_ALGORITHMS,
    MAX_DEPTH,
    canonical_bytes,
    digest_bytes,
)
from idempotency_async.errors import (
    ConfigError,
    PayloadError,
)
from idempotency_async.manager import Manager

__all__ = [
    "http_manager",
    "content_length",
    "host_route",
    "not_available",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BODY_DEPTH",
    "DEFAULT_METHODS",
    "DEFAULT_REPLAY_HEADERS",
    "KEY_HEADER",
    "REPLAYED_HEADER",
    "STORED_HEADER",
    "HttpIdempotency",
    "HttpResponse",
    "Rejection",
    "RequestState",
    "parse_key",
    "problem",
    "request_scope",
]

KEY_HEADER: Final = "idempotency-key"
REPLAYED_HEADER: Final = "idempotent-replayed"
STORED_HEADER: Final = "idempotency-response-stored"
"""``Idempotency-Response-Stored: false`` marks a response that will not be replayed."""
REPLAYED_ATTRIBUTE: Final = "idempotency.http.replayed"
"""Set on the current (server) span when a stored response is replayed."""
DEFAULT_METHODS: Final = ("POST", "PATCH")
DEFAULT_REPLAY_HEADERS: Final = ("cache-control", "content-type", "etag", "link", "location")
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_MAX_BODY_DEPTH: Final = 400
MAX_KEY_LENGTH: Final = 255
# Never stored or replayed, even when configured: cookies are per client and session, the
# others describe one transfer of the body, not the response.
_NEVER_REPLAYED: Final = frozenset(
    {
        "set-cookie",
        "content-length",
        "transfer-encoding",
        "connection",
        "content-encoding",
        "keep-alive",
        "upgrade",
        "trailer",
        "date",
        "server",
        REPLAYED_HEADER,
        STORED_HEADER,
    }
)
_FORMAT: Final = 1
_MAX_SAFE_INTEGER: Final = 2**53 - 1
# Room for the JSON envelope around the Base64 body when deriving the default body limit.
_ENVELOPE_BYTES: Final = 4096
# JSON bodies nested deeper than this are canonicalized in slices of this depth, so every
# slice stays on the canonicalizer's fast path (it hands deeper values to a slower one).
_SLICE_DEPTH: Final = 128
_LONG_NUMBER: Final = re.compile(rb"[0-9]{16}")
# RFC 9110 field names (tokens) and values (no control characters: CR, LF and NUL split
# or end a header).
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_FIELD_VALUE: Final = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_NO_BODY: Final = frozenset({204, 304})
_DEFAULT_PORTS: Final = {"http": ":80", "ws": ":80", "https": ":443", "wss": ":443"}

_log = logging.getLogger("idempotency_async.http")

PathPattern = str | re.Pattern[str]


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete response an adapter sends as it is (problems and replays)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(slots=True)
class RequestState:
    """What a middleware knows about one request (each adapter's ``request_state()``)."""

    key: str | None
    """The request's Idempotency-Key (unquoted), or None when it sent none."""
    endpoint_ran: bool = False
    """On opted-in routes, the marker's word on whether the endpoint ran: set when the
    FastAPI dependency or aiohttp decorator is entered, cleared when the endpoint (or,
    for FastAPI, request validation) raises.  A response started while it is False was
    not produced by the endpoint: it is forwarded and never stored."""


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


def content_length(headers: list[tuple[str, str]]) -> int | None:
    for name, value in headers:
        if name == "content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


CallerScope = Callable[[Any], "str | Awaitable[str | None] | None"]


@dataclass(frozen=True, slots=True)
class _Settings:
    methods: frozenset[str]
    paths: tuple[PathPattern, ...] | None
    required: bool
    request_timeout: float
    max_body_bytes: int
    max_body_depth: int
    max_response_bytes: int
    store_server_errors: bool
    replay_headers: frozenset[str] = field(default_factory=frozenset)


class HttpIdempotency:
    """The rules one middleware instance applies; stateless per request."""

    def __init__(
        self,
        manager: Manager,
        *,
        methods: Iterable[str],
        paths: Iterable[PathPattern] | None,
        required: bool,
        caller_scope: CallerScope | None,
        request_timeout: float,
        max_body_bytes: int,
        max_body_depth: int,
        max_response_bytes: int | None,
        store_server_errors: bool,
        replay_headers: Iterable[str],
        wait: bool | None,
        wait_timeout: float | None,
    ) -> None:
        if not isinstance(manager, Manager):
            raise ConfigError("manager must be an idempotency_async.Manager")
        if not _positive(request_timeout):
            raise ConfigError(f"request_timeout must be positive seconds, got {request_timeout!r}")
        if not isinstance(max_body_bytes, int) or max_body_bytes < 0:
            raise ConfigError(f"max_body_bytes must be an integer >= 0, got {max_body_bytes!r}")
        if (
            isinstance(max_body_depth, bool)
            or not isinstance(max_body_depth, int)
            or not 1 <= max_body_depth <= MAX_DEPTH
        ):
            raise ConfigError(
                f"max_body_depth must be an integer from 1 to {MAX_DEPTH}, got {max_body_depth!r}"
            )
        fits = (manager.store.max_response_bytes - _ENVELOPE_BYTES) * 3 // 4
        if max_response_bytes is None:
            max_response_bytes = max(fits, 0)
        elif not isinstance(max_response_bytes, int) or max_response_bytes < 0:
            raise ConfigError(
                f"max_response_bytes must be an integer >= 0, got {max_response_bytes!r}"
            )
        if wait is not None and not isinstance(wait, bool):
            raise ConfigError(
                f"wait must be True, False or None (as the manager's options), got {wait!r}; "
                "the seconds to wait go in wait_timeout"
            )
        if wait_timeout is not None and not _positive(wait_timeout):
            raise ConfigError(f"wait_timeout must be positive seconds, got {wait_timeout!r}")
        self.manager = http_manager(manager, wait, wait_timeout)
        self.caller_scope = caller_scope
        self.settings = _Settings(
            methods=frozenset(method.upper() for method in methods),
            paths=None if paths is None else tuple(paths),
            required=required,
            request_timeout=float(request_timeout),
            max_body_bytes=max_body_bytes,
            max_body_depth=max_body_depth,
            max_response_bytes=max_response_bytes,
            store_server_errors=store_server_errors,
            replay_headers=frozenset(DEFAULT_REPLAY_HEADERS)
            | {name.lower() for name in replay_headers} - _NEVER_REPLAYED,
        )
        if caller_scope is None:
            _log.warning(
                "Idempotency-Key middleware without caller_scope is single-tenant: two clients "
                "sending the same key to the same route share one response. Pass caller_scope= "
                "(e.g. the authenticated principal) to keep callers apart."
            )

    # ------------------------------------------------------------------ selection

    def applies(self, method: str, path: str, *, marked: bool) -> bool:
        """Whether a request is handled: opt-in routes always, others by method and path."""
        if marked:
            return True
        if method.upper() not in self.settings.methods:
            return False
        patterns = self.settings.paths
        return patterns is None or any(_path_matches(pattern, path) for pattern in patterns)

    def check_length(self, content_length: str | None) -> None:
        """Reject a declared body over the limit before reading it (413)."""
        if content_length is None:
            return
        try:
            declared = int(content_length)
        except ValueError:
            raise Rejection(problem(400, "Bad Request", "Content-Length is not a number")) from None
        if declared > self.settings.max_body_bytes:
            raise Rejection(self.too_large())

    def too_large(self) -> HttpResponse:
        return problem(
            413,
            "Request body too large",
            f"idempotent requests may carry at most {self.settings.max_body_bytes} bytes",
        )

    async def caller(self, request: Any) -> str | None:
        if self.caller_scope is None:
            return None
        value = self.caller_scope(request)
        if not isinstance(value, str | None):
            value = await value
        return value

    # ------------------------------------------------------------------ payload

    def payload(
        self,
        *,
        method: str,
        route: str,
        caller: str | None,
        key: str,
        path: str,
        query: str,
        content_type: str | None,
        body: bytes,
    ) -> dict[str, Any]:
        """What the manager hashes: ``scope`` becomes the key, ``fingerprint`` the validation."""
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        body_material, depth = self._body_material(media_type, body)
        material = {
            "path": path,
            # Lists, not tuples: same canonical JSON, but they keep the canonicalizer on
            # its fast path.
            # Sorted by name only, stably: a repeated name keeps the order its values were
            # sent in (``?a=1&a=2`` and ``?a=2&a=1`` differ to an app reading the last one).
            "query": [
                list(pair) for pair in sorted(parse_qsl(query, keep_blank_values=True), key=_name)
            ],
            "media_type": media_type,
            "body": body_material,
        }
        algorithm = self.manager.options.hash_function
        if algorithm not in HASH_ALGORITHMS:
            # A Powertools (Python) hash such as sha3_256: the fingerprint is only hashed
            # again into the validation hash, so any digest serves.
            algorithm = "sha256"
        try:
            text = canonical_bytes(material) if depth < _SLICE_DEPTH else _sliced(material)
            fingerprint = digest_bytes(text, algorithm)
        except PayloadError as exc:
            raise Rejection(problem(400, "Unreadable request body", str(exc))) from exc
        return {"scope": request_scope(method, route, caller, key), "fingerprint": fingerprint}

    def _body_material(self, media_type: str, body: bytes) -> tuple[dict[str, Any], int]:
        """What of the body is fingerprinted, and how deeply it nests."""
        if not body or not (media_type == "application/json" or media_type.endswith("+json")):
            return {"base64": base64.b64encode(body).decode("ascii")}, 0
        limit = self.settings.max_body_depth
        text: str | bytes = body
        encoding = json.detect_encoding(body)
        if encoding not in ("utf-8", "utf-8-sig"):
            # The parser accepts UTF-16 and UTF-32 too: the nesting is counted on the text
            # it will parse, not on bytes read as if they were UTF-8.
            try:
                text = body.decode(encoding, "surrogatepass")
            except UnicodeDecodeError as exc:
                raise Rejection(
                    problem(400, "Invalid JSON body", f"not valid {encoding.upper()}: {exc}")
                ) from exc
        depth = nesting_depth(text)
        if depth > limit:
            raise Rejection(
                problem(
                    400,
                    "Request body nested too deeply",
                    f"JSON request bodies may nest arrays and objects at most {limit} levels "
                    f"deep; this one nests {depth}",
                )
            )
        try:
            value = loads_strict(text, max_depth=None)
        except PayloadError as exc:
            raise Rejection(problem(400, "Invalid JSON body", str(exc))) from exc
        except UnicodeDecodeError as exc:
            raise Rejection(problem(400, "Invalid JSON body", f"not UTF-8: {exc}")) from exc
        if _exact_as_double(value, body):
            return {"json": value}, depth
        # JSON holding integers a double cannot tell apart hashes as bytes.
        return {"base64": base64.b64encode(body).decode("ascii")}, 0

    def key_for(self, method: str, route: str, key: str, caller: str | None = None) -> str:
        """The idempotency key a request stores under: its method, route template (as
        the app declares it, e.g. ``/orders/{order_id}``), Idempotency-Key (unquoted) and
        caller scope.  For ``manager.force_release(...)`` and record look-ups."""
        found = self.manager.key_for({"scope": request_scope(method, route, caller, key)})
        assert found is not None  # the scope is never missing
        return found

    def replay(self, stored: Any) -> HttpResponse:
        """The response a duplicate gets for a stored result.

        A stored response is untrusted input (other writers share the store): one that is
        not what this middleware writes answers as "not stored", and its headers pass the
        allow-list again.
        """
        if not isinstance(stored, dict) or stored.get("v") != _FORMAT:
            return not_available("the stored response is not one this middleware wrote")
        status = stored.get("status")
        if type(status) is not int or not 100 <= status <= 599:
            return not_available(f"the stored response has an invalid status ({status!r:.40})")
        if stored.get("stored") is False:  # written by earlier versions
            return not_available(f"HTTP {status}: too large or not complete")
        if status < 200:
            return not_available(f"HTTP {status}: an informational status is not a response")
        headers, why = self._stored_headers(stored.get("headers"))
        if why:
            return not_available(f"HTTP {status}: the stored response {why}")
        encoded = stored.get("body_b64")
        try:
            if not isinstance(encoded, str):
                raise ValueError("not a string")
            body = base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error):
            return not_available(f"HTTP {status}: the stored response has no valid body")
        if body and status in _NO_BODY:
            return not_available(f"HTTP {status}: the stored response has a body it cannot carry")
        return HttpResponse(status, (*headers, (REPLAYED_HEADER, "true")), body)

    def _stored_headers(self, stored: Any) -> tuple[tuple[tuple[str, str], ...], str]:
        """The stored headers the allow-list passes, or why the stored ones are unusable."""
        if not isinstance(stored, list):
            return (), "has no header list"
        allowed = self.settings.replay_headers
        kept: list[tuple[str, str]] = []
        for pair in stored:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(part, str) for part in pair)
            ):
                return (), "has a malformed header"
            name, value = pair[0].lower(), pair[1]
            if _TOKEN.fullmatch(name) is None or _FIELD_VALUE.fullmatch(value) is None:
                return (), "has a header with characters HTTP does not allow"
            if name in _NEVER_REPLAYED:
                return (), f"holds a {name} header, which is never replayed"
            if name in allowed:
                kept.append((name, value))
        return tuple(kept), ""


def request_scope(method: str, route: str, caller: str | None, key: str) -> dict[str, Any]:
    """What the key is derived from: the request's method, route template, caller and key
    (also used by the command-line tool's ``key --http``)."""
    return {"method": method.upper(), "route": route, "caller": caller, "key": key}


_REASON: Final = re.compile(r"HTTP ([1-5][0-9][0-9]): (.*)", re.DOTALL)


def not_available(reason: str | None) -> HttpResponse:
    """The answer to a duplicate of a request whose response was not stored: the original
    status (written first in the record's reason), and the reason it was not stored."""
    match = None if reason is None else _REASON.fullmatch(reason)
    status = 409 if match is None else int(match[1])
    why = reason if match is None else match[2]
    return problem(
        status,
        "Response not available",
        f"the request with this Idempotency-Key was processed, but its response was not "
        f"stored ({why or 'no reason recorded'}), so it cannot be replayed: use a new key to "
        "run the request again",
        headers=((STORED_HEADER, "false"), (REPLAYED_HEADER, "true")),
    )


def http_manager(
    manager: Manager, wait: bool | None = None, wait_timeout: float | None = None
) -> Manager:
    """The manager the middleware runs: ``manager``'s options, with the key and validation
    selections, key serialization and response encoding the middleware owns."""
    kept: dict[str, Any] = {}
    if wait is not None:
        kept["wait"] = wait
    if wait_timeout is not None:
        kept["wait_timeout"] = float(wait_timeout)
    owned = dict.fromkeys(HTTP_OWNED)
    owned.update(event_key_jmespath="scope", payload_validation_jmespath="fingerprint")
    return derive(manager, "the HTTP idempotency middleware", owned, kept=kept)


def _sliced(value: Any) -> bytes:
    """``canonical_bytes(value)`` for parsed JSON of any depth, in time linear in its size.

    ``value`` is changed: only pass a value parsed for this purpose.

    Containers at ``_SLICE_DEPTH`` are canonicalized on their own (sliced again when they
    are deeper still) and stand in the rest as placeholder strings carrying a random
    nonce, which the request cannot contain; the placeholders' canonical text is then
    replaced by the slices' (canonical JSON of a value is the same wherever it sits).
    """
    nonce = secrets.token_hex(16)
    return _Slicer(nonce, re.compile(b'"%s:([0-9]+)"' % nonce.encode())).canonical(value)


@dataclass(frozen=True, slots=True)
class _Slicer:
    nonce: str
    placeholder: re.Pattern[bytes]

    def canonical(self, value: Any) -> bytes:
        slices: list[bytes] = []
        self.cut(value, slices)
        text = canonical_bytes(value)
        if not slices:
            return text
        return self.placeholder.sub(lambda match: slices[int(match[1])], text)

    def cut(self, value: Any, slices: list[bytes]) -> None:
        """Replace, in place, the containers at ``_SLICE_DEPTH`` with placeholders."""
        level = [value]
        for _ in range(_SLICE_DEPTH - 1):
            level = [
                child
                for node in level
                for child in (node.values() if type(node) is dict else node)
                if type(child) is dict or type(child) is list
            ]
            if not level:
                return
        for node in level:
            slots = node.items() if type(node) is dict else enumerate(node)
            deep = [(slot, child) for slot, child in slots if type(child) in (dict, list)]
            for slot, child in deep:
                node[slot] = f"{self.nonce}:{len(slices)}"
                slices.append(self.canonical(child))


def _exact_as_double(value: Any, text: bytes) -> bool:
    if _LONG_NUMBER.search(text) is None:
        return True  # every integer has at most 15 digits
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if isinstance(node, int) and not -_MAX_SAFE_INTEGER <= node <= _MAX_SAFE_INTEGER:
            return False
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def _name(pair: tuple[str, str]) -> str:
    return pair[0]


def host_route(host: str, scheme: str, template: str) -> str:
    """The route of a host- or domain-routed request: the host the router matched
    (lowercased, without the scheme's default port) before the path template, so tenants
    served under one host pattern (``{tenant}.example.com``) never share a key."""
    host = host.strip().lower()
    default = _DEFAULT_PORTS.get(scheme.lower())
    if default is not None and host.endswith(default):
        host = host[: -len(default)]
    return f"{host.rstrip('.')}{template}"


def _path_matches(pattern: PathPattern, path: str) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(path) is not None
    return fnmatch.fnmatchcase(path, pattern)


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")
    )
