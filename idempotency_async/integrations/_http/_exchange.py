"""One idempotent HTTP request, from its header to its last byte, for every framework.

The response lifecycle (the point of no return is the first response head)::

    key, body ──> payload ──> Manager.execute_call(payload, run the endpoint)
                               │ duplicate ──> replay | 409 | 422        (nothing ran)
                               │ store down ─> 503    │ cut off ─> 504   (nothing forwarded)
    endpoint produces a head ──┤
        5xx, or the endpoint did not run ──> forwarded; the key is released at the end
        < 500 with the whole body in hand (plain) ──> completed WITH the response, then sent
        < 500 streamed ──> completed "not stored" BEFORE the head is forwarded, then sent
                           outside the cutoff; at the end of the body the captured body is
                           attached (or the reason it is not is written)
    after the head: background tasks, slow or vanished clients, failures ──> never a release

Each framework supplies an :class:`Adapter` that moves bytes; the algorithm is here once,
and the head's decisions are the :class:`~._gate.ResponseGate`'s.  A transactional route
is never claimed here: its endpoint records its response in its own transaction, and the
exchange only answers what is committed (see :mod:`._transaction`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from idempotency_async._call import Call
from idempotency_async.errors import CompletionError, ConfigError
from idempotency_async.instrumentation import annotate, call_attributes
from idempotency_async.integrations._http._answers import Answer, Stage, decide, respond
from idempotency_async.integrations._http._fingerprint import check_length
from idempotency_async.integrations._http._gate import ResponseGate
from idempotency_async.integrations._http._keys import KEY_HEADER, parse_key
from idempotency_async.integrations._http._markers import RequestState
from idempotency_async.integrations._http._responses import HttpResponse, Rejection, problem
from idempotency_async.integrations._http._rules import HttpIdempotency
from idempotency_async.integrations._http._settings import REPLAYED_ATTRIBUTE
from idempotency_async.integrations._http._transaction import (
    HttpTransaction,
    ResponseKind,
    committed,
    transaction_answer,
)

__all__ = ["Adapter", "exchange", "run"]

R = TypeVar("R")

Vet = Callable[[int], HttpResponse | None]
"""Judges the status of a transactional endpoint's response before it goes out."""
R_co = TypeVar("R_co", covariant=True)

_log = logging.getLogger("idempotency_async.http")


class Adapter(Protocol[R_co]):
    """What an exchange needs from a framework, for one request."""

    method: str
    path: str
    query: list[tuple[str, str]]
    """The query pairs as the application decodes them."""
    template: str
    """The matched route's path template (after the matched host on host-routed routes,
    see :func:`._keys.host_route`)."""
    marked: bool
    """The route is opted in by a marker that tells whether the endpoint ran."""
    transactional: bool
    """The route is transactional: never claimed here (see :mod:`._transaction`)."""
    kind: ResponseKind[Any]
    """The framework's response type, for transactional routes."""
    head_sent: bool
    """A response head of the endpoint's went out (set by :meth:`forward`)."""
    key_required: bool
    request: Any
    """What ``caller_scope`` receives."""

    def headers(self, name: str) -> list[str]: ...

    def install(self, state: RequestState) -> None:
        """Make ``state`` reachable from the request (the markers read and set it)."""

    async def read_body(self, limit: int) -> bytes | None:
        """The whole body (:class:`Rejection` past ``limit``); None: the client left."""

    async def passthrough(self) -> R_co:
        """Run the endpoint without idempotency."""

    async def run_endpoint(self, body: bytes, gate: ResponseGate) -> None:
        """Run the endpoint, telling ``gate`` about its response before forwarding it."""

    async def forward(self, body: bytes, vet: Vet) -> R_co:
        """Run the endpoint on the body already read; its response goes out as it is,
        unless ``vet(status)``, called with the status of the endpoint's response before
        its head goes out, returns another response to send instead."""

    def live(self) -> R_co:
        """What to return once the endpoint's own response went (or is going) out."""

    async def answer(self, response: HttpResponse) -> R_co:
        """Send a response of the middleware's own (a replay or a problem)."""


async def exchange(rules: HttpIdempotency, adapter: Adapter[R]) -> R:
    """Handle one request the rules apply to, under one deadline from its start (reading
    the body included), whatever the route's kind."""
    deadline = asyncio.get_running_loop().time() + rules.settings.request_timeout
    try:
        key = parse_key(adapter.headers(KEY_HEADER), required=adapter.key_required)
        state = RequestState(key)
        adapter.install(state)
        if key is None:
            return await adapter.passthrough()
        declared = adapter.headers("content-length")
        check_length(declared[0] if declared else None, rules.settings.max_body_bytes)
        body = await adapter.read_body(rules.settings.max_body_bytes)
        if body is None:
            return adapter.live()  # the client went away before sending its body
        content_type = adapter.headers("content-type")
        payload = rules.payload(
            method=adapter.method,
            route=adapter.template,
            caller=await rules.caller(adapter.request),
            key=key,
            path=adapter.path,
            query=adapter.query,
            content_type=content_type[0] if content_type else None,
            body=body,
        )
        if adapter.transactional:
            keyed = rules.manager.keyed(payload)  # one derivation: the read and the call
            answer = await committed(rules, keyed, deadline)
            if answer is None:
                transaction = HttpTransaction(rules, keyed, key, deadline, adapter.kind)
                state.transaction = transaction
                return await _in_transaction(rules, adapter, state, transaction, body)
        else:
            gate = ResponseGate(rules, state, adapter.marked, adapter.template)
            answer = await run(
                rules, payload, lambda: adapter.run_endpoint(body, gate), gate, deadline
            )
    except Rejection as rejection:
        answer = rejection.response
    return adapter.live() if answer is None else await adapter.answer(answer)


async def _in_transaction(
    rules: HttpIdempotency,
    adapter: Adapter[R],
    state: RequestState,
    transaction: HttpTransaction[Any],
    body: bytes,
) -> R:
    """Run a transactional route's endpoint: it records its response itself; the errors
    of its transactional call that leave it are answered here (409, 422, 503, 504), and
    a response it returns without having run its transaction is replaced by a 500."""

    def vet(status: int) -> HttpResponse | None:
        # Responses the endpoint did not return (request validation, raised HTTP errors)
        # and server errors are no success: they go out as they are.
        if transaction.answered or not state.endpoint_ran or status >= 500:
            return None
        error = ConfigError(
            f"the transactional route {adapter.method} {adapter.template} returned a "
            f"{status} response without running its transaction: nothing was recorded, so "
            "a retry runs it again. Return what `await tx.run(connection, work)` returned "
            "(FastAPI: tx: IdempotentTransaction; aiohttp: request_transaction(request))"
        )
        _log.error("%s; answered 500 instead", error)
        rules.manager.report("transaction_not_run", transaction.record_key, error=error)
        return problem(
            500,
            "Internal Server Error",
            "the server did not record this request: it may or may not have taken effect",
        )

    try:
        return await adapter.forward(body, vet)
    except Exception as exc:
        answer = transaction_answer(rules, transaction, exc)
        if answer is None or adapter.head_sent:
            raise
    return await adapter.answer(answer)


async def run(
    rules: HttpIdempotency,
    payload: dict[str, Any],
    endpoint: Callable[[], Awaitable[None]],
    gate: ResponseGate,
    deadline: float,
) -> HttpResponse | None:
    """Run ``endpoint`` once per key, until ``deadline`` (``loop.time()``); None when it
    ran (its response went out live).

    Returns the answer to send instead; exceptions of the endpoint propagate (before the
    point of no return the key was released first).
    """

    async def callback(call: Call) -> Any:
        gate.call = call
        try:
            await endpoint()
        except Exception as exc:
            gate.raised = exc
            await gate.endpoint_failed(exc)
            raise
        if not await gate.endpoint_returned():
            # The response went out live and is not recorded: a retry runs the endpoint.
            call.release("the response was a server error or the endpoint did not run")
            return None
        if gate.status:
            annotate(rules.manager, {"http.response.status_code": gate.status})
        return None

    scope = payload.get("scope") or {}
    attributes: dict[str, str | int | float | bool] = {
        name: value
        for name, value in (
            ("http.route", scope.get("route")),
            ("http.request.method", scope.get("method")),
        )
        if isinstance(value, str)
    }
    try:
        with call_attributes(rules.manager, attributes):
            stored = await rules.manager.execute_call(payload, callback, deadline=deadline)
    except Exception as exc:
        if exc is gate.raised and isinstance(exc, CompletionError):
            # The endpoint's own (a step whose recovery point was not recorded, or whose
            # lease was lost): not a completion of the gate's that failed after the
            # response went out — nothing went out for it.  It propagates, as the
            # endpoint's other exceptions do.
            raise
        answer = decide(exc, _stage(gate))
        if answer is Answer.RAISE:
            raise
        return respond(answer, exc, rules)
    if gate.call is not None:
        return None
    annotate(rules.manager, {**attributes, REPLAYED_ATTRIBUTE: True})
    return rules.replay(stored)


def _stage(gate: ResponseGate) -> Stage:
    if gate.call is None:
        return Stage.CLAIMING
    return Stage.FORWARDED if gate.forwarded else Stage.RUNNING
