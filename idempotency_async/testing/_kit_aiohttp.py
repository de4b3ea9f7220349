"""The test kit's aiohttp door: a route of your ``web.Application``, served in process.

No socket and no client library: the app runs behind aiohttp's own server protocol
(``AppRunner``), which reads each request's bytes from a transport of the kit's and writes
the response back to it, so the request goes through aiohttp's parser, your middlewares
and your handler as it would on a server — on the kit's virtual clock.  A middleware of
the kit's, put first, counts the awaits of the task aiohttp handles the request in (the
call's crash points); a crash there, or of the call itself, ends the request as a dropped
connection does (the server cancels its handler).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idempotency_async.stores.base import Store
from idempotency_async.testing._kit_steps import STEPS, stepping
from idempotency_async.testing._kit_targets import HttpAnswer, Sender, callable_name

__all__ = ["AiohttpRoute"]


@dataclass(frozen=True, slots=True)
class AiohttpRoute:
    """A route of an aiohttp app built on a store by ``build``; each payload is its JSON
    body, sent with ``key_header`` carrying the scenario's request key."""

    build_app: Callable[[Store], Any]
    path: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    key_header: str = "Idempotency-Key"

    def build(self, store: Store) -> Sender:
        from aiohttp import web

        app = self.build_app(store)
        app.middlewares.insert(0, web.middleware(_counting))
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, handler_cancellation=True
        )
        ready = asyncio.ensure_future(runner.setup())  # the app's on_startup runs here

        async def send(payload: Any, request_key: str) -> HttpAnswer:
            await asyncio.shield(ready)
            return await _exchange(runner.server, self._request(payload, request_key))

        return send

    def _request(self, payload: Any, request_key: str) -> bytes:
        body = json.dumps(payload).encode()
        lines = [
            f"{self.method} {self.path} HTTP/1.1",
            "Host: kit",
            f"{self.key_header}: {request_key}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        return request_key

    def expression(self) -> str:
        extra = f", method={self.method!r}" if self.method != "POST" else ""
        if self.headers:
            extra += f", headers={self.headers!r}"
        if self.key_header != "Idempotency-Key":
            extra += f", key_header={self.key_header!r}"
        return f"aiohttp_route({callable_name(self.build_app)}, {self.path!r}{extra})"


async def _counting(request: Any, handler: Any) -> Any:
    steps = STEPS.get()
    if steps is None:
        return await handler(request)
    return await stepping(handler(request), steps)


class _Transport(asyncio.Transport):
    """The server's side of one connection: what it writes is kept; closing it ends the
    exchange."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def is_closing(self) -> bool:
        return self.closed.done()

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def abort(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 80)}.get(name, default)


async def _exchange(server: Any, request: bytes) -> HttpAnswer:
    transport = _Transport()
    protocol = server()
    protocol.connection_made(transport)
    protocol.data_received(request)
    try:
        await asyncio.shield(transport.closed)
    except asyncio.CancelledError:
        # The caller is gone (a crash): the connection drops and the server cancels the
        # handler where it is.
        protocol.connection_lost(None)
        raise
    protocol.connection_lost(None)
    steps = STEPS.get()
    if not transport.written and steps is not None and steps.cancelled:
        # The request's task was cancelled at a crash point: the call crashed with it.
        raise asyncio.CancelledError
    return _answer(bytes(transport.written))


def _answer(raw: bytes) -> HttpAnswer:
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head:
        raise ConnectionError("the server closed the connection without a response")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = tuple(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(":") for line in header_lines)
    )
    if dict(headers).get("transfer-encoding") == "chunked":
        body = _dechunked(body)
    try:
        decoded: Any = json.loads(body) if body else None
    except ValueError:
        decoded = body
    return HttpAnswer(status, decoded, headers)


def _dechunked(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)
