"""``redis://…`` / ``rediss://…`` URLs: a RedisStore, when the Redis store is installed.

``list`` walks the keys with ``SCAN`` (never ``KEYS``, which blocks the server) matching the
store's ``key_prefix``, and reads each record through the store, so it is decoded exactly
as the service reads it.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple
from urllib.parse import SplitResult, parse_qsl, urlencode

from idempotency_async._redact import redact_url
from idempotency_async.cli._errors import CliError, one_line
from idempotency_async.cli._targets import AwsSettings, record_format
from idempotency_async.cli._terminal import printable
from idempotency_async.errors import InconsistentStateError, StoreValidationError
from idempotency_async.record import Record, Status

__all__ = ["RedisTarget", "parse"]

# Parameters the store takes; every other query parameter goes to redis-py's from_url.
_STORE_OPTIONS: Final = ("key_prefix", "cluster", "record_format")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_SCAN_COUNT: Final = 100
# The store keeps a short-lived lock beside a record while it takes over a Powertools
# (Python) record; it is not a record.
_LOCK_SUFFIX: Final = ":lock"
_GLOB_SPECIAL: Final = frozenset("*?[]\\")


class RedisPage(NamedTuple):
    records: Sequence[Record]
    scanned: int
    """Keys ``SCAN`` returned for this page (records, and keys that are not records)."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    url: str = field(repr=False)  # may hold a password
    key_prefix: str = ""
    cluster: bool = False
    record_format: str = "typescript"

    def store(self, aws: AwsSettings) -> Any:
        return _redis_store_module().RedisStore.from_url(
            self.url,
            cluster=self.cluster,
            key_prefix=self.key_prefix,
            record_format=self.record_format,
        )

    async def pages(
        self,
        store: Any,
        *,
        status: Status | None,
        page_size: int | None,
        limit: int | None = None,
    ) -> AsyncGenerator[RedisPage, None]:
        """The records under the store's ``key_prefix``, a ``SCAN`` batch at a time.

        ``page_size`` is the ``COUNT`` hint of each ``SCAN`` (default 100) and the number
        of records read per page.  Without a ``page_size`` and a status filter, a page
        reads at most ``limit`` records (the ``SCAN`` keeps its ``COUNT``: a smaller one
        means more round trips to find the prefix's keys).  Nothing is held beyond one
        page, so ``--limit`` bounds the work and output streams.
        """
        count = page_size or _SCAN_COUNT
        batch_size = count
        if page_size is None and status is None and limit is not None:
            batch_size = min(count, limit)
        client = self._scan_client()
        try:
            names = _record_names(client, self.key_prefix, count)
            async for batch in _batches(names, batch_size):
                records = await asyncio.gather(*(_read(store, key) for key in batch))
                found = [
                    record
                    for record in records
                    if record is not None and (status is None or record.status is status)
                ]
                yield RedisPage(found, len(batch))
        finally:
            await client.aclose()

    def _scan_client(self) -> Any:
        # A client of its own: the store's is private to it.  Built like the store's, so a
        # bad URL has already been reported by the store.
        import redis.asyncio as redis_asyncio

        factory = redis_asyncio.RedisCluster if self.cluster else redis_asyncio.Redis
        return factory.from_url(self.url)


def _redis_store_module() -> Any:
    try:
        # By name: the Redis store is optional (extra "redis") and may be absent.
        return importlib.import_module("idempotency_async.stores.redis")
    except ImportError as exc:
        raise CliError(
            "the Redis store is not available: install the redis extra "
            f"(pip install 'idempotency-async[redis]'; from a checkout: pip install -e '.[redis]') "
            f"({exc})"
        ) from exc


async def _record_names(client: Any, prefix: str, count: int) -> AsyncIterator[str]:
    """The logical keys under ``prefix`` (``SCAN MATCH prefix* TYPE string``)."""
    pattern = "".join(f"\\{char}" if char in _GLOB_SPECIAL else char for char in prefix) + "*"
    async for raw in client.scan_iter(match=pattern, count=count, _type="string"):
        try:
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            continue  # not a key this library writes
        if name.startswith(prefix) and not name.endswith(_LOCK_SUFFIX):
            yield name[len(prefix) :]


async def _batches(names: AsyncIterator[str], size: int) -> AsyncIterator[list[str]]:
    batch: list[str] = []
    async for name in names:
        batch.append(name)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


async def _read(store: Any, key: str) -> Record | None:
    """The record of ``key`` as the store reads it; a key that is not one is reported."""
    try:
        verdict = await store.get(key, now=time.time())
    except (StoreValidationError, InconsistentStateError) as exc:
        # Another application's key under the same prefix, or a record the store refuses
        # to read: said on stderr, and the listing goes on (an unreachable store stops it).
        print(printable(one_line(f"skipped {key!r}: {exc}")), file=sys.stderr)
        return None
    record: Record | None = verdict.record
    return record


def parse(parts: SplitResult) -> RedisTarget:
    if not parts.netloc:
        raise CliError(f"bad store URL {redact_url(parts.geturl())!r}: write redis://HOST:PORT/DB")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _STORE_OPTIONS:
            if name in ours:
                raise CliError(f"parameter {name!r} appears twice in the store URL")
            ours[name] = value
        else:
            rest.append((name, value))
    cluster = ours.get("cluster", "false").lower()
    if cluster not in _TRUE | _FALSE:
        raise CliError(f"cluster= in the store URL must be true or false, got {cluster!r}")
    url = parts._replace(query=urlencode(rest)).geturl()
    layout = record_format(ours.get("record_format", "typescript"))
    return RedisTarget(url, ours.get("key_prefix", ""), cluster in _TRUE, layout)
