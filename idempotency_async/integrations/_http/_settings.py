"""The options of one HTTP idempotency middleware, validated once and passed whole.

Every adapter (the Starlette middleware, the aiohttp middleware factory) takes the same
keyword arguments and builds one :class:`HttpSettings` from them: a wrong value is a
:class:`~idempotency_async.errors.ConfigError` at application start, never on a request.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from idempotency_async.canonical import MAX_DEPTH
from idempotency_async.errors import ConfigError
from idempotency_async.options import Wait

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BODY_DEPTH",
    "DEFAULT_METHODS",
    "DEFAULT_REPLAYED_HEADER",
    "DEFAULT_REPLAY_HEADERS",
    "DEFAULT_REQUEST_TIMEOUT",
    "NEVER_REPLAYED",
    "REPLAYED_ATTRIBUTE",
    "REPLAYED_HEADER",
    "STORED_HEADER",
    "CallerScope",
    "HttpSettings",
    "PathPattern",
]

REPLAYED_HEADER: Final = "idempotent-replayed"
DEFAULT_REPLAYED_HEADER: Final = "Idempotent-Replayed"
"""The default of ``replayed_header``: the name Stripe and the IETF draft's examples use."""
REPLAYED_ATTRIBUTE: Final = "idempotency.http.replayed"
"""Set on the current (server) span when a stored response is replayed."""
STORED_HEADER: Final = "idempotency-response-stored"
"""``Idempotency-Response-Stored: false`` marks a response that will not be replayed."""
DEFAULT_METHODS: Final = ("POST", "PATCH")
DEFAULT_REPLAY_HEADERS: Final = ("cache-control", "content-type", "etag", "link", "location")
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_MAX_BODY_DEPTH: Final = 400
DEFAULT_REQUEST_TIMEOUT: Final = 30.0
# Never stored or replayed, even when configured: cookies are per client and session, the
# others describe one transfer of the body, not the response.  (Content-Encoding is not
# one of them: it says what the stored bytes are, and travels with the body.)
NEVER_REPLAYED: Final = frozenset(
    {
        "set-cookie",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "trailer",
        "date",
        "server",
        REPLAYED_HEADER,
        STORED_HEADER,
    }
)

PathPattern = str | re.Pattern[str]
CallerScope = Callable[[Any], "str | Awaitable[str | None] | None"]


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """What a middleware applies, as the keyword arguments of the adapters describe it.

    Built from what users pass, normalized (methods upper-cased, header names lower-cased,
    iterables frozen) and validated at construction.  ``max_response_bytes`` None means
    "what fits in the store": the rules resolve it against the manager's store.
    """

    methods: Iterable[str] = DEFAULT_METHODS
    paths: Iterable[PathPattern] | None = None
    required: bool = False
    caller_scope: CallerScope | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_body_depth: int = DEFAULT_MAX_BODY_DEPTH
    max_response_bytes: int | None = None
    store_server_errors: bool = False
    replay_headers: Iterable[str] = field(default=())
    wait: Wait | Literal[False] | None = None
    """``Wait(...)``: wait for an in-progress duplicate; ``False``: answer 409 at once;
    ``None``: as the manager's ``Options.wait``."""
    replayed_header: str = DEFAULT_REPLAYED_HEADER
    """The header (value ``true``) that marks a replayed response; lower-cased here."""

    def __post_init__(self) -> None:
        if not _positive(self.request_timeout):
            raise ConfigError(
                f"request_timeout must be positive seconds, got {self.request_timeout!r}"
            )
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 0:
            raise ConfigError(
                f"max_body_bytes must be an integer >= 0, got {self.max_body_bytes!r}"
            )
        depth = self.max_body_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise ConfigError(
                f"max_body_depth must be an integer from 1 to {MAX_DEPTH}, got {depth!r}"
            )
        limit = self.max_response_bytes
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ConfigError(f"max_response_bytes must be an integer >= 0, got {limit!r}")
        if not (self.wait is None or self.wait is False or isinstance(self.wait, Wait)):
            raise ConfigError(
                f"wait takes a Wait, False (answer 409 at once) or None (as the manager's "
                f"Options.wait), got {self.wait!r}: e.g. wait=Wait(timeout=10.0)"
            )
        replayed = _replayed_header(self.replayed_header, self.replay_headers)
        # Normalized in place: the dataclass is frozen for its users, not for itself.
        normalized = {
            "replayed_header": replayed,
            "methods": frozenset(method.upper() for method in self.methods),
            "paths": None if self.paths is None else tuple(self.paths),
            "request_timeout": float(self.request_timeout),
            "replay_headers": frozenset(DEFAULT_REPLAY_HEADERS)
            | {name.lower() for name in self.replay_headers} - NEVER_REPLAYED,
        }
        for name, value in normalized.items():
            object.__setattr__(self, name, value)

    def applies(self, method: str, path: str, *, marked: bool) -> bool:
        """Whether a request is handled: opt-in routes always, others by method and path."""
        if marked:
            return True
        if method.upper() not in self.methods:
            return False
        patterns = self.paths
        return patterns is None or any(_path_matches(pattern, path) for pattern in patterns)


_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (RFC 9110 token)."""


def _replayed_header(name: Any, replay_headers: Iterable[str]) -> str:
    """The replayed header's name, lower-cased: a field name the middleware owns (no
    header it replays, strips or answers with), or ConfigError."""
    if not isinstance(name, str) or _TOKEN.fullmatch(name) is None:
        raise ConfigError(f"replayed_header must be an HTTP header name, got {name!r:.60}")
    lowered = name.lower()
    replayed = {header.lower() for header in replay_headers} | set(DEFAULT_REPLAY_HEADERS)
    taken = (NEVER_REPLAYED - {REPLAYED_HEADER}) | replayed | {"idempotency-key", "retry-after"}
    if lowered in taken:
        raise ConfigError(
            f"replayed_header={name!r} names a header the middleware replays, strips or "
            "sends for another purpose: choose another name (default Idempotent-Replayed)"
        )
    return lowered


def _path_matches(pattern: PathPattern, path: str) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(path) is not None
    return fnmatch.fnmatchcase(path, pattern)


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")
    )
