"""Transactional routes: the endpoint records its response in its own database transaction.

The middleware never claims for such a route; it answers what is already committed and
hands the endpoint an :class:`HttpTransaction`::

    key, body ──> payload ──> Manager.replay(payload)          (one read, no claim)
                               │ completed ──> replay | 422        (the endpoint never runs)
                               │ in progress (a lease) ──> 409
                               └ nothing committed ──> the endpoint runs, and calls
    HttpTransaction.run(connection, work) ──> Manager.execute_in_transaction(connection, ...)
        work() returns the response (FastAPI: or a value, serialized as the route would)
                               ──> encoded as the middleware stores responses, written
                                   in the savepoint; 5xx: rolled back, not stored
        a duplicate committed first ──> its replay (Idempotent-Replayed: true)
    the endpoint's COMMIT ──> the point of no return; a rollback leaves no record
    an endpoint that returns without run() having answered ──> 500 (never a silent success)

A duplicate arriving while the first request's transaction is open blocks on the record's
row (``wait``) or is refused at once; either way it learns nothing before the COMMIT.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, Protocol, TypeVar

from idempotency_async.errors import (
    AlreadyInProgressError,
    DeadlineExceededError,
    InconsistentStateError,
    PayloadValidationError,
    PersistenceError,
    ResponseNotStoredError,
    TransactionRetryError,
)
from idempotency_async.instrumentation import annotate, call_attributes
from idempotency_async.integrations._http._answers import in_progress, reused, store_unavailable
from idempotency_async.integrations._http._responses import (
    HttpResponse,
    Rejection,
    not_available,
    not_stored_response,
    problem,
    stored_response,
)
from idempotency_async.integrations._http._rules import HttpIdempotency

__all__ = ["HttpTransaction", "ResponseKind", "committed", "transaction_answer"]

Resp = TypeVar("Resp")

_REPLAYED_ATTRIBUTE: Final = "idempotency.http.replayed"
# Nothing means "no committed record" (a stored response is never the sentinel).
_NOTHING: Final = object()
# The errors of a transactional call the middleware answers itself (the endpoint's
# transaction is rolled back when they leave it; nothing of the request committed).
_ANSWERED: Final = (
    AlreadyInProgressError,
    PayloadValidationError,
    ResponseNotStoredError,
    TransactionRetryError,
    DeadlineExceededError,
    PersistenceError,
    InconsistentStateError,
)

_log = logging.getLogger("idempotency_async.http")


class ResponseKind(Protocol[Resp]):
    """A framework's response type, as a transactional endpoint returns it."""

    async def respond(self, value: object) -> Resp:
        """The response for what the work returned: a response as it is; FastAPI
        serializes any other value as the route serializes its endpoint's return value.
        ``ConfigError`` for a value the framework cannot send as a whole response."""

    def parts(self, response: Resp) -> tuple[int, list[tuple[str, str]], bytes]:
        """Status, headers (lower-cased names) and whole body; ``ConfigError`` when the
        body is not in hand (a stream)."""

    def build(self, response: HttpResponse) -> Resp:
        """The framework's response for a replay."""

    def mark_not_stored(self, response: Resp) -> None:
        """Add ``Idempotency-Response-Stored: false`` to the endpoint's own response."""


class _ServerError(Exception):
    """Raised from the callback so a 5xx rolls the savepoint back (it is not stored)."""

    def __init__(self, response: object) -> None:
        super().__init__("a server error is not stored")
        self.response = response


class HttpTransaction(Generic[Resp]):
    """One request on a transactional route: what it is keyed and validated by, and
    :meth:`run`, which records the endpoint's response in the endpoint's transaction."""

    def __init__(
        self,
        rules: HttpIdempotency,
        payload: dict[str, Any],
        key: str,
        deadline: float,
        kind: ResponseKind[Resp],
    ) -> None:
        self._rules = rules
        self._payload = payload
        self._deadline = deadline
        self.kind = kind
        """How the framework's responses are made, read and built (an adapter may refine
        it per request: FastAPI's serializes values as the route does)."""
        self.answered = False
        """:meth:`run` returned: the work's response was recorded, or a replay came back.
        An endpoint that returns a response while this is False never ran its transaction
        (the middleware answers 500 instead)."""
        self.key = key
        """The request's Idempotency-Key (unquoted)."""
        self.scope: dict[str, Any] = payload["scope"]
        """What the record's key is derived from: method, route template, caller, key."""
        self.fingerprint: str = payload["fingerprint"]
        """The request's validation hash (path, query, media type, body)."""
        self.record_key: str = rules.key_for(
            self.scope["method"], self.scope["route"], key, self.scope["caller"]
        )
        """The key the record is stored under."""
        self.raised: BaseException | None = None
        """The error :meth:`run` raised that the middleware answers (409, 422, 503...)."""

    @property
    def payload(self) -> dict[str, Any]:
        """What the manager keys and validates (``{"scope": ..., "fingerprint": ...}``)."""
        return self._payload

    async def run(self, connection: Any, work: Callable[[], Awaitable[object]]) -> Resp:
        """Run ``work`` once per key inside ``connection``'s open transaction; return the
        response the endpoint sends.

        ``work()`` writes through ``connection`` and returns the response (its whole body in
        hand) — in FastAPI, or what a plain route returns (a dict, a model), which is
        serialized here as the route would serialize it (``response_model``,
        ``status_code``, ``response_class``, the ``Response`` parameter's status and headers
        as set so far).  The response is encoded and written with the record in a savepoint
        of the transaction, before it commits: commit the transaction, then return what this
        returns.  A 5xx response or an exception rolls the savepoint back (nothing stored, a
        retry runs).  When a duplicate committed first, ``work`` does not run and the stored
        response comes back with ``Idempotent-Replayed: true``.  In-progress, reuse,
        retryable-transaction and store errors propagate: let them leave the transaction (it
        rolls back) and the middleware answers them (409, 422, 503).
        """
        rules = self._rules
        settings = rules.settings
        responses: list[Resp] = []
        not_stored: list[bool] = []

        async def callback() -> dict[str, Any]:
            response = await self.kind.respond(await work())
            status, headers, body = self.kind.parts(response)
            if status >= 500 and not settings.store_server_errors:
                raise _ServerError(response)
            responses.append(response)
            stored, reason = stored_response(
                status,
                headers,
                body,
                replay_headers=settings.replay_headers,
                max_body_bytes=rules.max_response_bytes,
                max_stored_bytes=rules.manager.store.max_response_bytes,
            )
            if stored is None:
                not_stored.append(True)
                return not_stored_response(status, reason)
            return stored

        execute = rules.manager.execute_in_transaction
        attributes = {
            "http.route": self.scope["route"],
            "http.request.method": self.scope["method"],
        }
        try:
            with call_attributes(rules.manager, attributes):
                result = await execute(connection, self._payload, callback, deadline=self._deadline)
        except _ServerError as error:
            self.answered = True
            return error.response  # type: ignore[return-value]
        except _ANSWERED as exc:
            self.raised = exc
            raise
        self.answered = True
        if responses:
            response = responses[-1]
            if not_stored:
                self.kind.mark_not_stored(response)
            return response
        annotate(rules.manager, {_REPLAYED_ATTRIBUTE: True})
        return self.kind.build(rules.replay(result))


async def committed(
    rules: HttpIdempotency, payload: dict[str, Any], deadline: float | None = None
) -> HttpResponse | None:
    """The answer to a request on a transactional route from what is committed, read
    without claiming (bounded by the request's ``deadline``): the replay, 422 or 409; None
    when nothing is (run the endpoint)."""
    try:
        stored = await rules.manager.replay(payload, default=_NOTHING, deadline=deadline)
    except AlreadyInProgressError as exc:
        raise Rejection(in_progress(exc, rules)) from exc
    except PayloadValidationError as exc:
        raise Rejection(reused()) from exc
    except ResponseNotStoredError as exc:
        raise Rejection(not_available(exc.reason)) from exc
    except (PersistenceError, InconsistentStateError, DeadlineExceededError) as exc:
        # (The read outlived the request's deadline: a table locked by a migration, say.)
        raise Rejection(store_unavailable(exc)) from exc
    if stored is _NOTHING:
        return None
    annotate(rules.manager, {_REPLAYED_ATTRIBUTE: True})
    return rules.replay(stored)


def transaction_answer(
    rules: HttpIdempotency, transaction: HttpTransaction[Any], exc: BaseException
) -> HttpResponse | None:
    """The answer to an error the endpoint's :meth:`HttpTransaction.run` raised (None: it
    is not one of them; it propagates as the endpoint's own)."""
    if exc is not transaction.raised:
        return None
    if isinstance(exc, AlreadyInProgressError):
        return in_progress(exc, rules)
    if isinstance(exc, PayloadValidationError):
        return reused()
    if isinstance(exc, ResponseNotStoredError):
        return not_available(exc.reason)
    if isinstance(exc, TransactionRetryError):
        # Nothing of the request committed and the conflict was with a concurrent
        # transaction: the client retries with the same key, as after any 409.
        return problem(
            409,
            "Request conflicted",
            "this request's transaction conflicted with a concurrent one and was rolled "
            "back: retry it with the same Idempotency-Key",
            headers=(("retry-after", "1"),),
        )
    if isinstance(exc, DeadlineExceededError):
        timeout = rules.settings.request_timeout
        return problem(
            504,
            "Request timed out",
            f"the request did not finish within {timeout:g} s and was rolled back: retry "
            "it with the same Idempotency-Key",
            headers=(("retry-after", "1"),),
        )
    assert isinstance(exc, PersistenceError | InconsistentStateError)
    return store_unavailable(exc)
