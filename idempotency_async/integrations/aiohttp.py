"""Idempotency-Key support for aiohttp: a middleware factory and a per-handler opt-in.

.. code-block:: python

    app = web.Application(middlewares=[idempotency_middleware(manager, paths=())])

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response: ...

The rules are those of :mod:`idempotency_async.integrations._http`; see ``docs/http.md``.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Iterable
from typing import TypeVar, cast

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    KEY_HEADER,
    STORED_HEADER,
    CallerScope,
    Capture,
    HttpIdempotency,
    HttpResponse,
    PathPattern,
    Rejection,
    RequestState,
    parse_key,
)
from idempotency_async.manager import Manager

__all__ = ["RequestState", "idempotency_middleware", "idempotent_endpoint", "request_state"]

_H = TypeVar("_H", bound=Handler)


_STATE_KEY = web.RequestKey("idempotency_async", RequestState)
_MARKED: weakref.WeakSet[Handler] = weakref.WeakSet()


def request_state(request: web.Request) -> RequestState | None:
    """The middleware's state of this request (the key is ``.key``); None if it did not see it."""
    return request.get(_STATE_KEY)


def idempotent_endpoint(handler: _H) -> _H:
    """Opt a handler in to Idempotency-Key handling, whatever its method or path.

    The response is stored only when the handler *returns* it: a raised
    ``web.HTTPException`` (or any exception) releases the key and is not stored.  A
    request reaching the handler without :func:`idempotency_middleware` on the
    application raises :class:`~idempotency_async.errors.ConfigError` (a 500) before the
    handler runs.
    """

    @functools.wraps(handler)
    async def endpoint(request: web.Request) -> web.StreamResponse:
        state = request_state(request)
        if state is None:
            # Without the middleware every duplicate would run the handler again, silently.
            raise ConfigError(
                f"{handler.__qualname__} is an @idempotent_endpoint, but the application has "
                "no idempotency middleware: add it, e.g. web.Application(middlewares="
                "[idempotency_middleware(manager)])"
            )
        response = await handler(request)
        state.endpoint_returned = True
        return response

    _MARKED.add(endpoint)
    return cast(_H, endpoint)


def idempotency_middleware(
    manager: Manager,
    *,
    methods: Iterable[str] = DEFAULT_METHODS,
    paths: Iterable[PathPattern] | None = None,
    required: bool = False,
    caller_scope: CallerScope | None = None,
    request_timeout: float = 30.0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_body_depth: int = DEFAULT_MAX_BODY_DEPTH,
    max_response_bytes: int | None = None,
    store_server_errors: bool = False,
    replay_headers: Iterable[str] = (),
    wait: bool | None = None,
    wait_timeout: float | None = None,
) -> Middleware:
    """A middleware running each idempotent request once per ``Idempotency-Key``.

    Parameters as for :class:`~idempotency_async.integrations.starlette.IdempotencyMiddleware`;
    ``caller_scope`` receives the ``web.Request``.  Handlers decorated with
    :func:`idempotent_endpoint` are idempotent whatever ``methods`` and ``paths`` say.
    Put it last in ``middlewares`` so authentication middlewares reject requests first.
    """
    rules = HttpIdempotency(
        manager,
        methods=methods,
        paths=paths,
        required=required,
        caller_scope=caller_scope,
        request_timeout=request_timeout,
        max_body_bytes=max_body_bytes,
        max_body_depth=max_body_depth,
        max_response_bytes=max_response_bytes,
        store_server_errors=store_server_errors,
        replay_headers=replay_headers,
        wait=wait,
        wait_timeout=wait_timeout,
    )

    @web.middleware
    async def idempotency(request: web.Request, handler: Handler) -> web.StreamResponse:
        match_info = request.match_info
        resource = match_info.route.resource
        if match_info.http_exception is not None or resource is None:
            return await handler(request)
        marked = match_info.handler in _MARKED
        if not rules.applies(request.method, request.path, marked=marked):
            return await handler(request)
        return await _Exchange(rules, request, handler, resource.canonical, marked).run()

    return idempotency


class _Exchange:
    """One idempotent request: its body, its capture, and what to answer."""

    def __init__(
        self,
        rules: HttpIdempotency,
        request: web.Request,
        handler: Handler,
        template: str,
        marked: bool,
    ) -> None:
        self.rules = rules
        self.request = request
        self.handler = handler
        self.template = template
        self.marked = marked
        self.capture = Capture(rules.settings.max_response_bytes)
        self.response: web.StreamResponse | None = None

    async def run(self) -> web.StreamResponse:
        request = self.request
        try:
            key = parse_key(
                request.headers.getall(KEY_HEADER, []), required=self.rules.settings.required
            )
            request[_STATE_KEY] = RequestState(key)
            if key is None:
                return await self.handler(request)
            self.rules.check_length(request.headers.get("Content-Length"))
            body = await self._read_body()
            payload = self.rules.payload(
                method=request.method,
                route=self.template,
                caller=await self.rules.caller(request),
                key=key,
                path=request.path,
                query=request.query_string,
                content_type=request.headers.get("Content-Type"),
                body=body,
            )
            self.capture.endpoint_ran = not self.marked
            replay = await self.rules.handle(payload, self._run_handler, self.capture)
        except Rejection as rejection:
            replay = rejection.response
        if replay is not None:
            return _to_response(replay)
        assert self.response is not None
        return self.response

    async def _read_body(self) -> bytes:
        """The whole body, read chunk by chunk so that reading stops at the limit.

        ``request.read()`` would buffer up to the app's ``client_max_size`` before the
        limit could be checked.  The body is handed back to aiohttp's cache, so the
        handler's ``read()``/``json()`` get it without reading the stream again.
        """
        limit = self.rules.settings.max_body_bytes
        # The application's own limit (web.Application(client_max_size=...)) still holds.
        app_limit = getattr(self.request, "_client_max_size", 0)
        if app_limit:
            limit = min(limit, app_limit)
        body = bytearray()
        content = self.request.content
        while chunk := await content.readany():
            body += chunk
            if len(body) > limit:
                raise Rejection(self.rules.too_large())
        data = bytes(body)
        self.request._read_bytes = data
        if await self.request.read() is not data:  # never silently hand the handler b""
            raise RuntimeError("this aiohttp version does not cache request bodies as expected")
        return data

    async def _run_handler(self) -> None:
        request = self.request
        original = request._payload_writer
        # aiohttp has no public hook on a response's writes: the writer of this request is
        # swapped for a tee while the handler runs, so streamed bodies are captured too.
        request._payload_writer = _TeeWriter(original, self.capture)
        try:
            response = self.response = await self.handler(request)
            if response.prepared:
                await response.write_eof()  # the handler streamed it through the tee
            elif isinstance(response, web.Response) and not isinstance(response.body, Payload):
                self._capture_unsent(response)
            else:
                await response.prepare(request)
                await response.write_eof()
        finally:
            request._payload_writer = original
        state = request_state(request)
        if self.marked and state is not None:
            self.capture.endpoint_ran = state.endpoint_returned

    def _capture_unsent(self, response: web.Response) -> None:
        body = response.body
        data = b"" if body is None else bytes(cast(bytes | bytearray, body))
        headers = [(name.lower(), value) for name, value in response.headers.items()]
        if self.capture.start(response.status, headers) or len(data) > self.capture.limit:
            response.headers[STORED_HEADER] = "false"
        self.capture.write(data, more=False)


def _to_response(answer: HttpResponse) -> web.Response:
    return web.Response(status=answer.status, headers=CIMultiDict(answer.headers), body=answer.body)


class _TeeWriter(AbstractStreamWriter):
    """Forwards a response's writes to the real writer and copies them into a capture."""

    def __init__(self, inner: AbstractStreamWriter, capture: Capture) -> None:
        self._inner = inner
        self._capture = capture
        self._client_gone = False

    @property
    def buffer_size(self) -> int:
        return self._inner.buffer_size

    @buffer_size.setter
    def buffer_size(self, value: int) -> None:
        self._inner.buffer_size = value

    @property
    def output_size(self) -> int:
        return self._inner.output_size

    @output_size.setter
    def output_size(self, value: int) -> None:
        self._inner.output_size = value

    @property
    def length(self) -> int | None:
        return self._inner.length

    @length.setter
    def length(self, value: int | None) -> None:
        self._inner.length = value

    @property
    def transport(self) -> asyncio.WriteTransport | None:
        return self._inner.transport

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self._capture.write(bytes(chunk), more=True)
        if not self._client_gone:
            try:
                await self._inner.write(chunk)
            except OSError:
                # The client went away: the handler goes on, so the record completes and
                # the client's retry gets the replay.
                self._client_gone = True

    async def write_eof(self, chunk: bytes = b"") -> None:
        self._capture.write(bytes(chunk), more=False)
        if not self._client_gone:
            try:
                await self._inner.write_eof(chunk)
            except OSError:
                self._client_gone = True

    async def drain(self) -> None:
        if not self._client_gone:
            await self._inner.drain()

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        self._inner.enable_compression(encoding, strategy)

    def enable_chunking(self) -> None:
        self._inner.enable_chunking()

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        status = int(status_line.split(" ", 2)[1])
        captured = [(name.lower(), value) for name, value in headers.items()]
        if self._capture.start(status, captured):
            headers[STORED_HEADER] = "false"
        await self._inner.write_headers(status_line, headers)

    def send_headers(self) -> None:
        self._inner.send_headers()
