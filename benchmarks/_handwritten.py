"""The fair floor for the manager's benchmarks: an idempotent call written by hand.

What a careful engineer writes without a library, on the same store and with the same
requests as ``Manager.execute``: the payload hashed (sorted-key JSON, md5, Base64), one
claim, the callback (under ``asyncio.timeout`` when the call has one), one completion
writing the encoded result — and nothing else: no key-order rules, no single flight, no
lease arithmetic, no events, no cache, no release on failure.  Whatever ``execute`` costs
above it is the library's own price for the guarantee.

``SlowStore`` puts a fixed latency in front of every store operation, as a network round
trip would (``asyncio.sleep``, no CPU); both sides go through it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from idempotency_async import MemoryStore
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import CLAIMED, Verdict, Written

TTL = 3600.0


class SlowStore:
    """A MemoryStore behind a fixed latency per operation."""

    def __init__(self, latency: float) -> None:
        self.inner = MemoryStore(max_records=10**7)
        self.max_response_bytes = self.inner.max_response_bytes
        self.latency = latency

    async def claim(self, claim: Claim) -> Verdict:
        await asyncio.sleep(self.latency)
        return await self.inner.claim(claim)

    async def get(self, key: str, *, now: float) -> Verdict:
        await asyncio.sleep(self.latency)
        return await self.inner.get(key, now=now)

    async def complete(self, completion: Completion) -> Written:
        await asyncio.sleep(self.latency)
        return await self.inner.complete(completion)

    async def release(self, key: str, owner: str) -> bool:
        await asyncio.sleep(self.latency)
        return await self.inner.release(key, owner)

    async def extend(self, claim: Claim) -> bool:
        await asyncio.sleep(self.latency)
        return await self.inner.extend(claim)

    async def force_release(self, key: str) -> Record | None:
        await asyncio.sleep(self.latency)
        return await self.inner.force_release(key)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Handwritten:
    """Idempotent calls by hand on ``store``: claim, callback, completion."""

    def __init__(self, store: Any, prefix: str = "bench") -> None:
        self.store = store
        self.prefix = prefix
        self._owner = secrets.token_hex(12) + "-"
        self._claims = itertools.count()

    async def call(
        self,
        payload: Any,
        callback: Callable[[], Awaitable[Any]],
        timeout: float | None = None,
    ) -> Any:
        digest = hashlib.md5(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).digest()
        key = f"{self.prefix}#{base64.b64encode(digest).decode()}"
        owner = f"{self._owner}{next(self._claims)}"
        lease = TTL if timeout is None else timeout
        verdict = await self.store.claim(Claim(key, owner, time.time(), lease, TTL))
        if verdict is not CLAIMED:
            record = verdict.record
            return None if record is None else record.response
        if timeout is None:
            result = await callback()
        else:
            async with asyncio.timeout(timeout):
                result = await callback()
        completion = Completion(key, owner, time.time(), TTL, None, orjson.dumps(result), result)
        await self.store.complete(completion)
        return result
