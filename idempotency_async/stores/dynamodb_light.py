"""A light DynamoDB client for Lambda cold starts: SigV4 over HTTP/1.1 on asyncio streams.

:class:`LightDynamoDBClient` speaks DynamoDB's JSON protocol with the few operations
:class:`~idempotency_async.stores.dynamodb.DynamoDBStore` sends (``put_item``,
``get_item``, ``update_item``, ``delete_item``, ``query``, ``scan``), taking and returning
the same dictionaries as an aioboto3 client.  It loads neither botocore nor aiohttp: HTTP
is ``h11`` (the HTTP/1.1 engine under httpx) on asyncio's own streams, signing is the
standard library's ``hmac``.  Install with ``pip install "idempotency-async[dynamodb-light]"``.

Scope, on purpose: credentials passed in or taken from the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``: what Lambda
sets), the region passed in or from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, the regional
endpoint or one given (``endpoint_url``, ``AWS_ENDPOINT_URL_DYNAMODB``,
``AWS_ENDPOINT_URL``).  Anything else — profiles, SSO, instance or container roles, FIPS
endpoints, proxies — is aioboto3's job, which stays the default.

Like the SDK: requests that were throttled, failed with a 5xx, a connection error, a
timeout or a bad CRC32 are retried with full-jitter exponential backoff, up to
``max_attempts`` attempts in all; connections are kept alive and reused (across warm
Lambda invocations too, when the client outlives the handler); TLS is verified with the
system's certificate store.  See ``docs/lambda.md``, "Cold start".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import random
import re
import ssl
import zlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import urlsplit

import h11
import orjson

from idempotency_async._redact import redact_url
from idempotency_async.errors import ConfigError
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores._dynamodb_errors import THROTTLED, ServiceError
from idempotency_async.stores._sigv4 import Credentials, sign

__all__ = ["LightDynamoDBClient"]

_TARGET_PREFIX: Final = "DynamoDB_20120810."
_CONTENT_TYPE: Final = "application/x-amz-json-1.0"
_USER_AGENT: Final = "idempotency-async-light/1"
# On the wire: a Query or Scan page holds at most 1 MB of items, one item 400 KB; their
# JSON takes at most a few times that.
_MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
# Decoded: a few hundred bytes of Python objects per JSON value (object, array or element).
# DynamoDB's item size counts at least one byte per value (an attribute or element and its
# type), so an answer about one item (400 KB) holds at most ~410,000 values, and a page
# (1 MB, items of at least two bytes with their own objects) ~1.6 million.  An answer with
# more is not DynamoDB's, whatever its size on the wire: 2.7 MB of empty maps take 104 MiB
# once parsed (benchmarks/light_answer_memory.py).
_ITEM_VALUES: Final = 420_000
_PAGE_VALUES: Final = 1_600_000
_PAGE_OPERATIONS: Final = frozenset({"Query", "Scan"})
# DynamoDB nests at most 32 levels; deeper answers would exhaust the stack when decoded.
_MAX_NESTING: Final = 64
_READ_CHUNK: Final = 256 * 1024  # reading pauses when this much is unread
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_RETRIED_STATUS: Final = frozenset({500, 502, 503, 504})
_RETRIED_CODES: Final = THROTTLED | {
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
}
# Attribute-value maps in answers, whose binary values arrive as Base64 text.
_ITEM_FIELDS: Final = ("Item", "Attributes", "LastEvaluatedKey")
# What a request may carry in a header or a signature: visible ASCII, no space.  A value
# with a newline, a space or a control character (a secret read from a file with its line
# break) cannot be sent, and h11 would quote it whole in its error.
_SENDABLE: Final = re.compile(r"[\x21-\x7e]+")
# A region is a DNS label (as botocore checks it): it becomes part of the endpoint's host.
_REGION: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")

logger = logging.getLogger("idempotency_async.dynamodb")


class LightDynamoDBClient:
    """A DynamoDB client for :class:`~idempotency_async.stores.dynamodb.DynamoDBStore` that
    starts in milliseconds (no botocore).

    Use it as the store's client factory, so the store opens it on first use and closes it
    in ``aclose()``::

        store = DynamoDBStore(client_factory=LightDynamoDBClient, table_name="idempotency")

    or open it yourself (``async with LightDynamoDBClient() as client:``) and pass
    ``client=``.  Missing credentials or region raise
    :class:`~idempotency_async.errors.ConfigError` here, before any request.

    ``connect_timeout`` and ``read_timeout`` bound each attempt (seconds);
    ``max_attempts`` counts the first attempt; ``max_connections`` bounds the requests in
    flight (further ones wait for a connection).
    """

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        max_attempts: int = 3,
        max_connections: int = 10,
    ) -> None:
        env = os.environ
        region_from = "region="
        if not region:
            region_from = "AWS_REGION" if env.get("AWS_REGION") else "AWS_DEFAULT_REGION"
        self.region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
        if not self.region:
            raise ConfigError(
                "LightDynamoDBClient needs a region: pass region= or set AWS_REGION "
                "(Lambda sets it)"
            )
        if not isinstance(self.region, str) or _REGION.fullmatch(self.region) is None:
            # It becomes the endpoint's host name: "x@evil.example/#" would send the signed
            # request, session token included, elsewhere.
            raise ConfigError(
                f"{region_from} is not an AWS region name such as eu-west-1 (letters, digits "
                f"and '-'), got {str(self.region)[:64]!r}"
            )
        from_environment = access_key_id is None and secret_access_key is None
        if from_environment:
            access_key_id = env.get("AWS_ACCESS_KEY_ID")
            secret_access_key = env.get("AWS_SECRET_ACCESS_KEY")
        if not access_key_id or not secret_access_key:
            raise ConfigError(
                "LightDynamoDBClient needs credentials: pass access_key_id= and "
                "secret_access_key= or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(Lambda sets them); for profiles, SSO or instance roles use an aioboto3 client"
            )
        if from_environment and session_token is None:
            # The environment's token belongs to the environment's key pair only.
            session_token = env.get("AWS_SESSION_TOKEN")
        names = (
            ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
            if from_environment
            else ("access_key_id=", "secret_access_key=", "session_token=")
        )
        secrets = (access_key_id, secret_access_key, session_token or None)
        for name, secret in zip(names, secrets, strict=True):
            _check_credential(name, secret)
        self._credentials = Credentials(access_key_id, secret_access_key, session_token or None)
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if max_attempts < 1 or max_connections < 1:
            raise ConfigError(
                f"max_attempts and max_connections must be at least 1, got {max_attempts} "
                f"and {max_connections}"
            )
        self.endpoint_url = _endpoint(endpoint_url, self.region)
        self._scheme, self._host, self._port, self._host_header = _parse_endpoint(self.endpoint_url)
        if self._scheme == "http" and not _is_loopback(self._host):
            logger.warning(
                "LightDynamoDBClient sends signed requests to %s over plain http://: the "
                "session token and the records travel unencrypted; use https:// for anything "
                "but a local DynamoDB",
                redact_url(self.endpoint_url),
            )
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    def __repr__(self) -> str:
        endpoint = redact_url(self.endpoint_url)
        return f"LightDynamoDBClient(region={self.region!r}, endpoint_url={endpoint!r})"

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the idle connections; the client refuses requests afterwards."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.aclose()

    # -- operations (the names and arguments of aioboto3's client) ------------------

    async def put_item(self, **request: Any) -> dict[str, Any]:
        return await self.request("PutItem", request)

    async def get_item(self, **request: Any) -> dict[str, Any]:
        return await self.request("GetItem", request)

    async def update_item(self, **request: Any) -> dict[str, Any]:
        return await self.request("UpdateItem", request)

    async def delete_item(self, **request: Any) -> dict[str, Any]:
        return await self.request("DeleteItem", request)

    async def query(self, **request: Any) -> dict[str, Any]:
        return await self.request("Query", request)

    async def scan(self, **request: Any) -> dict[str, Any]:
        return await self.request("Scan", request)

    async def request(self, operation: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one DynamoDB operation (``"PutItem"``, ...) with retries; return its answer.

        Raises ``ServiceError`` for DynamoDB's error answers and ``OSError`` /
        ``TimeoutError`` when it cannot be reached; the store turns both into the
        library's typed errors; ``ConfigError`` once the client was closed.
        """
        if self._closed:
            raise closed_error("LightDynamoDBClient")
        try:
            body = orjson.dumps(request, default=_encode_bytes)
        except TypeError as exc:  # orjson.JSONEncodeError: e.g. a lone surrogate in a string
            raise ServiceError(
                {"Error": {"Code": "SerializationException", "Message": str(exc)}}
            ) from exc
        headers = {
            "host": self._host_header,
            "content-type": _CONTENT_TYPE,
            "x-amz-target": _TARGET_PREFIX + operation,
            "content-length": str(len(body)),
        }
        attempt = 1
        while True:
            try:
                return await self._attempt(operation, headers, body)
            except h11.LocalProtocolError:
                # Our own request could not be written (h11 refused a header); its message
                # quotes the header's value, which may be a credential.  Not retried.
                raise ConnectionError(
                    f"the {operation} request could not be written as HTTP/1.1 (a header "
                    "value holds a character HTTP does not allow)"
                ) from None
            except (ServiceError, OSError, TimeoutError, h11.RemoteProtocolError) as exc:
                if attempt >= self._max_attempts or not _retryable(exc):
                    if isinstance(exc, h11.RemoteProtocolError):
                        # Its message quotes the answer's bytes: an endpoint echoing the
                        # request would put the signed headers in it.
                        raise ConnectionError(
                            f"DynamoDB's answer to {operation} is not valid HTTP/1.1"
                        ) from None
                    raise
            # Full jitter, DynamoDB's 50 ms base, doubling: as botocore's legacy mode.
            await asyncio.sleep(random.random() * min(20.0, 0.05 * 2 ** (attempt - 1)))
            attempt += 1

    # -- one attempt ----------------------------------------------------------------

    async def _attempt(
        self, operation: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        signed = sign(
            method="POST",
            path="/",
            headers=headers,
            body=body,
            credentials=self._credentials,
            region=self.region,
            service="dynamodb",
        )
        signed["user-agent"] = _USER_AGENT
        async with self._slots:
            connection = self._idle_connection() or await self._connect()
            try:
                async with asyncio.timeout(self._read_timeout):
                    status, answer_headers, payload = await connection.round_trip(signed, body)
            except BaseException:
                # Half-used (failed, timed out or cancelled): never reused, and closed
                # without awaiting anything, so a cancellation propagates at once.
                connection.abort()
                raise
            if not self._closed and connection.pool():
                self._idle.append(connection)
            else:
                await connection.aclose()
        return _decode_answer(operation, status, answer_headers, payload)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.take():
                return connection
            connection.abort()
        return None

    async def _connect(self) -> _Connection:
        tls = self._scheme == "https"
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout):
            transport, wire = await loop.create_connection(
                _Wire,
                self._host,
                self._port,
                ssl=_tls_context() if tls else None,
                server_hostname=self._host if tls else None,
            )
        return _Connection(transport, wire)


class _Wire(asyncio.Protocol):
    """The bytes a connection received and not read yet, and whether any came while it
    sat in the pool (an answer nobody asked for: the connection is spoiled)."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.closed = False
        self.idle = False
        self.spoiled = False
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.BaseTransport | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self.idle:
            # An answer nobody asked for: never read; the connection is closed when next
            # taken from the pool.
            self.spoiled = True
            self._transport.pause_reading()  # type: ignore[union-attr]
            return
        self.received += data
        if len(self.received) > _READ_CHUNK:
            self._transport.pause_reading()  # type: ignore[union-attr]
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()
        if not self.gone.done():
            self.gone.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        """What arrived since the last read, waiting for something; ``b""`` once closed."""
        while not self.received and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self.received)
        self.received.clear()
        if not self.closed:
            self._transport.resume_reading()  # type: ignore[union-attr]
        return data


class _Connection:
    """One keep-alive HTTP/1.1 connection driven by h11."""

    def __init__(self, transport: asyncio.BaseTransport, wire: _Wire) -> None:
        self._transport: Any = transport
        self._wire = wire
        self._http = h11.Connection(h11.CLIENT)

    async def round_trip(
        self, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        http = self._http
        data = http.send(h11.Request(method="POST", target="/", headers=list(headers.items())))
        data = (data or b"") + (http.send(h11.Data(data=body)) or b"")
        data += http.send(h11.EndOfMessage()) or b""
        self._transport.write(data)
        status = 0
        answer_headers: dict[bytes, bytes] = {}
        chunks: list[bytes] = []
        size = 0
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                http.receive_data(await self._wire.read())
            elif isinstance(event, h11.Response):
                status = event.status_code
                answer_headers = dict(event.headers)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > _MAX_RESPONSE_BYTES:
                    raise _Unreadable(f"DynamoDB's answer exceeds {_MAX_RESPONSE_BYTES} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, answer_headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("DynamoDB closed the connection before answering")

    def pool(self) -> bool:
        """Ready this connection for the next request, if it can carry one: its answer was
        read to the end and nothing came after it.  One request, one answer — bytes beyond
        the answer (an answer sent twice, a body longer than declared) would be read as the
        next request's answer, so such a connection is never reused."""
        http, wire = self._http, self._wire
        if http.our_state is not h11.DONE or http.their_state is not h11.DONE:
            return False
        if wire.received or wire.closed or wire.spoiled or http.trailing_data[0]:
            return False
        http.start_next_cycle()
        wire.idle = True
        return True

    def take(self) -> bool:
        """Take this connection from the pool: False when it closed or received anything
        while it sat there (it is then useless, and closed by the caller)."""
        wire = self._wire
        wire.idle = False
        return not (wire.spoiled or wire.closed)

    def abort(self) -> None:
        self._transport.abort()

    async def aclose(self) -> None:
        self._transport.close()
        with contextlib.suppress(OSError):  # the peer had already gone
            await self._wire.gone


# -- answers --------------------------------------------------------------------------


class _Unreadable(ConnectionError):
    """An answer that is not DynamoDB's: too large, not JSON, or not shaped like one.
    Not retried (the store reports it as unavailable)."""


def _decode_answer(
    operation: str, status: int, headers: Mapping[bytes, bytes], payload: bytes
) -> dict[str, Any]:
    expected = headers.get(b"x-amz-crc32")
    if expected is not None and str(zlib.crc32(payload)).encode() != expected.strip():
        raise ConnectionError("DynamoDB's answer failed its CRC32 check (corrupted in transit)")
    _check_values(operation, payload)
    try:
        answer = orjson.loads(payload) if payload else {}
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        if 200 <= status < 300:
            raise _Unreadable(
                f"DynamoDB answered {operation} (HTTP {status}) with a body that is not a JSON "
                "object: check that endpoint_url points at DynamoDB"
            )
        answer = {}
    try:
        if not 200 <= status < 300:
            raise ServiceError(_error_response(status, answer))
        answer["ResponseMetadata"] = {"HTTPStatusCode": status}
        for field in _ITEM_FIELDS:
            if isinstance(answer.get(field), dict):
                answer[field] = _decode_item(answer[field], 0)
        if isinstance(answer.get("Items"), list):
            answer["Items"] = [_decode_item(item, 0) for item in answer["Items"]]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        # Not shaped like DynamoDB's answer (binascii.Error is a ValueError).
        raise _Unreadable(
            f"DynamoDB's answer to {operation} cannot be read ({type(exc).__name__}: "
            f"{str(exc)[:100]}): check that endpoint_url points at DynamoDB"
        ) from exc
    return answer


def _error_response(status: int, answer: dict[str, Any]) -> dict[str, Any]:
    code = str(answer.get("__type", "")).rpartition("#")[2][:100]
    if not code:
        code = "ServiceUnavailable" if status >= 500 else f"HTTP{status}"
    message = answer.get("message", answer.get("Message", ""))
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": str(message)[:1000]},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    if isinstance(answer.get("Item"), dict):
        response["Item"] = _decode_item(answer["Item"], 0)
    return response


def _check_values(operation: str, payload: bytes) -> None:
    """Refuse an answer with more JSON values than DynamoDB can send for ``operation``
    before it is decoded (see ``_ITEM_VALUES``)."""
    limit = _PAGE_VALUES if operation in _PAGE_OPERATIONS else _ITEM_VALUES
    if _values(payload) <= limit:
        return
    # The quick count includes brackets and commas inside strings: count again without them.
    if _values(_JSON_STRING.sub(b'""', payload)) > limit:
        raise _Unreadable(
            f"DynamoDB's answer to {operation} holds more JSON values than DynamoDB sends "
            f"(over {limit}): it would take too much memory once decoded"
        )


def _values(payload: bytes) -> int:
    return payload.count(b"{") + payload.count(b"[") + payload.count(b",")


def _decode_item(item: dict[str, Any], depth: int) -> dict[str, Any]:
    return {name: _decode_value(value, depth) for name, value in item.items()}


def _decode_value(value: Any, depth: int) -> Any:
    # Binary values travel as Base64 text; aioboto3 hands them over as bytes.
    if not isinstance(value, dict) or len(value) != 1:
        return value
    if depth > _MAX_NESTING:
        raise ValueError(f"nested deeper than {_MAX_NESTING} levels")
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": base64.b64decode(inner, validate=True)}
    if kind == "BS":
        return {"BS": [base64.b64decode(each, validate=True) for each in inner]}
    if kind == "M" and isinstance(inner, dict):
        return {"M": _decode_item(inner, depth + 1)}
    if kind == "L" and isinstance(inner, list):
        return {"L": [_decode_value(each, depth + 1) for each in inner]}
    return value


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, _Unreadable):
        return False
    if isinstance(exc, ServiceError):
        code = exc.response["Error"]["Code"]
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _RETRIED_CODES or status in _RETRIED_STATUS
    # A certificate that fails verification will fail again; connection errors, timeouts
    # and protocol errors are transient, as for the SDK.
    return not isinstance(exc, ssl.SSLCertVerificationError)


def _encode_bytes(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot send a {type(value).__name__} to DynamoDB")


# -- configuration --------------------------------------------------------------------


def _check_credential(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or _SENDABLE.fullmatch(value) is None:
        # Named, never quoted: the value is a secret.
        raise ConfigError(
            f"{name} cannot be sent: it holds a space, a line break, a control or non-ASCII "
            "character (or is not a string). A secret read from a file or a secret manager "
            "often keeps its trailing newline: strip it where the variable is set"
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    import ipaddress  # only for plain-HTTP endpoints: a local DynamoDB

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _endpoint(given: str | None, region: str) -> str:
    env = os.environ
    url = given or env.get("AWS_ENDPOINT_URL_DYNAMODB") or env.get("AWS_ENDPOINT_URL")
    return url or f"https://dynamodb.{region}.amazonaws.com"


def _parse_endpoint(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ConfigError(
            "endpoint_url must look like https://dynamodb.<region>.amazonaws.com, got "
            f"{redact_url(url)!r}"
        )
    default_port = 443 if parts.scheme == "https" else 80
    host_header = parts.netloc.rpartition("@")[2]
    if port == default_port:  # written out, though it goes without saying
        host_header = host_header.rsplit(":", 1)[0]
    return parts.scheme, parts.hostname, port or default_port, host_header


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Built on the first HTTPS connection only: loading the certificate store costs
    # milliseconds that a plain-HTTP endpoint (a local DynamoDB) should not pay.
    return ssl.create_default_context()
