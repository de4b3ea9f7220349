"""The writer an idempotent aiohttp handler's response goes through: it tells the response
gate about the head before it goes out (the point of no return) and copies the body.

aiohttp has no public hook on a response's writes, so the request's payload writer is
swapped for this tee while the handler runs (:mod:`._aiohttp_adapter`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from idempotency_async.integrations._http import STORED_HEADER, ResponseGate, content_length

__all__ = ["TeeWriter"]


class TeeWriter(AbstractStreamWriter):
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
