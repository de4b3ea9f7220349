"""The HTTP door: an Idempotency-Key request through the gate's ASGI adapter, in process.

The app behind the gate is the simulated callback: it reads the body, behaves as planned,
then answers — a plain JSON body (200, or a 4xx the status policy stores), a stream, or a
status the policy releases (a 5xx, or 408/425/429: ``_plans.status_of``).  With
``middleware`` a compressing middleware (as Starlette's ``GZipMiddleware``) sits between
the gate and the app.  The client's answer is translated into what a plain call would have
got (the endpoint's own response is its result, a 409 is ``AlreadyInProgressError``...),
so the oracle judges every door the same way; ``Outcome.http`` keeps the response itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from idempotency_async import errors
from idempotency_async.integrations._http import (
    AsgiAdapter,
    HttpIdempotency,
    HttpSettings,
    exchange,
)
from idempotency_async.manager import Manager
from idempotency_async.testing._doors import Bounds, behave, ledger_run, take_steps
from idempotency_async.testing._plans import CallPlan, status_of
from idempotency_async.testing._trace import (
    HttpAnswer,
    Outcome,
    Released,
    RetryLater,
    Run,
    ServerError,
    Trace,
)

__all__ = ["ROUTE", "decoded", "http_door", "http_key", "meaning", "released"]

Message = MutableMapping[str, Any]
ROUTE = "/orders"


def decoded(answer: HttpAnswer) -> tuple[int, bytes]:
    """What a response means to its client: its status and its body as decoded by its own
    headers (a gzip body labelled so is read unzipped)."""
    return answer.decoded()


def _rules_of(trace: Trace, manager_index: int, manager: Manager) -> HttpIdempotency:
    """One gate (one derived manager: one single-flight table, one cache) per process."""
    rules = trace.http_rules.get(manager_index)
    if rules is None:
        # The process's manager as the middleware takes it (it selects keys itself).
        options = dataclasses.replace(
            manager.options,
            event_key_jmespath=None,
            payload_validation_jmespath=None,
            redaction=None,  # the middleware redacts its own envelope (not crossed here)
            replay_errors=None,  # the middleware refuses it: an endpoint answers by status
        )
        rules = HttpIdempotency(Manager(manager.store, options), HttpSettings())
        trace.http_rules[manager_index] = rules
    return rules


def http_key(trace: Trace, manager_index: int, manager: Manager, key: int) -> str:
    """The store key of a request to ``ROUTE`` carrying ``Idempotency-Key: k<key>``."""
    return _rules_of(trace, manager_index, manager).key_for("POST", ROUTE, f"k{key}")


def http_door(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome, manager: Manager
) -> Callable[[Bounds], Awaitable[Any]]:
    loop = asyncio.get_running_loop()
    assert plan.key is not None

    async def app(scope: Message, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body", False):
            pass
        with ledger_run(trace, index, plan, outcome, loop) as run:
            await _respond(plan, index, run, loop, trace, send)

    served = _compressing(app) if plan.middleware else app

    async def request(bounds: Bounds) -> Any:
        rules = _copy(_rules_of(trace, plan.manager, manager), bounds, plan.http_limit)
        body = json.dumps({"amount": plan.amount}).encode()
        received: list[Message] = []
        delivered = False
        never = asyncio.Event()

        async def client_receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()
            return {"type": "http.disconnect"}

        async def client_send(message: Message) -> None:
            received.append(message)

        scope: Message = {
            "type": "http",
            "method": "POST",
            "path": ROUTE,
            "query_string": b"",
            "headers": [
                (b"idempotency-key", f"k{plan.key}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        adapter = AsgiAdapter(
            served,
            rules,
            scope,
            client_receive,
            client_send,
            template=ROUTE,
            marked=False,
            key_required=False,
            request=None,
        )
        await exchange(rules, adapter)
        return _answer(received)

    return request


def _copy(rules: HttpIdempotency, bounds: Bounds, limit: int | None) -> HttpIdempotency:
    """The process's gate with this request's ``request_timeout`` and response limit (the
    same derived manager: one in-flight table and cache per process)."""
    assert bounds.timeout is not None
    copy = object.__new__(HttpIdempotency)
    copy.__dict__.update(rules.__dict__)
    settings = dataclasses.replace(rules.settings, request_timeout=bounds.timeout)
    if limit is not None:
        settings = dataclasses.replace(settings, max_response_bytes=limit)
        copy.max_response_bytes = limit
    copy.settings = settings
    return copy


def _answer(messages: list[Message]) -> HttpAnswer | None:
    status = 0
    headers: tuple[tuple[str, str], ...] = ()
    body = b""
    for message in messages:
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = tuple(
                (name.decode("latin-1").lower(), value.decode("latin-1"))
                for name, value in message.get("headers", [])
            )
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")
    return HttpAnswer(status, headers, body) if status else None


async def _respond(
    plan: CallPlan,
    index: int,
    run: Run,
    loop: asyncio.AbstractEventLoop,
    trace: Trace,
    send: Callable[[Message], Awaitable[None]],
) -> None:
    await take_steps(trace, index, plan, run, loop)
    behaviour = plan.behaviour
    payload = json.dumps({"call": index}).encode()
    json_head = [(b"content-type", b"application/json")]
    status = status_of(plan)
    if behaviour in ("server_error", "retry_later"):
        if plan.duration:
            await asyncio.sleep(plan.duration)
        run.error = released(index, status)
        body = run.error.body
        await send({"type": "http.response.start", "status": status, "headers": json_head})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return
    if behaviour == "stream":
        if plan.duration:
            await asyncio.sleep(plan.duration / 2)  # the endpoint's work before its head
        head = json_head
        if plan.content_length:
            head = [*json_head, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        # The first chunk makes the head go out: the point of no return.
        run.answered = loop.time()
        run.returned = True
        run.value = (200, payload)
        half = len(payload) // 2
        await send({"type": "http.response.body", "body": payload[:half], "more_body": True})
        if plan.duration:
            await asyncio.sleep(plan.duration / 2)
        await send({"type": "http.response.body", "body": payload[half:], "more_body": False})
        return
    await behave(plan, index, run, loop, trace.pauses)
    # 200, or a 4xx the policy stores (client_error): either is the endpoint's result.
    await send({"type": "http.response.start", "status": status, "headers": json_head})
    run.answered = loop.time()
    run.returned = True
    run.value = (status, payload)
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def released(index: int, status: int) -> Released:
    """What call ``index``'s endpoint answering ``status`` (one the policy releases) is to
    the oracle: its run's error, carrying the response its own client must get."""
    body = json.dumps({"call": index, "status": status}).encode()
    kind = ServerError if status >= 500 else RetryLater
    return kind(f"call {index} answered {status}", status, body)


def _compressing(app: Any) -> Any:
    """A middleware gzipping whole (not streamed) response bodies, as GZipMiddleware does."""

    async def compressed(scope: Message, receive: Any, send: Any) -> None:
        held: Message | None = None

        async def forward(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                head, held = held, None
                if not message.get("more_body", False):
                    body = gzip.compress(message.get("body", b""), mtime=0)
                    headers = [
                        (name, value)
                        for name, value in head.get("headers", [])
                        if name.lower() != b"content-length"
                    ]
                    headers += [
                        (b"content-encoding", b"gzip"),
                        (b"content-length", str(len(body)).encode()),
                    ]
                    await send({**head, "headers": headers})
                    await send({**message, "body": body})
                    return
                await send(head)
            await send(message)

        await app(scope, receive, forward)

    return compressed


def meaning(answer: HttpAnswer | None, outcome: Outcome) -> tuple[Any, BaseException | None]:
    """What the client's answer means, as a plain call's value or error."""
    if answer is None:
        return None, errors.IdempotencyError("no response")
    runs = [run for run in outcome.runs if run.answered is not None or run.error is not None]
    replayed = answer.header("idempotent-replayed") == "true"
    if runs and not replayed and answer.status not in (409, 422, 503, 504):
        run = runs[-1]
        if isinstance(run.error, Released):
            return None, run.error
        if run.returned and decoded(answer) == run.value:
            return run.value, None  # its own response
        return decoded(answer), None
    if replayed:
        if answer.header("idempotency-response-stored") == "false":
            return None, errors.ResponseNotStoredError("replayed as not stored", key="")
        return decoded(answer), None
    if answer.status == 409:
        after = answer.header("retry-after")
        return None, errors.AlreadyInProgressError(
            "409", key="", retry_after=None if after is None else float(after)
        )
    if answer.status == 422:
        return None, errors.PayloadValidationError("422", key="")
    if answer.status == 503:
        return None, errors.StoreUnavailableError("503")
    if answer.status == 504:
        return None, errors.DeadlineExceededError("504")
    return decoded(answer), None
