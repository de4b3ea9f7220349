"""An aiohttp server in its own process, so a test can read its peak RSS (``GET /rss``).

Run as ``python _big_body_server.py``: prints the port, serves until stdin closes.  The
application accepts bodies of up to 1 GiB (``client_max_size``); the idempotency
middleware's ``max_body_bytes`` is 64 KiB.
"""

from __future__ import annotations

import asyncio
import resource
import sys

from aiohttp import web

from idempotency_async import Manager, MemoryStore
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint

MAX_BODY = 64 * 1024


@idempotent_endpoint
async def upload(request: web.Request) -> web.Response:
    return web.Response(text=str(len(await request.read())))


async def rss(request: web.Request) -> web.Response:
    return web.Response(text=str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


async def main() -> None:
    app = web.Application(
        client_max_size=1 << 30,
        middlewares=[
            idempotency_middleware(
                Manager(MemoryStore()), max_body_bytes=MAX_BODY, caller_scope=lambda r: "t"
            )
        ],
    )
    app.router.add_post("/upload", upload)
    app.router.add_get("/rss", rss)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
