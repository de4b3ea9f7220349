"""Transactional routes: the endpoint records its response in its own database transaction.

The middleware never claims for such a route; it answers what is already committed and
hands the endpoint an :class:`HttpTransaction`::

    key, body ──> payload ──> Manager.keyed(payload)      (its key derived once, here)
                  ──> KeyedPayload.replay()                    (one read, no claim)
                               │ completed ──> replay | 422        (the endpoint never runs)
                               │ in progress (a lease) ──> 409
                               └ nothing committed ──> the endpoint runs, and calls
    HttpTransaction.run(connection, work) ──> KeyedPayload.execute_call_in_transaction(...)
        work() returns the response (FastAPI: or a value, serialized as the route would)
                               ──> encoded as the middleware stores responses, written
                                   in the savepoint; 5xx: Call.release (rolled back, not
                                   stored) and sent as it is
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

from idempotency_async._call import Call
from idempotency_async.instrumentation import annotate, call_attributes
from idempotency_async.integrations._http._answers import Answer, Stage, decide, respond
from idempotency_async.integrations._http._responses import (
    HttpResponse,
    Rejection,
    not_stored_response,
    stored_response,
    stores_status,
)
from idempotency_async.integrations._http._rules import HttpIdempotency
from idempotency_async.integrations._http._settings import REPLAYED_ATTRIBUTE
from idempotency_async.manager import KeyedPayload

__all__ = ["HttpTransaction", "ResponseKind", "committed", "transaction_answer"]

Resp = TypeVar("Resp")

# Nothing means "no committed record" (a stored response is never the sentinel).
_NOTHING: Final = object()

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


class HttpTransaction(Generic[Resp]):
    """One request on a transactional route: what it is keyed and validated by, and
    :meth:`run`, which records the endpoint's response in the endpoint's transaction."""

    def __init__(
        self,
        rules: HttpIdempotency,
        keyed: KeyedPayload,
        key: str,
        deadline: float,
        kind: ResponseKind[Resp],
    ) -> None:
        self._rules = rules
        self._keyed = keyed
        self._payload: dict[str, Any] = keyed.payload
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
        self.scope: dict[str, Any] = self._payload["scope"]
        """What the record's key is derived from: method, route template, caller, key."""
        self.fingerprint: str = self._payload["fingerprint"]
        """The request's validation hash (path, query, media type, body)."""
        self.raised: BaseException | None = None
        """The error :meth:`run` raised that the middleware answers (409, 422, 503...)."""

    @property
    def record_key(self) -> str:
        """The key the record is stored under (derived once, for the read and the call)."""
        found = self._keyed.key
        assert found is not None  # the scope is never missing
        return found

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
        ran: list[Resp] = []  # the work's response, once it ran
        not_stored: list[bool] = []

        async def callback(call: Call) -> dict[str, Any] | None:
            response = await self.kind.respond(await work())
            ran.append(response)
            status, headers, body = self.kind.parts(response)
            if not stores_status(status, settings.store_server_errors):
                call.release(f"a {status} response is not stored")  # its writes roll back
                return None
            stored, reason = stored_response(
                status,
                headers,
                body,
                replay_headers=settings.replay_headers,
                max_body_bytes=rules.max_response_bytes,
                max_stored_bytes=rules.manager.store.max_response_bytes,
                redaction=settings.redaction_for(str(self.scope.get("route", ""))),
            )
            if stored is None:
                not_stored.append(True)
                return not_stored_response(status, reason)
            return stored

        execute = self._keyed.execute_call_in_transaction
        attributes = {
            "http.route": self.scope["route"],
            "http.request.method": self.scope["method"],
        }
        try:
            with call_attributes(rules.manager, attributes):
                result = await execute(connection, callback, deadline=self._deadline)
        except Exception as exc:
            if decide(exc, Stage.IN_TRANSACTION) is not Answer.RAISE:
                self.raised = exc  # the middleware answers it once it left the endpoint
            raise
        self.answered = True
        if ran:
            response = ran[-1]
            if not_stored:
                self.kind.mark_not_stored(response)
            return response
        annotate(rules.manager, {REPLAYED_ATTRIBUTE: True})
        return self.kind.build(rules.replay(result))


async def committed(
    rules: HttpIdempotency, keyed: KeyedPayload, deadline: float | None = None
) -> HttpResponse | None:
    """The answer to a request on a transactional route from what is committed, read
    without claiming (bounded by the request's ``deadline``): the replay, 422 or 409; None
    when nothing is (run the endpoint)."""
    try:
        stored = await keyed.replay(default=_NOTHING, deadline=deadline)
    except Exception as exc:
        answer = decide(exc, Stage.READING)
        response = None if answer is Answer.RAISE else respond(answer, exc, rules)
        if response is None:
            raise
        raise Rejection(response) from exc
    if stored is _NOTHING:
        return None
    annotate(rules.manager, {REPLAYED_ATTRIBUTE: True})
    return rules.replay(stored)


def transaction_answer(
    rules: HttpIdempotency, transaction: HttpTransaction[Any], exc: BaseException
) -> HttpResponse | None:
    """The answer to an error the endpoint's :meth:`HttpTransaction.run` raised (None: it
    is not one of them, or it was not left as run() raised it; it propagates as the
    endpoint's own)."""
    if exc is not transaction.raised:
        return None
    return respond(decide(exc, Stage.IN_TRANSACTION), exc, rules)
