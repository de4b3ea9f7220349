"""The rules one middleware applies: its settings bound to the manager it runs.

::

    key, caller ──> scope        (the idempotency key, :mod:`._keys`)
    request     ──> fingerprint  (the validation hash, :mod:`._fingerprint`)
    stored      ──> replay       (:mod:`._responses`)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final, Literal

from idempotency_async._derive import HTTP_OWNED, derive
from idempotency_async.errors import ConfigError
from idempotency_async.integrations._http._fingerprint import fingerprint
from idempotency_async.integrations._http._keys import request_scope
from idempotency_async.integrations._http._responses import HttpResponse, replay
from idempotency_async.integrations._http._settings import HttpSettings
from idempotency_async.manager import Manager
from idempotency_async.options import Wait

__all__ = ["HttpIdempotency", "http_manager"]

# Room for the JSON envelope around the Base64 body when deriving the default body limit.
_ENVELOPE_BYTES: Final = 4096

_log = logging.getLogger("idempotency_async.http")


class HttpIdempotency:
    """The rules one middleware instance applies; stateless per request."""

    def __init__(self, manager: Manager, settings: HttpSettings) -> None:
        if not isinstance(manager, Manager):
            raise ConfigError("manager must be an idempotency_async.Manager")
        self.settings = settings
        self.manager = http_manager(manager, settings.wait)
        limit = settings.max_response_bytes
        self.max_response_bytes: int = (
            max((manager.store.max_response_bytes - _ENVELOPE_BYTES) * 3 // 4, 0)
            if limit is None
            else limit
        )
        """The largest response body stored (set, or what fits in the store)."""
        if settings.caller_scope is None:
            _log.warning(
                "Idempotency-Key middleware without caller_scope is single-tenant: two clients "
                "sending the same key to the same route share one response. Pass caller_scope= "
                "(e.g. the authenticated principal) to keep callers apart."
            )

    async def caller(self, request: Any) -> str | None:
        """What ``caller_scope`` says of ``request`` (None without one)."""
        caller_scope = self.settings.caller_scope
        if caller_scope is None:
            return None
        value = caller_scope(request)
        if not isinstance(value, str | None):
            value = await value
        return value

    def payload(
        self,
        *,
        method: str,
        route: str,
        caller: str | None,
        key: str,
        path: str,
        query: Iterable[tuple[str, str]],
        content_type: str | None,
        body: bytes,
    ) -> dict[str, Any]:
        """What the manager hashes: ``scope`` becomes the key, ``fingerprint`` the validation
        (``query``: the pairs as the application decodes them)."""
        digest = fingerprint(
            path=path,
            query=query,
            content_type=content_type,
            body=body,
            max_depth=self.settings.max_body_depth,
            hash_function=self.manager.options.hash_function,
        )
        return {"scope": request_scope(method, route, caller, key), "fingerprint": digest}

    def key_for(self, method: str, route: str, key: str, caller: str | None = None) -> str:
        """The idempotency key a request stores under: its method, route template (as
        the app declares it, e.g. ``/orders/{order_id}``), Idempotency-Key (unquoted) and
        caller scope.  For ``manager.force_release(...)`` and record look-ups."""
        found = self.manager.key_for({"scope": request_scope(method, route, caller, key)})
        assert found is not None  # the scope is never missing
        return found

    def replay(self, stored: Any) -> HttpResponse:
        """The response a duplicate gets for a stored result (see :func:`._responses.replay`)."""
        return replay(stored, self.settings.replay_headers, self.settings.replayed_header)


def http_manager(manager: Manager, wait: Wait | Literal[False] | None = None) -> Manager:
    """The manager the middleware runs: ``manager``'s options, with the key and validation
    selections, key serialization and response encoding the middleware owns, and the
    middleware's own ``wait`` (``False``: none; ``None``: the manager's)."""
    kept: dict[str, Any] = {}
    if wait is not None:
        kept["wait"] = wait or None
    if getattr(getattr(manager, "options", None), "replay_errors", None) is not None:
        # An endpoint's exception is the framework's 500, released (G2); its deterministic
        # refusals are responses, stored by the status policy (_responses.stores_status).
        raise ConfigError(
            "the HTTP idempotency middleware does not take replay_errors: return the 4xx "
            "response instead of raising (2xx-4xx responses are stored and replayed, see "
            "docs/http.md), and pass a manager without replay_errors"
        )
    owned = dict.fromkeys(HTTP_OWNED)
    owned.update(event_key_jmespath="scope", payload_validation_jmespath="fingerprint")
    return derive(manager, "the HTTP idempotency middleware", owned, kept=kept)
