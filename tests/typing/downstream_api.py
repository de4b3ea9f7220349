"""Pins the downstream-key types: only type-checked (``mypy --strict tests/typing``), never run.

The hooks must fit where the clients take them, and the key functions keep their results.
"""

from __future__ import annotations

from typing import assert_type

import aiohttp
import httpx

from idempotency_async import downstream_key
from idempotency_async.downstream import (
    aiohttp_middleware,
    downstream_key_or_none,
    httpx_event_hook,
)


async def uses() -> None:
    assert_type(downstream_key("charge"), str)
    assert_type(downstream_key_or_none("charge"), str | None)
    async with httpx.AsyncClient(
        event_hooks={"request": [httpx_event_hook(hosts=["api.example.com"])]}
    ) as client:
        await client.post("https://api.example.com/charges")
    async with aiohttp.ClientSession(
        middlewares=[aiohttp_middleware(hosts=["api.example.com"], methods=["POST"])]
    ) as session:
        await session.post("https://api.example.com/charges")
