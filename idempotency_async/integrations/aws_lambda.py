"""AWS Lambda: idempotent async handlers, a warm event loop, and partial-batch processing.

* :func:`idempotent_handler` makes ``async def handler(event, context)`` run once per key
  and replay its return value; the Lambda deadline becomes the record's lease.
* :func:`lambda_entrypoint` turns an async handler into the synchronous function Lambda
  calls, keeping one event loop per process (and so one set of aioboto3 clients) for the
  life of the execution environment.
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
import enum
import functools
import inspect
import json
import logging
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from idempotency_async._codec import loads_strict
from idempotency_async._derive import derive
from idempotency_async.canonical import canonical_json
from idempotency_async.deadlines import deadline as ambient_deadline
from idempotency_async.decorators import _manager_for
from idempotency_async.errors import (
    AlreadyInProgressError,
    BatchEventError,
    CompletionError,
    ConfigError,
    PayloadError,
    ResponseNotStoredError,
)
from idempotency_async.instrumentation import annotate, call_attributes
from idempotency_async.manager import Manager
from idempotency_async.options import disabled_by_environment

__all__ = [
    "BatchResponse",
    "EventType",
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
# Telemetry attributes: the item on each record's call span, the counts on the current
# (invocation) span.
_ITEM_ID = "idempotency.batch.item.id"
_BATCH_SIZE = "idempotency.batch.size"
_BATCH_FAILURES = "idempotency.batch.failures"


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

    With ``Options(key_format="powertools-python")`` and no explicit ``key_prefix``, keys
    carry Powertools' prefix for the handler, ``<AWS_LAMBDA_FUNCTION_NAME>.<module>.<qualname>``,
    as ``@idempotent`` gives them.
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
        keyed = _manager_for(manager, handler, handler=True)

        @functools.wraps(handler)
        async def wrapper(event: E, context: C) -> T:
            when = invocation_deadline(context)
            if when is None:
                return await keyed.execute(event, lambda: handler(event, context))
            # Registered as the ambient deadline too, so idempotent calls made inside the
            # handler get the same lease.
            async with ambient_deadline(at=when):
                return await keyed.execute(event, lambda: handler(event, context), deadline=when)

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


class _ProcessLoop:
    """The one event loop every entry point of the process runs on.

    A client opened on one loop (aioboto3, aiohttp, redis) cannot be used from another,
    so two entry points sharing a store must share a loop.  It opens with the first entry
    point that is invoked and closes when the last open one closes.
    """

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None
        self._users = 0

    def acquire(self) -> asyncio.Runner:
        if self._runner is None:
            self._runner = asyncio.Runner()
        self._users += 1
        return self._runner

    def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._runner is not None:
            runner, self._runner = self._runner, None
            runner.close()


_process_loop = _ProcessLoop()


class LambdaEntrypoint(Generic[E, C, T]):
    """The synchronous ``handler(event, context)`` Lambda calls; see :func:`lambda_entrypoint`.

    States: unstarted (no loop yet), running (on the process's loop, ``init`` done once it
    succeeded) and closed.  A closed entry point refuses further invocations.
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
        """The event loop kept across invocations (``None`` before the first one).

        Every entry point of the process runs on the same loop, so they can share stores
        and clients.
        """
        return None if self._runner is None else self._runner.get_loop()

    def __call__(self, event: E, context: C) -> T:
        _refuse_inside_a_loop(
            "a Lambda entry point was called from inside a running event loop: it is the "
            "synchronous function for Lambda's runtime. In async code (tests included), "
            "await the async handler you passed to lambda_entrypoint instead"
        )
        runner, base = self._start()
        if not self._initialized:
            assert self._init is not None
            # init runs in the base context: context variables it sets stay visible to
            # every invocation.  A failed init is retried by the next invocation.
            runner.run(_awaited(self._init), context=base)
            self._initialized = True
        # Each invocation gets its own copy, so one cannot leak context into the next.
        return runner.run(_awaited(self._handler, event, context), context=base.copy())

    def close(self) -> None:
        """Run ``shutdown`` (when ``init`` ran or nothing needed it) and leave the loop.

        The loop closes with the last open entry point of the process.  Idempotent.
        Registered with :mod:`atexit`, so it also runs when the interpreter exits normally.
        """
        if self._closed:
            return
        _refuse_inside_a_loop(
            "LambdaEntrypoint.close() was called from inside a running event loop: it runs "
            "shutdown on the entry point's own loop, so call it from synchronous code"
        )
        self._closed = True
        atexit.unregister(self._at_exit)
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            if self._shutdown is not None and self._context is not None:
                runner.run(_awaited(self._shutdown), context=self._context)
        finally:
            _process_loop.release()

    def _start(self) -> tuple[asyncio.Runner, contextvars.Context]:
        if self._closed:
            raise RuntimeError("this Lambda entry point was closed; build a new one")
        if self._runner is None or self._context is None:
            self._runner = _process_loop.acquire()
            self._context = contextvars.copy_context()
        return self._runner, self._context


def _refuse_inside_a_loop(message: str) -> None:
    # Checked before any coroutine is created, so none is left un-awaited.
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(message)


def lambda_entrypoint(
    async_handler: Callable[[E, C], Awaitable[T]],
    *,
    init: Callable[[], Awaitable[object]] | None = None,
    shutdown: Callable[[], Awaitable[object]] | None = None,
) -> LambdaEntrypoint[E, C, T]:
    """Return the synchronous ``handler(event, context)`` for Lambda's Python runtime.

    Lambda calls handlers synchronously; running each invocation with ``asyncio.run``
    would make a new event loop every time and break (or rebuild) every aioboto3 client
    created before.  The returned callable instead runs on one event loop, created on the
    first invocation and kept for the life of the execution environment; every entry point
    of the process shares it, so they can share stores and clients.  Calling it inside a
    running event loop raises ``RuntimeError`` (await ``async_handler`` there instead).
    ``init`` (async, optional) runs once on that loop before the first invocation — open
    clients, build stores — and is retried by the next invocation if it raised.
    ``shutdown`` (async, optional) runs on the loop in :meth:`LambdaEntrypoint.close`,
    e.g. ``store.aclose``::

        handler = lambda_entrypoint(handle, init=open_clients, shutdown=store.aclose)
    """
    if not (
        inspect.iscoroutinefunction(async_handler)
        or inspect.iscoroutinefunction(type(async_handler).__call__)  # async callable objects
    ):
        raise ConfigError(f"lambda_entrypoint needs an async handler; {async_handler!r} is not")
    return LambdaEntrypoint(async_handler, init, shutdown)


async def _awaited(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    # The handler's coroutine is created inside the loop's task, never before it runs.
    return await function(*args)


def _close_at_exit(ref: weakref.ref[LambdaEntrypoint[Any, Any, Any]]) -> None:
    entrypoint = ref()
    if entrypoint is None:
        return
    try:
        entrypoint.close()
    except Exception:
        _log.exception("closing the Lambda entry point at exit failed")


# ---------------------------------------------------------------------- batches


class EventType(enum.StrEnum):
    """The kind of batch :func:`process_batch` expects (the names of Powertools' ``EventType``)."""

    SQS = "SQS"
    KinesisDataStreams = "KinesisDataStreams"
    DynamoDBStreams = "DynamoDBStreams"


@dataclass(frozen=True, slots=True)
class _Source:
    """How one event source names, decodes and orders its records."""

    name: str
    event_source: str
    stable_id: str
    """JMESPath of the field that stays the same on every redelivery (the default key)."""
    id_path: tuple[str, ...]
    """Where the identifier ``batchItemFailures`` names the record by is."""
    decode: Callable[[Mapping[str, Any]], dict[str, Any]]
    ordering: Callable[[Mapping[str, Any]], str | None] | None
    """The ordering group of a record (``None``: unknown, the record fails on its own);
    ``ordering`` itself is ``None`` when records are independent."""
    group_field: str = ""

    def identifier(self, record: Mapping[str, Any]) -> str | None:
        value = _dig(record, *self.id_path)
        return value if isinstance(value, str) and value else None


def _dig(record: Mapping[str, Any], *path: str) -> Any:
    """The value at ``path`` in nested objects, or None where anything is missing."""
    value: Any = record
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value


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
        raise  # JSON with duplicate members (or NaN), or nested too deeply: the record fails


def _text_at(*path: str) -> Callable[[Mapping[str, Any]], str | None]:
    def group(record: Mapping[str, Any]) -> str | None:
        value = _dig(record, *path)
        return value if isinstance(value, str) else None

    return group


def _dynamodb_partition(record: Mapping[str, Any]) -> str | None:
    keys = _dig(record, "dynamodb", "Keys")
    return canonical_json(keys) if isinstance(keys, Mapping) and keys else None


_SQS = _Source("SQS", "aws:sqs", "messageId", ("messageId",), _sqs_decode, None)
_SQS_FIFO = dataclasses.replace(
    _SQS,
    name="SQS FIFO",
    ordering=_text_at("attributes", "MessageGroupId"),
    group_field="attributes.MessageGroupId",
)
_KINESIS = _Source(
    "Kinesis",
    "aws:kinesis",
    "eventID",
    ("kinesis", "sequenceNumber"),
    _kinesis_decode,
    _text_at("kinesis", "partitionKey"),
    "kinesis.partitionKey",
)
_DYNAMODB = _Source(
    "DynamoDB stream",
    "aws:dynamodb",
    "eventID",
    ("dynamodb", "SequenceNumber"),
    dict,
    _dynamodb_partition,
    "dynamodb.Keys",
)
_BY_TYPE = {
    EventType.SQS: _SQS,
    EventType.KinesisDataStreams: _KINESIS,
    EventType.DynamoDBStreams: _DYNAMODB,
}


def _records_of(event: object) -> list[Mapping[str, Any]]:
    records = event.get("Records") if isinstance(event, Mapping) else None
    if not isinstance(records, list):
        what = (
            f"an object with the keys {sorted(map(str, event))[:8]}"
            if isinstance(event, Mapping)
            else f"a {type(event).__name__}"
        )
        raise BatchEventError(
            "process_batch needs an SQS, Kinesis or DynamoDB stream event, an object whose "
            f"'Records' is a list; it got {what}. Check the function's trigger, and pass "
            "the event Lambda gave the handler unchanged"
        )
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise BatchEventError(
                f"record {index} of the batch is a {type(record).__name__}, not an object: "
                "the batch is not one Lambda delivered, and the broken record cannot be "
                "reported on its own"
            )
    return records


def _source_of(records: list[Mapping[str, Any]], event_type: EventType | None) -> _Source:
    sources = {record.get("eventSource") for record in records}
    if event_type is not None:
        expected = _BY_TYPE[event_type]
        if sources != {expected.event_source}:
            raise BatchEventError(
                f"process_batch(event_type={event_type.value!r}) expects records whose "
                f"eventSource is {expected.event_source!r}, got {sorted(map(str, sources))}: "
                "check the function's trigger"
            )
    if len(sources) != 1:
        raise BatchEventError(
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
    raise BatchEventError(
        f"process_batch handles SQS, Kinesis and DynamoDB stream events, not {event_source!r}"
    )


def _identified(records: list[Mapping[str, Any]], source: _Source) -> list[_Item]:
    items = []
    for index, record in enumerate(records):
        identifier = source.identifier(record)
        if identifier is None:
            raise BatchEventError(
                f"{source.name} record {index} has no {'.'.join(source.id_path)}: "
                "batchItemFailures names records by it, so the record cannot fail on its own "
                "and the whole batch fails"
            )
        items.append(_Item(identifier, record))
    return items


@dataclass(slots=True)
class _Item:
    """One record of the batch, read once before anything runs."""

    identifier: str
    record: Mapping[str, Any]
    payload: dict[str, Any] | None = None
    """The record with its body decoded; None when it could not be read."""
    key: str | None = None
    """The key the manager gives it (None: no key, or unreadable)."""
    group: str | None = None
    """Its ordering group (batches whose records are ordered)."""
    unreadable: str | None = None
    """Why the record cannot run: it fails alone, the rest of the batch runs."""


_derived: weakref.WeakKeyDictionary[Manager, dict[str, Manager]] = weakref.WeakKeyDictionary()


def _batch_manager(manager: Manager, source: _Source) -> Manager:
    """The manager that keys records: the given one, or one keyed by the stable record id."""
    if manager.options.event_key_jmespath is not None:
        return manager  # the user's selection, applied to each decoded record
    by_source = _derived.setdefault(manager, {})
    derived = by_source.get(source.stable_id)
    if derived is None:
        # The one derivation (see _derive): the batch owns the key selection only when the
        # manager has none; every other option is kept, the prefix frozen as it resolved.
        derived = by_source[source.stable_id] = derive(
            manager,
            "process_batch",
            {},
            kept={"event_key_jmespath": source.stable_id, "key_prefix": manager.key_prefix},
        )
    return derived


async def process_batch(
    manager: Manager,
    event: Mapping[str, Any],
    record_handler: Callable[[dict[str, Any]], Awaitable[object]],
    *,
    context: object = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    event_type: EventType | str | None = None,
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
    handler raised, its key is still in progress elsewhere (so it is redelivered later),
    or it cannot be read but can still be named (e.g. an SQS record without a ``body``, a
    Kinesis record without a ``partitionKey``, a key nested too deeply to hash): it then
    fails alone, and the rest of the batch runs.  A duplicate of a completed record
    succeeds without running the handler.  Duplicates inside the batch (records with the
    key of an earlier record) join that first record: they replay its result, or fail with
    it without running.

    ``event_type`` (:class:`EventType` or its value) makes the expected kind explicit.
    :class:`~idempotency_async.errors.BatchEventError` is raised, before any record
    runs, for an event that is not a batch (no ``Records`` list), of another kind than
    ``event_type``, or holding a record that cannot be named (not an object, no id).
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    expected = _event_type(event_type)
    records = _records_of(event)
    if not records:
        return {"batchItemFailures": []}
    source = _source_of(records, expected)
    items = _identified(records, source)
    run = _RecordRunner(_batch_manager(manager, source), source, record_handler)
    for item in items:
        run.prepare(item)
    when = invocation_deadline(context)
    if when is None:
        failed = await _process(run, items, concurrency)
    else:
        async with ambient_deadline(at=when):
            run.deadline = when
            failed = await _process(run, items, concurrency)
    annotate(manager, {_BATCH_SIZE: len(records), _BATCH_FAILURES: len(failed)})
    return {"batchItemFailures": [{"itemIdentifier": identifier} for identifier in failed]}


def _event_type(value: EventType | str | None) -> EventType | None:
    if value is None or isinstance(value, EventType):
        return value
    try:
        return EventType(value)
    except ValueError:
        names = ", ".join(repr(member.value) for member in EventType)
        raise ConfigError(f"event_type must be one of {names}, got {value!r}") from None


async def _process(run: _RecordRunner, items: list[_Item], concurrency: int) -> list[str]:
    if run.source.ordering is None:
        return await _unordered(run, items, concurrency)
    return await _in_order(run, items)


async def _unordered(run: _RecordRunner, items: list[_Item], concurrency: int) -> list[str]:
    slots = asyncio.Semaphore(concurrency)
    # The first record of each key runs; the duplicates after it in the batch wait for its
    # outcome (without holding a slot) and replay it, or fail with it.
    firsts: dict[str, asyncio.Future[bool]] = {}

    async def one(item: _Item, first: asyncio.Future[bool] | None) -> bool:
        if first is not None and not await asyncio.shield(first):
            return run.failed_with_first(item)
        async with slots:
            return await run(item, duplicate=first is not None)

    async def first_of_its_key(item: _Item, outcome: asyncio.Future[bool]) -> bool:
        try:
            ok = await one(item, None)
        except BaseException:
            outcome.set_result(False)
            raise
        outcome.set_result(ok)
        return ok

    loop = asyncio.get_running_loop()
    repeated = {key for key, count in Counter(item.key for item in items).items() if count > 1}
    calls = []
    for item in items:
        if item.key is None or item.key not in repeated:
            calls.append(one(item, None))  # the common case: nothing to wait for
        elif item.key in firsts:
            calls.append(one(item, firsts[item.key]))
        else:
            firsts[item.key] = outcome = loop.create_future()
            calls.append(first_of_its_key(item, outcome))
    outcomes = await asyncio.gather(*calls)
    return [item.identifier for item, ok in zip(items, outcomes, strict=True) if not ok]


async def _in_order(run: _RecordRunner, items: list[_Item]) -> list[str]:
    stopped: set[str] = set()
    outcomes: dict[str, bool] = {}  # the first record of each key: succeeded?
    failed: list[str] = []
    for item in items:
        first = None if item.key is None else outcomes.get(item.key)
        if item.group is not None and item.group in stopped:
            ok = False
        elif item.unreadable is not None:
            ok = run.unreadable(item)
        elif item.group is None:
            # Its group is unknown, so it cannot stop one: it fails on its own.
            _log.error(
                "%s record %s has no %s: failed without running it",
                run.source.name,
                item.identifier,
                run.source.group_field,
            )
            ok = False
        elif first is False:
            ok = run.failed_with_first(item)
        else:
            ok = await run(item, duplicate=first is not None)
        if item.key is not None:
            outcomes.setdefault(item.key, ok)
        if not ok:
            if item.group is not None:
                stopped.add(item.group)
            failed.append(item.identifier)
    return failed


@dataclass(slots=True)
class _RecordRunner:
    manager: Manager
    source: _Source
    handler: Callable[[dict[str, Any]], Awaitable[object]]
    deadline: float | None = None

    def prepare(self, item: _Item) -> None:
        """Read the record: its decoded payload, key and group; or why it is unreadable.

        Nothing a record holds can fail the batch: a record that cannot be read (a body
        with duplicate JSON members, Keys nested too deeply to compare) fails alone, and so
        does one whose key cannot be derived (nested too deeply to hash, an integer too
        wide for a key), when its own call derives it.
        """
        try:
            # The group first, from the record as delivered: a record that cannot be
            # decoded still stops its group.
            if self.source.ordering is not None:
                item.group = self.source.ordering(item.record)
        except Exception as exc:  # e.g. DynamoDB Keys nested too deeply to compare
            item.unreadable = f"its {self.source.group_field} cannot be read: {_reason(exc)}"
            return
        try:
            item.payload = self.source.decode(item.record)
        except Exception as exc:
            item.unreadable = _reason(exc)
            return
        if disabled_by_environment():
            return  # every record runs on its own, duplicates too
        try:
            item.key = self.manager.key_for(item.payload)
        except Exception:
            # No key to group by: the record's own call derives it again and fails alone
            # with the reason (a payload that cannot be keyed, KeyMissingError).
            item.key = None

    async def __call__(self, item: _Item, *, duplicate: bool = False) -> bool:
        """Run one record; True when it needs no redelivery.

        ``duplicate``: an earlier record of the batch with the same key succeeded, so this
        one replays it (or, when that one's result could not be recorded, counts as
        processed with it).
        """
        if item.unreadable is not None or item.payload is None:
            return self.unreadable(item)
        payload = item.payload
        try:
            with call_attributes(self.manager, {_ITEM_ID: item.identifier}):
                await self.manager.execute(
                    payload, lambda: self.handler(payload), deadline=self.deadline
                )
        except (ResponseNotStoredError, CompletionError) as exc:
            # The handler ran to completion; only its result was not recorded.
            # Redelivering the record could only run the side effect twice.
            _log.warning(
                "%s record %s was processed, but: %s", self.source.name, item.identifier, exc
            )
            return True
        except Exception as exc:
            if duplicate and isinstance(exc, AlreadyInProgressError):
                # Its first copy ran to completion in this batch, but the completion write
                # did not land (in progress until the lease ends): processed with it.
                _log.warning(
                    "%s record %s is a duplicate of one processed in this batch: %s",
                    self.source.name,
                    item.identifier,
                    exc,
                )
                return True
            _log.exception("%s record %s failed", self.source.name, item.identifier)
            return False
        return True

    def unreadable(self, item: _Item) -> bool:
        """A record that cannot be read fails alone, without running."""
        _log.error(
            "%s record %s cannot be read, failed without running it: %s",
            self.source.name,
            item.identifier,
            item.unreadable,
        )
        return False

    def failed_with_first(self, item: _Item) -> bool:
        """A duplicate of a record that failed in this batch: redelivered with it, unrun."""
        _log.info(
            "%s record %s has the key of a record that failed in this batch: "
            "reported failed with it, not run",
            self.source.name,
            item.identifier,
        )
        return False


def _reason(exc: Exception, limit: int = 300) -> str:
    """Why a record cannot be read, short enough for a log line (a path 600 levels deep
    is not)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
