"""A loopback TCP proxy that can lose or delay answers: fault injection between a client
and a server.

``proxy.lose_answers(n)`` makes the next ``n`` server answers vanish: the request reaches
the server and runs, then the proxy drops the client's connection instead of forwarding
the answer — what a client sees when a network path breaks after the server acted.

``proxy.delay_answers(n, seconds)`` holds the next ``n`` server answers (reads from any
server connection) for ``seconds`` before forwarding them; what follows on the same
connection waits behind them — a slow network path.  A client that gives up and reuses
the connection would then read the late answer as its next request's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["LossyProxy", "lossy_proxy"]


class LossyProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.answers_lost = 0
        self.answers_delayed = 0
        self._to_lose = 0
        self._to_delay = 0
        self._delay = 0.0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def lose_answers(self, count: int) -> None:
        self._to_lose = count

    def delay_answers(self, count: int, seconds: float) -> None:
        self._to_delay, self._delay = count, seconds

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        # The server runs this handler as a task of its own: track it so close() awaits it.
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server: asyncio.StreamWriter | None = None
        try:
            server_reader, server = await asyncio.open_connection("127.0.0.1", self.target_port)
            async with asyncio.TaskGroup() as pipes:
                upstream = pipes.create_task(self._pipe(client_reader, server, lossy=False))
                downstream = pipes.create_task(self._pipe(server_reader, client, lossy=True))
                await asyncio.wait((upstream, downstream), return_when=asyncio.FIRST_COMPLETED)
                upstream.cancel()
                downstream.cancel()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (client, server):
                if writer is not None:
                    writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, lossy: bool
    ) -> None:
        while data := await reader.read(65536):
            if lossy and self._to_lose > 0:
                self._to_lose -= 1
                self.answers_lost += 1
                return  # the answer is dropped with the connection
            if lossy and self._to_delay > 0:
                self._to_delay -= 1
                self.answers_delayed += 1
                await asyncio.sleep(self._delay)
            writer.write(data)
            await writer.drain()


@contextlib.asynccontextmanager
async def lossy_proxy(target_port: int) -> AsyncIterator[LossyProxy]:
    proxy = LossyProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
