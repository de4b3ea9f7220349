"""The response gate's phases and the ASGI messages it is told about.

The phases are walked directly with a call that records its writes (what the record
receives at each step); the ASGI message decisions go through uvicorn on loopback, with a
shim standing in for a server that knows a message type the middleware does not.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from _http_apps import serve_asgi

from idempotency_async import Manager, MemoryStore, errors
from idempotency_async.integrations._http import (
    HttpIdempotency,
    HttpSettings,
    RequestState,
    ResponseGate,
)
from idempotency_async.integrations._http._gate import Phase
from idempotency_async.integrations.starlette import IdempotencyMiddleware

CALLER = "the-caller"
UNKNOWN = "http.response.x-vendor-extension"


class RecordingCall:
    """Stands in for the manager's Call handle: keeps each completion write, in order."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    async def complete(self, result: Any) -> None:
        self.writes.append(("complete", result))

    async def complete_without_response(self, reason: str) -> None:
        self.writes.append(("without", reason))


def _gate(*, marked: bool = False, ran: bool = False, **settings: Any) -> ResponseGate:
    rules = HttpIdempotency(
        Manager(MemoryStore()), HttpSettings(caller_scope=lambda request: CALLER, **settings)
    )
    state = RequestState("k", endpoint_ran=ran)
    gate = ResponseGate(rules, state, marked)
    gate.call = RecordingCall()  # type: ignore[assignment]
    return gate


def _writes(gate: ResponseGate) -> list[tuple[str, Any]]:
    call = gate.call
    assert isinstance(call, RecordingCall)
    return call.writes


async def test_a_plain_response_is_completed_with_its_body_before_it_goes_out() -> None:
    gate = _gate()
    assert gate.phase is Phase.AWAITING_HEAD and not gate.forwarded

    flagged = await gate.start(201, [("content-type", "text/plain")], b"done")

    assert not flagged and gate.phase is Phase.ENDED and gate.forwarded
    ((kind, result),) = _writes(gate)
    assert kind == "complete" and result["status"] == 201
    assert base64.b64decode(result["body_b64"]) == b"done"
    assert await gate.endpoint_returned()  # completed: never released
    assert len(_writes(gate)) == 1


class FailingCall(RecordingCall):
    """A Call whose completion writes raise ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def complete(self, result: Any) -> None:
        raise self.error

    async def complete_without_response(self, reason: str) -> None:
        raise self.error


async def test_a_failed_completion_is_logged_and_the_response_goes_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The gate answers a failed write by the one table (_answers): SENT_UNRECORDED.
    gate = _gate()
    failed = errors.LeaseLostError("lost", key="k", result=None, outcome_unknown=False)
    gate.call = FailingCall(failed)  # type: ignore[assignment]

    with caplog.at_level("ERROR", logger="idempotency_async.http"):
        flagged = await gate.start(201, [("content-type", "text/plain")], b"done")

    assert not flagged and gate.phase is Phase.ENDED
    assert "recording the response failed; it is sent all the same" in caplog.text


async def test_an_error_the_table_does_not_answer_propagates_from_a_completion() -> None:
    # It was logged and swallowed once (any IdempotencyError): a misuse must surface.
    gate = _gate()
    gate.call = FailingCall(errors.ConfigError("a misuse"))  # type: ignore[assignment]

    with pytest.raises(errors.ConfigError, match="a misuse"):
        await gate.start(201, [("content-type", "text/plain")], b"done")


async def test_a_stream_is_recorded_at_its_head_and_its_body_attached_at_its_end() -> None:
    gate = _gate()

    assert not await gate.start(200, [("content-type", "text/plain")], None)
    assert gate.phase is Phase.STREAMING
    gate.write(b"first ")
    gate.write(b"second")
    await gate.end()

    assert gate.phase is Phase.ENDED
    (head_kind, head_reason), (end_kind, result) = _writes(gate)
    assert head_kind == "without" and head_reason.startswith("HTTP 200: streamed response")
    assert end_kind == "complete"
    assert base64.b64decode(result["body_b64"]) == b"first second"


async def test_a_stream_past_the_limit_overflows_and_ends_not_stored() -> None:
    gate = _gate(max_response_bytes=8)

    await gate.start(200, [], None)
    gate.write(b"12345")
    gate.write(b"67890")
    assert gate.phase is Phase.OVERFLOWED and gate.body == bytearray()
    gate.write(b"more")  # no longer captured
    await gate.end()

    assert gate.phase is Phase.ENDED and gate.body == bytearray()
    kind, reason = _writes(gate)[-1]
    assert kind == "without" and "grew past the limit of 8 bytes" in reason


async def test_a_declared_length_past_the_limit_flags_the_head_at_once() -> None:
    gate = _gate(max_response_bytes=8)

    assert await gate.start(200, [("content-length", "9")], None)
    assert gate.phase is Phase.OVERFLOWED


@pytest.mark.parametrize(
    ("status", "marked", "ran"),
    [(500, False, False), (503, False, False), (201, True, False)],
    ids=["500", "503", "not-the-endpoint's"],
)
async def test_a_head_that_is_not_the_records_passes_and_releases(
    status: int, marked: bool, ran: bool
) -> None:
    gate = _gate(marked=marked, ran=ran)

    assert not await gate.start(status, [], b"oops")

    assert gate.phase is Phase.PASSING and gate.forwarded
    assert not await gate.endpoint_returned()  # the key is released
    assert _writes(gate) == []


async def test_a_stream_whose_endpoint_raised_still_completes() -> None:
    gate = _gate()
    await gate.start(200, [], None)

    await gate.endpoint_failed(ValueError("midway"))

    assert gate.phase is Phase.ENDED
    kind, reason = _writes(gate)[-1]
    assert kind == "without" and "raised ValueError while streaming" in reason


async def test_no_head_at_all_releases() -> None:
    gate = _gate()
    assert not await gate.endpoint_returned()
    assert gate.phase is Phase.AWAITING_HEAD and _writes(gate) == []


async def test_a_second_response_head_is_refused() -> None:
    gate = _gate()
    await gate.start(201, [], b"one")

    with pytest.raises(RuntimeError, match="second response head"):
        await gate.start(200, [], b"two")

    assert gate.phase is Phase.ENDED and len(_writes(gate)) == 1


# ---------------------------------------------------------------------- settings


def test_settings_are_normalized_once_and_are_what_the_middleware_applies() -> None:
    options: dict[str, Any] = {
        "methods": ["post", "put"],
        "paths": ["/orders*"],
        "replay_headers": ["X-Trace", "Set-Cookie"],
        "request_timeout": 5,
        "caller_scope": None,
    }
    settings = HttpSettings(**options)

    assert settings.methods == frozenset({"POST", "PUT"})
    assert settings.paths == ("/orders*",)
    assert "x-trace" in settings.replay_headers and "content-type" in settings.replay_headers
    assert "set-cookie" not in settings.replay_headers  # never replayed, even when asked
    assert settings.request_timeout == 5.0 and isinstance(settings.request_timeout, float)
    assert settings.applies("PUT", "/orders/1", marked=False)
    assert not settings.applies("PATCH", "/orders/1", marked=False)
    assert settings.applies("GET", "/elsewhere", marked=True)
    middleware = IdempotencyMiddleware(_no_app, manager=Manager(MemoryStore()), **options)
    assert middleware.rules.settings == settings


@pytest.mark.parametrize(
    "bad",
    [
        {"request_timeout": 0},
        {"max_body_bytes": -1},
        {"max_body_depth": 0},
        {"max_response_bytes": -1},
        {"wait": 3.0},
        {"wait": True},
    ],
)
def test_bad_settings_are_a_config_error_at_construction(bad: dict[str, Any]) -> None:
    name = next(iter(bad))
    with pytest.raises(errors.ConfigError, match=name):
        HttpSettings(**bad)


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


# ---------------------------------------------------------------------- ASGI messages


class _VendorServer:
    """Between uvicorn and the middleware: a server that takes one message type uvicorn
    does not know (``UNKNOWN``), and notes the order of what it is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def server_send(message: Any) -> None:
            self.sent.append(message["type"])
            if message["type"] != UNKNOWN:
                await send(message)

        await self.app(scope, receive, server_send)


def _sending(*messages: dict[str, Any]) -> tuple[Any, list[int]]:
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        runs.append(1)
        for message in messages:
            await send(message)

    return app, runs


_HEAD = {
    "type": "http.response.start",
    "status": 201,
    "headers": [(b"content-type", b"text/plain")],
}
_BODY = {"type": "http.response.body", "body": b"the body", "more_body": False}
_VENDOR = {"type": UNKNOWN}


async def _twice(app: Any) -> tuple[_VendorServer, httpx.Response, httpx.Response]:
    middleware = IdempotencyMiddleware(
        app, manager=Manager(MemoryStore()), caller_scope=lambda request: CALLER
    )
    server = _VendorServer(middleware)
    async with (
        serve_asgi(server) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as client,
    ):
        first = await client.post("/vendor", headers={"Idempotency-Key": "v"})
        again = await client.post("/vendor", headers={"Idempotency-Key": "v"})
    return server, first, again


async def test_an_unknown_message_while_the_head_is_held_sends_the_head_first_as_a_stream() -> None:
    app, runs = _sending(_HEAD, _VENDOR, _BODY)

    server, first, again = await _twice(app)

    # The head went first (the body was not in hand: a stream), then the message, in order.
    assert server.sent[:3] == ["http.response.start", UNKNOWN, "http.response.body"]
    assert first.status_code == 201 and first.text == "the body"
    assert "idempotency-response-stored" not in first.headers
    # The stream was captured whole, so the record carries its body.
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.text == "the body"
    assert runs == [1]


async def test_an_unknown_message_before_the_head_is_forwarded_and_the_response_stored() -> None:
    app, runs = _sending(_VENDOR, _HEAD, _BODY)

    server, first, again = await _twice(app)

    assert server.sent[:3] == [UNKNOWN, "http.response.start", "http.response.body"]
    assert first.status_code == 201 and first.text == "the body"
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.text == "the body"
    assert runs == [1]
