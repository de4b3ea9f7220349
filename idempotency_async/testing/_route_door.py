"""The route door: an API Gateway (HTTP API) event through a Powertools Event Handler
route with ``idempotent_route``, resolved with ``resolve_async``.

Each process has one resolver with one route (one middleware: one manager per route
function, as a Lambda function has).  The event carries the call's key and amount at its
top level, where the process's ``event_key_jmespath`` and validation find them; its
Lambda context, when the plan has one, gives the remaining time.  The route is the
simulated callback: it behaves as planned, then answers a JSON body with 200 or a 4xx the
status policy stores, or with a status it releases (500, or 408/425/429).

The proxy response is read as a client reads it (an ``HttpAnswer``, kept in
``Outcome.http``) and translated into what a plain call would have got, so the oracle
judges every door the same way.  An exception the route (or the library) raises goes
out of ``resolve_async``, as Powertools lets it.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response

from idempotency_async import Redaction, errors
from idempotency_async.integrations.powertools import idempotent_route
from idempotency_async.manager import Manager
from idempotency_async.testing._doors import Bounds, behave, ledger_run, take_steps
from idempotency_async.testing._http_door import meaning, released
from idempotency_async.testing._plans import CallPlan, status_of
from idempotency_async.testing._trace import HttpAnswer, Outcome, Run, Trace

__all__ = ["PATH", "route_answer", "route_door", "route_key", "route_meaning"]

PATH = "/orders"

_ROUTE: contextvars.ContextVar[Callable[[], Awaitable[Response[str]]]] = contextvars.ContextVar(
    "_ROUTE"
)
"""What the route does for the call being resolved (the task's own)."""


def _event_key(plan: CallPlan) -> str:
    return f"route-{plan.key}"  # a key space of its own: a route stores proxy responses


def route_key(manager: Manager, plan: CallPlan) -> str | None:
    """The store key of the call: its event's key, under the process's prefix (the route
    function's prefix gives way to an explicit one)."""
    return manager.key_for({"id": _event_key(plan)})


def _app_of(trace: Trace, index: int, manager: Manager) -> APIGatewayHttpResolver:
    app: APIGatewayHttpResolver | None = trace.peers.get(("route", index))
    if app is None:
        app = APIGatewayHttpResolver()
        # The adapter refuses a manager that redacts (its paths would find nothing in a
        # proxy response): a never-stored manager's route is declared never-stored
        # instead.  A manager's field redaction is dropped: the stored proxy response is
        # what it was when those paths found nothing in it, so the pair (route, fields)
        # stays in the covering array but does not exercise the adapter's own redaction
        # (tests/test_powertools_routes.py does).
        redaction = manager.options.redaction
        if redaction is not None:
            options = dataclasses.replace(manager.options, redaction=None)
            manager = Manager(manager.store, options)
        kept = Redaction(never_store=True) if redaction and redaction.never_store else None

        @app.post(PATH, middlewares=[idempotent_route(manager, redaction=kept)])
        async def create_order() -> Response[str]:
            return await _ROUTE.get()()

        trace.peers[("route", index)] = app
    return app


def _event(index: int, plan: CallPlan) -> dict[str, Any]:
    body = json.dumps({"amount": plan.amount})
    return {
        "version": "2.0",
        "routeKey": f"POST {PATH}",
        "rawPath": PATH,
        "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "requestContext": {
            "http": {"method": "POST", "path": PATH},
            "requestId": f"request-{index}",
            "stage": "$default",
        },
        "body": body,
        "isBase64Encoded": False,
        "id": _event_key(plan),
        "amount": plan.amount,
    }


def route_door(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome, manager: Manager
) -> Callable[[Bounds], Awaitable[Any]]:
    app = _app_of(trace, plan.manager, manager)
    loop = asyncio.get_running_loop()

    async def route() -> Response[str]:
        with ledger_run(trace, index, plan, outcome, loop) as run:
            return await _respond(plan, index, run, loop, trace)

    async def resolve(bounds: Bounds) -> HttpAnswer:
        token = _ROUTE.set(route)
        try:
            return route_answer(await app.resolve_async(_event(index, plan), bounds.context))  # type: ignore[arg-type]
        finally:
            _ROUTE.reset(token)

    return resolve


async def _respond(
    plan: CallPlan, index: int, run: Run, loop: asyncio.AbstractEventLoop, trace: Trace
) -> Response[str]:
    await take_steps(trace, index, plan, run, loop)
    body = json.dumps({"call": index})
    status = status_of(plan)
    if plan.behaviour in ("server_error", "retry_later"):
        if plan.duration:
            await asyncio.sleep(plan.duration)
        run.error = released(index, status)
        return Response(status, "application/json", run.error.body.decode())
    await behave(plan, index, run, loop, trace.pauses)
    # Returning its response is the route's point of no return (nothing streams): a 200,
    # or a 4xx the policy stores (client_error).
    run.answered = loop.time()
    run.returned = True
    run.value = (status, body.encode())
    return Response(status, "application/json", body)


def route_answer(response: dict[str, Any]) -> HttpAnswer:
    """A proxy response as its client reads it: headers lower-cased, the body decoded."""
    headers = {**(response.get("headers") or {})}
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name] = ",".join(values)
    body = response.get("body") or ""
    raw = base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()
    pairs = tuple((name.lower(), str(value)) for name, value in headers.items())
    return HttpAnswer(response["statusCode"], pairs, raw)


def route_meaning(answer: HttpAnswer, outcome: Outcome) -> tuple[Any, BaseException | None]:
    """What the response means, as a plain call's value or error: a 409 marked replayed
    is a duplicate's "not stored"; a 400 an unkeyable request; the rest as the gate's."""
    replayed = answer.header("idempotent-replayed") == "true"
    if answer.status == 409 and replayed:
        return None, errors.ResponseNotStoredError("409 replayed", key="")
    if answer.status == 400:
        return None, errors.PayloadError("400")
    return meaning(answer, outcome)
