"""The aiohttp side of one idempotent request: the adapter the middleware hands to
:func:`~idempotency_async.integrations._http.exchange` (which decides; this moves bytes).

The request body is read here up to the limit and handed back to the request, so the
handler reads it however it likes; the handler's response is sent through a
:class:`~._aiohttp_writer.TeeWriter`, so its head is the point of no return.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Final, cast

from aiohttp import web
from aiohttp.payload import Payload
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._aiohttp_writer import TeeWriter
from idempotency_async.integrations._http import (
    STORED_HEADER,
    HttpIdempotency,
    HttpResponse,
    Rejection,
    RequestState,
    ResponseGate,
    ResponseKind,
    too_large,
)

__all__ = ["RESPONSES", "STATE_KEY", "AiohttpAdapter"]

# aiohttp 3.14 types request storage with RequestKey (and warns on plain string keys);
# earlier versions have no RequestKey and take the string.
STATE_KEY: web.RequestKey[RequestState] = (
    web.RequestKey("idempotency_async", RequestState)
    if hasattr(web, "RequestKey")
    else "idempotency_async"  # type: ignore[assignment]
)
"""Where the request's :class:`RequestState` is kept on the ``web.Request``."""


class AiohttpAdapter:
    """The aiohttp side of one idempotent request (algorithm: :mod:`._http._exchange`)."""

    def __init__(
        self,
        rules: HttpIdempotency,
        request: web.Request,
        handler: Handler,
        template: str,
        marked: bool,
        transactional: bool,
    ) -> None:
        self.rules = rules
        self.request = request
        self.handler = handler
        self.template = template
        self.marked = marked
        self.transactional = transactional
        self.kind: ResponseKind[web.Response] = RESPONSES
        # A transactional handler returns its response whole (run() records it): it
        # never starts one the middleware could not replace with an answer.
        self.head_sent = False
        self.key_required = rules.settings.required or transactional
        self.method = request.method
        self.path = request.path
        # As the handler reads them (``request.query``): ``query_string`` is decoded
        # already, and parsing it would decode it a second time.
        self.query = list(request.query.items())
        self.response: web.StreamResponse | None = None

    def headers(self, name: str) -> list[str]:
        return self.request.headers.getall(name, [])

    def install(self, state: RequestState) -> None:
        self.request[STATE_KEY] = state

    async def passthrough(self) -> web.StreamResponse:
        return await self.handler(self.request)

    async def forward(
        self, body: bytes, vet: Callable[[int], HttpResponse | None]
    ) -> web.StreamResponse:
        # The body was handed back to the request when it was read (read_body).
        response = await self.handler(self.request)
        instead = vet(response.status)
        if instead is None or response.prepared:  # a prepared head is out: logged only
            return response
        return await self.answer(instead)

    def live(self) -> web.StreamResponse:
        if self.response is None:
            # The handler was cut off after it had started a 5xx (or unrecorded) response:
            # its head is out, so aiohttp can only close the connection.
            raise web.HTTPGatewayTimeout()
        return self.response

    async def answer(self, response: HttpResponse) -> web.StreamResponse:
        return web.Response(
            status=response.status, headers=CIMultiDict(response.headers), body=response.body
        )

    async def read_body(self, limit: int) -> bytes:
        """The whole body, read chunk by chunk so that reading stops at the limit.

        ``request.read()`` would buffer up to the app's ``client_max_size`` before the
        limit could be checked.  The request then gets a fresh stream holding the same
        bytes, so the handler reads them however it likes: ``read()``, ``text()``,
        ``json()``, ``post()`` (multipart too), ``multipart()`` or ``request.content``.
        """
        # The application's own limit (web.Application(client_max_size=...)) still holds.
        app_limit = getattr(self.request, "_client_max_size", 0)
        if app_limit:
            limit = min(limit, app_limit)
        body = bytearray()
        content = self.request._payload
        while chunk := await content.readany():
            body += chunk
            if len(body) > limit:
                raise Rejection(too_large(limit))  # the limit that applied, the app's too
        data = bytes(body)
        self._replay_body(data)
        return data

    def _replay_body(self, data: bytes) -> None:
        request = self.request
        if not data:
            return  # the stream is at its end already: every read gets b"", as it would
        # A high-water mark above the body: the stream never asks the connection's
        # protocol to pause reading (nothing more arrives on it for this request).
        stream = StreamReader(
            request.protocol, max(len(data), 1) * 2, loop=asyncio.get_running_loop()
        )
        if data:
            stream.feed_data(data)
        stream.feed_eof()
        request._payload = stream
        request._cache.pop("content", None)  # ``request.content`` is cached once read
        if request.content is not stream:  # never silently hand the handler b""
            raise RuntimeError("this aiohttp version does not keep request bodies as expected")

    async def run_endpoint(self, body: bytes, gate: ResponseGate) -> None:
        request = self.request
        original = request._payload_writer
        # aiohttp has no public hook on a response's writes: the writer of this request is
        # swapped for a tee while the handler runs, so streamed bodies are captured too.
        request._payload_writer = tee = TeeWriter(original, gate)
        try:
            response = self.response = await self.handler(request)
            if response.prepared:
                await response.write_eof()  # the handler streamed it through the tee
            elif isinstance(response, web.Response) and not isinstance(response.body, Payload):
                # A plain response: recorded with its body here, sent by aiohttp once the
                # middlewares return (outside the callback and its cutoff).
                data = b"" if response.body is None else bytes(cast(bytes, response.body))
                headers = [(name.lower(), value) for name, value in response.headers.items()]
                if await gate.start(response.status, headers, data):
                    response.headers[STORED_HEADER] = "false"
            else:
                # Sent here, through the tee, so that its head is the point of no return.
                # A FileResponse sends its body with sendfile, around the tee.
                tee.from_file = isinstance(response, web.FileResponse)
                await response.prepare(request)
                await response.write_eof()
                _sent(response)
        finally:
            request._payload_writer = original


def _sent(response: web.StreamResponse) -> None:
    """Make aiohttp's own ``prepare`` of a response the middleware already sent a no-op.

    aiohttp prepares whatever the handler chain returns.  ``StreamResponse.prepare`` does
    nothing once the body has ended; ``FileResponse.prepare`` opens and sends the file again
    (and fails, dropping the connection): the base class's is the one that applies now.
    """
    if type(response).prepare is not web.StreamResponse.prepare:
        response.prepare = functools.partial(  # type: ignore[method-assign]
            web.StreamResponse.prepare, response
        )


class _Responses:
    """aiohttp responses, as a transactional handler returns them (see
    :class:`HttpTransaction`)."""

    async def respond(self, value: object) -> web.Response:
        return value  # type: ignore[return-value]  # checked by parts()

    def parts(self, response: web.Response) -> tuple[int, list[tuple[str, str]], bytes]:
        whole = isinstance(response, web.Response) and not response.prepared
        body = response.body if whole else None
        if not whole or not isinstance(body, bytes | bytearray | memoryview | None):
            raise ConfigError(
                "the work of a transactional call must return an unsent web.Response with "
                f"its whole body (e.g. web.json_response(...)), got {type(response).__name__}: "
                "a streamed, prepared or payload body cannot be recorded in the transaction"
            )
        headers = [(name.lower(), value) for name, value in response.headers.items()]
        return response.status, headers, b"" if body is None else bytes(body)

    def build(self, response: HttpResponse) -> web.Response:
        return web.Response(
            status=response.status, headers=CIMultiDict(response.headers), body=response.body
        )

    def mark_not_stored(self, response: web.Response) -> None:
        response.headers[STORED_HEADER] = "false"


RESPONSES: Final = _Responses()
"""How a transactional handler's ``web.Response`` is read, built and marked."""
