"""AWS Lambda: idempotent async handlers, a warm event loop, and partial-batch processing.

* :func:`idempotent_handler` makes ``async def handler(event, context)`` run once per key
  and replay its return value; the Lambda deadline becomes the record's lease.
* :func:`lambda_entrypoint` turns an async handler into the synchronous function Lambda
  calls, keeping one event loop (and so one set of aioboto3 clients) for the life of the
  execution environment.
* :func:`process_batch` processes SQS (standard and FIFO), Kinesis and DynamoDB stream
  batches record by record and returns ``{"batchItemFailures": [...]}``.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import binascii
import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from idempotency_async._codec import loads_strict
from idempotency_async.canonical import canonical_json
from idempotency_async.deadlines import deadline as ambient_deadline
from idempotency_async.errors import (
    CompletionError,
    ConfigError,
    PayloadError,
    ResponseNotStoredError,
)
from idempotency_async.manager import Manager

__all__ = [
    "BatchResponse",
    "LambdaEntrypoint",
    "idempotent_handler",
    "lambda_entrypoint",
    "process_batch",
]

_log = logging.getLogger("idempotency_async.aws_lambda")

E = TypeVar("E")
C = TypeVar("C")
T = TypeVar("T")

BatchResponse = dict[str, list[dict[str, str]]]
"""``{"batchItemFailures": [{"itemIdentifier": ...}, ...]}``, as Lambda expects it."""

DEFAULT_CONCURRENCY = 10


# ---------------------------------------------------------------------- handlers


def idempotent_handler(
    manager: Manager,
) -> Callable[[Callable[[E, C], Awaitable[T]]], Callable[[E, C], Awaitable[T]]]:
    """Decorate ``async def handler(event, context)`` so it runs once per key.

    The whole event is the payload (the manager's ``event_key_jmespath`` selects the
    identity from it).  The time the Lambda context has left becomes the deadline of
    the call, so its lease ends when the invocation would be killed: after a timeout the
    key is claimable again at once.  The return value — API Gateway and ALB proxy
    responses included — is stored and replayed to duplicates.  A duplicate that arrives
    while the first invocation still runs raises
    :class:`~idempotency_async.errors.AlreadyInProgressError`.
    """
    if manager.options.event_key_jmespath is None:
        _log.warning(
            "idempotent_handler: the manager has no event_key_jmespath, so the whole event is "
            "hashed. Per-delivery fields (requestContext.requestId, receiptHandle, trace "
            "headers, timestamps) change on every retry, so retries will not be recognised: "
            "select what identifies the request, e.g. "
            "Options(event_key_jmespath='powertools_json(body).order_id')",
            extra={"idempotency_prefix": manager.key_prefix},
        )

    def decorate(handler: Callable[[E, C], Awaitable[T]]) -> Callable[[E, C], Awaitable[T]]:
        if not inspect.iscoroutinefunction(handler):
            raise ConfigError(
                f"idempotent_handler needs an `async def handler(event, context)`; {handler!r} "
                "is not one (wrap it with lambda_entrypoint to give Lambda a sync function)"
            )

        @functools.wraps(handler)
        async def wrapper(event: E, context: C) -> T:
            when = invocation_deadline(context)
            if when is None:
                return await manager.execute(event, lambda: handler(event, context))
            # Registered as the ambient deadline too, so idempotent calls made inside the
            # handler get the same lease.
            async with ambient_deadline(at=when):
                return await manager.execute(event, lambda: handler(event, context), deadline=when)

        return wrapper

    return decorate


def invocation_deadline(context: object) -> float | None:
    """The ``loop.time()`` at which Lambda ends this invocation, from its context.

    ``None`` when the context does not say (local runs without a Lambda context).
    """
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    millis = float(remaining())
    return asyncio.get_running_loop().time() + max(millis, 0.0) / 1000


# ---------------------------------------------------------------------- entry point


class LambdaEntrypoint(Generic[E, C, T]):
    """The synchronous ``handler(event, context)`` Lambda calls; see :func:`lambda_entrypoint`.

    States: unstarted (no loop yet), running (loop open, ``init`` done once it succeeded)
    and closed.  A closed entry point refuses further invocations.
    """

    def __init__(
        self,
        handler: Callable[[E, C], Awaitable[T]],
        init: Callable[[], Awaitable[object]] | None,
        shutdown: Callable[[], Awaitable[object]] | None,
    ) -> None:
        self._handler = handler
        self._init = init
        self._shutdown = shutdown
        self._runner: asyncio.Runner | None = None
        self._context: contextvars.Context | None = None
        self._initialized = init is None
        self._closed = False
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop kept across invocations (``None`` before the first one)."""
        return None if self._runner is None else self._runner.get_loop()

    def __call__(self, event: E, context: C) -> T:
        runner, base = self._start()
        if not self._initialized:
            assert self._init is not None
            # init runs in the base context: context variables it sets stay visible to
            # every invocation.  A failed init is retried by the next invocation.
            runner.run(_awaited(self._init()), context=base)
            self._initialized = True
        # Each invocation gets its own copy, so one cannot leak context into the next.
        return runner.run(_awaited(self._handler(event, context)), context=base.copy())

    def close(self) -> None:
        """Run ``shutdown`` (when ``init`` ran or nothing needed it) and close the loop.

        Idempotent.  Registered with :mod:`atexit`, so it also runs when the interpreter
        exits normally.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            if self._shutdown is not None and self._context is not None:
                runner.run(_awaited(self._shutdown()), context=self._context)
        finally:
            runner.close()

    def _start(self) -> tuple[asyncio.Runner, contextvars.Context]:
        if self._closed:
            raise RuntimeError("this Lambda entry point was closed; build a new one")
        if self._runner is None or self._context is None:
            self._runner = asyncio.Runner()
            self._context = contextvars.copy_context()
        return self._runner, self._context


def lambda_entrypoint(
    async_handler: Callable[[E, C], Awaitable[T]],
    *,
    init: Callable[[], Awaitable[object]] | None = None,
    shutdown: Callable[[], Awaitable[object]] | None = None,
) -> LambdaEntrypoint[E, C, T]:
    """Return the synchronous ``handler(event, context)`` for Lambda's Python runtime.

    Lambda calls handlers synchronously; running each invocation with ``asyncio.run``
    would make a new event loop every time and break (or rebuild) every aioboto3 client
    created before.  The returned callable instead creates one event loop on the first
    invocation and keeps it for the life of the execution environment.  ``init`` (async,
    optional) runs once on that loop before the first invocation — open clients, build
    stores — and is retried by the next invocation if it raised.  ``shutdown`` (async,
    optional) runs on the loop in :meth:`LambdaEntrypoint.close`, e.g. ``store.aclose``::

        handler = lambda_entrypoint(handle, init=open_clients, shutdown=store.aclose)
    """
    if not (
        inspect.iscoroutinefunction(async_handler)
        or inspect.iscoroutinefunction(type(async_handler).__call__)  # async callable objects
    ):
        raise ConfigError(f"lambda_entrypoint needs an async handler; {async_handler!r} is not")
    return LambdaEntrypoint(async_handler, init, shutdown)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _close_at_exit(ref: weakref.ref[LambdaEntrypoint[Any, Any, Any]]) -> None:
    entrypoint = ref()
    if entrypoint is None:
        return
    try:
        entrypoint.close()
    except Exception:
        _log.exception("closing the Lambda entry point at exit failed")


# ---------------------------------------------------------------------- batches


@dataclass(frozen=True, slots=True)
class _Source:
    """How one event source names, decodes and orders its records."""

    name: str
    stable_id: str
    """JMESPath of the field that stays the same on every redelivery (the default key)."""
    identifier: Callable[[Mapping[str, Any]], str]
    decode: Callable[[Mapping[str, Any]], dict[str, Any]]
    ordering: Callable[[Mapping[str, Any]], str] | None
    """The ordering group of a record; ``None`` when records are independent."""


def _sqs_decode(record: Mapping[str, Any]) -> dict[str, Any]:
    return {**record, "body": _json_or_text(record["body"])}


def _kinesis_decode(record: Mapping[str, Any]) -> dict[str, Any]:
    kinesis = record["kinesis"]
    data = kinesis["data"]
    try:
        text = base64.b64decode(data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return dict(record)  # binary data: keys select from the Base64 text
    return {**record, "kinesis": {**kinesis, "data": _json_or_text(text)}}


def _json_or_text(text: str) -> Any:
    """Parsed JSON, or the text itself when it is not JSON (plain-text messages)."""
    try:
        return loads_strict(text)
    except PayloadError as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError):
            return text  # not JSON at all
        raise  # JSON with duplicate members (or NaN): the record fails



def _dynamodb_partition(record: Mapping[str, Any]) -> str:
    return canonical_json(record["dynamodb"]["Keys"])


_SQS = _Source(
    "SQS",
    "messageId",
    lambda record: str(record["messageId"]),
    _sqs_decode,
    None,
)
_SQS_FIFO = dataclasses.replace(
    _SQS,
    name="SQS FIFO",
    ordering=lambda record: str(record.get("attributes", {}).get("MessageGroupId", "")),
)
_KINESIS = _Source(
    "Kinesis",
    "eventID",
    lambda record: str(record["kinesis"]["sequenceNumber"]),
    _kinesis_decode,
    lambda record: str(record["kinesis"]["partitionKey"]),
)
_DYNAMODB = _Source(
    "DynamoDB stream",
    "eventID",
    lambda record: str(record["dynamodb"]["SequenceNumber"]),
    dict,
    _dynamodb_partition,
)


def _source_of(records: list[Mapping[str, Any]]) -> _Source:
    sources = {record.get("eventSource") for record in records}
    if len(sources) != 1:
        raise PayloadError(
            f"a batch holds records of one event source, got {sorted(map(str, sources))}"
        )
    (event_source,) = sources
    if event_source == "aws:sqs":
        fifo = str(records[0].get("eventSourceARN", "")).endswith(".fifo")
        return _SQS_FIFO if fifo else _SQS
    if event_source == "aws:kinesis":
        return _KINESIS
    if event_source == "aws:dynamodb":
        return _DYNAMODB
    raise PayloadError(
        f"process_batch handles SQS, Kinesis and DynamoDB stream events, not {event_source!r}"
    )


_derived: weakref.WeakKeyDictionary[Manager, dict[str, Manager]] = weakref.WeakKeyDictionary()


def _batch_manager(manager: Manager, source: _Source) -> Manager:
    """The manager that keys records: the given one, or one keyed by the stable record id."""
    if manager.options.event_key_jmespath is not None:
        return manager
    by_source = _derived.setdefault(manager, {})
    derived = by_source.get(source.stable_id)
    if derived is None:
        options = dataclasses.replace(
            manager.options, event_key_jmespath=source.stable_id, key_prefix=manager.key_prefix
        )
        derived = by_source[source.stable_id] = Manager(manager.store, options)
    return derived


async def process_batch(
    manager: Manager,
    event: Mapping[str, Any],
    record_handler: Callable[[dict[str, Any]], Awaitable[object]],
    *,
    context: object = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> BatchResponse:
    """Process an SQS, Kinesis or DynamoDB stream batch, each record idempotent on its own.

    ``record_handler`` receives each record with its body decoded: an SQS ``body`` and
    Kinesis ``kinesis.data`` (after Base64) that hold JSON are parsed (duplicate members
    rejected), so ``event_key_jmespath`` selects from them directly (``body.order_id``,
    not ``powertools_json(body)``).  Without an ``event_key_jmespath`` records are keyed
    by their stable id — ``messageId`` (SQS) or ``eventID`` (streams) — which stays the
    same on redelivery, unlike the ``receiptHandle``.

    Order: standard SQS records run concurrently (at most ``concurrency`` at once).  SQS
    FIFO records run in order per message group, Kinesis records per partition key and
    DynamoDB stream records per item key; the first failure in a group fails the rest of
    that group without running it.

    Returns ``{"batchItemFailures": [...]}`` naming the failed records by ``messageId``,
    Kinesis ``sequenceNumber`` or DynamoDB ``SequenceNumber`` (enable
    ``ReportBatchItemFailures`` on the event source mapping).  A record fails when its
    handler raised or its key is still in progress elsewhere (so it is redelivered later);
    a duplicate of a completed record succeeds without running the handler.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    records: list[Mapping[str, Any]] = list(event.get("Records") or [])
    if not records:
        return {"batchItemFailures": []}
    source = _source_of(records)
    run = _RecordRunner(_batch_manager(manager, source), source, record_handler)
    when = invocation_deadline(context)
    if when is None:
        failed = await _process(run, records, concurrency)
    else:
        async with ambient_deadline(at=when):
            run.deadline = when
            failed = await _process(run, records, concurrency)
    return {"batchItemFailures": [{"itemIdentifier": identifier} for identifier in failed]}


async def _process(
    run: _RecordRunner, records: list[Mapping[str, Any]], concurrency: int
) -> list[str]:
    if run.source.ordering is None:
        return await _unordered(run, records, concurrency)
    return await _in_order(run, records, run.source.ordering)


async def _unordered(
    run: _RecordRunner, records: list[Mapping[str, Any]], concurrency: int
) -> list[str]:
    slots = asyncio.Semaphore(concurrency)

    async def one(record: Mapping[str, Any]) -> bool:
        async with slots:
            return await run(record)

    outcomes = await asyncio.gather(*(one(record) for record in records))
    return [
        run.source.identifier(record)
        for record, ok in zip(records, outcomes, strict=True)
        if not ok
    ]


async def _in_order(
    run: _RecordRunner,
    records: list[Mapping[str, Any]],
    group_of: Callable[[Mapping[str, Any]], str],
) -> list[str]:
    stopped: set[str] = set()
    failed: list[str] = []
    for record in records:
        group = group_of(record)
        if group in stopped:
            failed.append(run.source.identifier(record))
            continue
        if not await run(record):
            stopped.add(group)
            failed.append(run.source.identifier(record))
    return failed


@dataclass(slots=True)
class _RecordRunner:
    manager: Manager
    source: _Source
    handler: Callable[[dict[str, Any]], Awaitable[object]]
    deadline: float | None = None

    async def __call__(self, record: Mapping[str, Any]) -> bool:
        """Run one record; True when it needs no redelivery."""
        identifier = self.source.identifier(record)
        try:
            payload = self.source.decode(record)
            await self.manager.execute(
                payload, lambda: self.handler(payload), deadline=self.deadline
            )
        except (ResponseNotStoredError, CompletionError) as exc:
            # The handler ran to completion; only its result was not recorded.
            # Redelivering the record could only run the side effect twice.
            _log.warning("%s record %s was processed, but: %s", self.source.name, identifier, exc)
            return True
        except Exception:
            _log.exception("%s record %s failed", self.source.name, identifier)
            return False
        return True
