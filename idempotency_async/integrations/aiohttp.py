"""Idempotency-Key support for aiohttp: a middleware factory and a per-handler opt-in.

.. code-block:: python

    app = web.Application(middlewares=[idempotency_middleware(manager, paths=())])

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response: ...

A handler whose work writes to PostgreSQL can record its response in its own transaction
(``docs/postgres.md``, "Transactional calls over HTTP")::

    @transactional_endpoint
    async def create_order(request: web.Request) -> web.Response:
        tx = request_transaction(request)
        async with pool.acquire() as connection, connection.transaction():
            response = await tx.run(connection, lambda: insert(connection, request))
        return response  # committed: only now is the record visible to duplicates

The behaviour is described in ``docs/http.md``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar, cast

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from idempotency_async.errors import ConfigError
from idempotency_async.integrations._http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_DEPTH,
    DEFAULT_METHODS,
    DEFAULT_REQUEST_TIMEOUT,
    STORED_HEADER,
    CallerScope,
    HttpIdempotency,
    HttpResponse,
    HttpSettings,
    HttpTransaction,
    PathPattern,
    Rejection,
    RequestState,
    ResponseGate,
    ResponseKind,
    content_length,
    exchange,
    host_route,
    too_large,
)
from idempotency_async.manager import Manager

__all__ = [
    "HttpTransaction",
    "RequestState",
    "idempotency_middleware",
    "idempotent_endpoint",
    "request_state",
    "request_transaction",
    "transactional_endpoint",
]

_H = TypeVar("_H", bound=Handler)


# aiohttp 3.14 types request storage with RequestKey (and warns on plain string keys);
# earlier versions have no RequestKey and take the string.
_STATE_KEY: web.RequestKey[RequestState] = (
    web.RequestKey("idempotency_async", RequestState)
    if hasattr(web, "RequestKey")
    else "idempotency_async"  # type: ignore[assignment]
)
_MARKED: weakref.WeakSet[Handler] = weakref.WeakSet()
_TRANSACTIONAL: weakref.WeakSet[Handler] = weakref.WeakSet()


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
        # The handler runs: a response it starts (prepare) or returns is its own.
        state.endpoint_ran = True
        try:
            return await handler(request)
        except BaseException:
            state.endpoint_ran = False
            raise

    _MARKED.add(endpoint)
    return cast(_H, endpoint)


def transactional_endpoint(handler: _H) -> _H:
    """Make a handler transactional: it records its response in its own database
    transaction through :func:`request_transaction`, whatever its method or path.

    The middleware does not claim the key for it: it replays a committed response (or
    answers 409/422) without running the handler, and otherwise runs it.  The key is
    required (400 without it).  A request reaching the handler without
    :func:`idempotency_middleware` raises :class:`~idempotency_async.errors.ConfigError`.
    """

    @functools.wraps(handler)
    async def endpoint(request: web.Request) -> web.StreamResponse:
        state = request_state(request)
        request_transaction(request)  # the middleware ran: else a ConfigError (a 500)
        assert state is not None
        # A response the handler returns is its own: one returned before its transaction
        # ran is answered with a 500 (see docs/http.md); one it raises goes out as it is.
        state.endpoint_ran = True
        try:
            return await handler(request)
        except BaseException:
            state.endpoint_ran = False
            raise

    _MARKED.add(endpoint)
    _TRANSACTIONAL.add(endpoint)
    return cast(_H, endpoint)


def request_transaction(request: web.Request) -> HttpTransaction[web.Response]:
    """The :class:`HttpTransaction` of a request to a :func:`transactional_endpoint`
    (``.key``, ``.scope``, ``.fingerprint``, and ``await .run(connection, work)``:
    ``work()`` writes through ``connection`` and returns the ``web.Response``)."""
    state = request_state(request)
    transaction = None if state is None else state.transaction
    if not isinstance(transaction, HttpTransaction):
        raise ConfigError(
            "request_transaction() needs the handler decorated with @transactional_endpoint "
            "and the application's idempotency middleware, e.g. web.Application("
            "middlewares=[idempotency_middleware(manager)])"
        )
    return transaction


def idempotency_middleware(
    manager: Manager,
    *,
    methods: Iterable[str] = DEFAULT_METHODS,
    paths: Iterable[PathPattern] | None = None,
    required: bool = False,
    caller_scope: CallerScope | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
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
    The returned middleware has ``.manager`` (the manager it runs, derived from
    ``manager``) and ``.key_for(method, route, key, caller=None)`` (a request's key).
    """
    rules = HttpIdempotency(
        manager,
        HttpSettings(
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
        ),
    )

    routing = _DomainRouting()

    @web.middleware
    async def idempotency(request: web.Request, handler: Handler) -> web.StreamResponse:
        match_info = request.match_info
        resource = match_info.route.resource
        if match_info.http_exception is not None or resource is None:
            return await handler(request)
        marked = match_info.handler in _MARKED
        if not rules.settings.applies(request.method, request.path, marked=marked):
            return await handler(request)
        template = resource.canonical
        if routing.by_domain(match_info.apps):
            template = host_route(request.headers.get("host", ""), request.scheme, template)
        transactional = match_info.handler in _TRANSACTIONAL
        adapter = _Aiohttp(rules, request, handler, template, marked, transactional)
        return await exchange(rules, adapter)

    # The manager it runs (derived from ``manager``) and the key of a request, reachable
    # as with IdempotencyMiddleware: for force_release and record look-ups.
    idempotency.manager = rules.manager  # type: ignore[attr-defined]
    idempotency.key_for = rules.key_for  # type: ignore[attr-defined]
    return idempotency


class _DomainRouting:
    """Whether requests through a chain of applications were routed by host, worked out
    once per chain: a frozen application's routes no longer change, and walking every
    resource of every parent on each request costs as much as the routes are many."""

    def __init__(self) -> None:
        # By root application (gone with it), then by the chain of sub-applications below
        # it, by identity: they live as long as the root's router that holds them.  Keyed
        # by id with a weak reference, not a WeakKeyDictionary: applications before
        # aiohttp 3.11 are unhashable.
        self._chains: dict[int, tuple[weakref.ref[web.Application], dict[tuple[int, ...], bool]]]
        self._chains = {}

    def by_domain(self, apps: tuple[web.Application, ...]) -> bool:
        if len(apps) < 2:
            return False  # no sub-application: nothing was routed by host
        root = apps[0]
        entry = self._chains.get(id(root))
        if entry is None or entry[0]() is not root:
            entry = (weakref.ref(root, self._forget(id(root))), {})
            self._chains[id(root)] = entry
        chains = entry[1]
        chain = tuple(map(id, apps[1:]))
        routed = chains.get(chain)
        if routed is None:
            routed = chains[chain] = _by_domain(apps)
        return routed

    def _forget(self, key: int) -> Callable[[weakref.ref[web.Application]], None]:
        def forget(gone: weakref.ref[web.Application]) -> None:
            entry = self._chains.get(key)
            if entry is not None and entry[0] is gone:
                del self._chains[key]

        return forget


def _by_domain(apps: tuple[web.Application, ...]) -> bool:
    """Whether a request was routed by its host: one of the sub-applications it went
    through was added with ``add_domain`` (the route's template leaves the host out)."""
    for parent, child in itertools.pairwise(apps):
        for resource in parent.router.resources():
            info = resource.get_info()
            if info.get("app") is child and "rule" in info:
                return True
    return False


class _Aiohttp:
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
        self.kind: ResponseKind[web.Response] = _RESPONSES
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
        self.request[_STATE_KEY] = state

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
        request._payload_writer = tee = _TeeWriter(original, gate)
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


_RESPONSES = _Responses()


class _TeeWriter(AbstractStreamWriter):
    """Forwards a response's writes to the real writer and copies them into a capture."""

    def __init__(self, inner: AbstractStreamWriter, gate: ResponseGate) -> None:
        self._inner = inner
        self._gate = gate
        self._client_gone = False
        self.from_file = False
        """The response is a ``FileResponse``: a body it announces goes out by sendfile."""
        self._compressing = False

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
        self._gate.write(bytes(chunk))
        await self._forward(self._inner.write(chunk))

    async def write_eof(self, chunk: bytes = b"") -> None:
        self._gate.write(bytes(chunk))
        await self._gate.end()
        await self._forward(self._inner.write_eof(chunk))

    async def _forward(self, sending: Awaitable[None]) -> None:
        if self._client_gone:
            sending.close()  # type: ignore[attr-defined]
            return
        try:
            await sending
        except OSError:
            # The client went away: the handler goes on, so the record gets the whole
            # body when the handler produces it.
            self._client_gone = True
            self._gate.client_gone()

    async def drain(self) -> None:
        if not self._client_gone:
            await self._inner.drain()

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        # The writer compresses what passes through here: the capture holds the body
        # before its coding.
        self._compressing = True
        self._inner.enable_compression(encoding, strategy)

    def enable_chunking(self) -> None:
        self._inner.enable_chunking()

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        status = int(status_line.split(" ", 2)[1])
        captured = [(name.lower(), value) for name, value in headers.items()]
        if self._compressing:
            # aiohttp codes the body below this writer: the captured bytes are the body
            # before its coding, so the record keeps it without its Content-Encoding.
            captured = [(name, value) for name, value in captured if name != "content-encoding"]
        # The point of no return: recorded before the head is forwarded.
        not_stored = await self._gate.start(status, captured, None)
        if self.from_file and content_length(captured):
            # The file's bytes will not pass through here (an empty or missing file's
            # answer has no body to lose, and is recorded as it is).
            not_stored = self._gate.untrackable() or not_stored
        if not_stored:
            headers[STORED_HEADER] = "false"
        await self._inner.write_headers(status_line, headers)

    def send_headers(self) -> None:
        self._inner.send_headers()
