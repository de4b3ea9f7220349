"""A replayed status is a final status whose framing the middleware controls.

A stored response is untrusted (other writers share the store).  With a status of 1xx the
server sends an interim head (or, for 101, switches protocols) and the client reads the
next response on the connection as its own; with 204 or 304 and a body, the body's bytes
are left on the connection.  Each case runs through FastAPI under uvicorn and aiohttp's
server, and a real HTTP/1.1 client (h11 on a socket) sends the duplicate and then another
request on the same kept-alive connection: the second must get its own answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import h11
import pytest
from support import RecordingStore
from test_http_edges import Start, _good, _overwrite, start

from idempotency_async import MemoryStore

__all__ = ["start"]


class _Client:
    """One kept-alive HTTP/1.1 connection; every response read to its end by h11, which
    refuses anything that is not HTTP/1.1 (bytes left over included)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._http = h11.Connection(h11.CLIENT)

    async def post(self, path: str, key: str) -> tuple[int, dict[str, str], bytes]:
        http = self._http
        if http.our_state is h11.DONE:
            http.start_next_cycle()
        body = json.dumps({"sku": "A"}).encode()
        headers = [
            ("host", "test"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("idempotency-key", key),
            ("x-tenant", "t1"),
        ]
        data = http.send(h11.Request(method="POST", target=path, headers=headers)) or b""
        data += (http.send(h11.Data(data=body)) or b"") + (http.send(h11.EndOfMessage()) or b"")
        self._writer.write(data)
        await self._writer.drain()
        status, answer, chunks = 0, {}, []
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                http.receive_data(await asyncio.wait_for(self._reader.read(65536), 10))
            elif isinstance(event, h11.InformationalResponse):
                raise AssertionError(f"an interim {event.status_code} head was sent")
            elif isinstance(event, h11.Response):
                status = event.status_code
                answer = {name.decode(): value.decode() for name, value in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, answer, b"".join(chunks)
            else:
                raise AssertionError(f"unexpected {event!r}")

    def left_over(self) -> bytes:
        return self._http.trailing_data[0]


async def _connect(base_url: str) -> tuple[_Client, asyncio.StreamWriter]:
    parts = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    return _Client(reader, writer), writer


_BODY = _good()["body_b64"]
_STATUSES = {
    "100": (_good(status=100, body_b64=""), 409),
    "101": (_good(status=101, body_b64=""), 409),
    "103-with-a-body": (_good(status=103), 409),
    "204-with-a-body": (_good(status=204), 409),
    "304-with-a-body": (_good(status=304), 409),
    "not-stored-101": ({"v": 1, "status": 101, "stored": False, "reason": "x"}, 409),
    "not-stored-204": ({"v": 1, "status": 204, "stored": False, "reason": "x"}, 409),
    "not-stored-201": ({"v": 1, "status": 201, "stored": False, "reason": "x"}, 201),
    "204": (_good(status=204, body_b64="", headers=[]), 204),
    "304": (_good(status=304, body_b64="", headers=[["etag", '"v1"']]), 304),
}


@pytest.mark.parametrize("case", sorted(_STATUSES))
async def test_a_replayed_status_never_breaks_the_connection(start: Start, case: str) -> None:
    stored, expected = _STATUSES[case]
    store = RecordingStore(MemoryStore())
    served = await start(store=store)
    client, writer = await _connect(served.base_url)
    try:
        first = await client.post("/orders/o-1", case)
        assert first[0] == 201
        await _overwrite(store, stored)
        status, headers, body = await client.post("/orders/o-1", case)
        # The same connection carries the next request, and its answer is its own.
        after = await client.post("/orders/o-2", case + "-next")
        assert client.left_over() == b""
    finally:
        writer.close()
        await writer.wait_closed()
    assert status == expected, (status, headers, body)
    if expected in (204, 304):
        assert body == b"" and "content-length" not in headers
        assert headers.get("idempotent-replayed") == "true"
    else:
        assert headers["idempotency-response-stored"] == "false"
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["status"] == expected
    assert after[0] == 201 and json.loads(after[2])["order_id"] == "o-2"
    assert sum(served.calls.values()) == 2  # the tampered record never re-ran the handler


def test_the_status_of_a_not_stored_reason_is_used_only_when_it_carries_a_body() -> None:
    from idempotency_async.integrations._http._responses import not_available

    answers: dict[str, Any] = {
        reason: not_available(reason).status
        for reason in ("HTTP 201: x", "HTTP 422: x", "HTTP 101: x", "HTTP 204: x", "HTTP 304: x")
    }
    assert answers == {
        "HTTP 201: x": 201,
        "HTTP 422: x": 422,
        "HTTP 101: x": 409,
        "HTTP 204: x": 409,
        "HTTP 304: x": 409,
    }
