"""``process_batch``: an SQS, Kinesis or DynamoDB stream batch, each record idempotent.

Standard SQS records run concurrently; ordered sources (SQS FIFO, Kinesis, DynamoDB
streams) run in order per group, the first failure stopping the rest of its group.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from idempotency_async._derive import derive
from idempotency_async.errors import ConfigError
from idempotency_async.instrumentation import annotate
from idempotency_async.integrations._lambda.context import invocation_deadline
from idempotency_async.integrations._lambda.events import (
    EventType,
    Source,
    parse_event_type,
    records_of,
    source_of,
)
from idempotency_async.integrations._lambda.records import Item, RecordRunner, identified
from idempotency_async.manager import Manager

__all__ = ["DEFAULT_CONCURRENCY", "BatchResponse", "process_batch"]

_log = logging.getLogger("idempotency_async.aws_lambda")

BatchResponse = dict[str, list[dict[str, str]]]
"""``{"batchItemFailures": [{"itemIdentifier": ...}, ...]}``, as Lambda expects it."""

DEFAULT_CONCURRENCY = 10
# Time kept back to answer before Lambda ends the invocation: min(0.25 s, 10 % of the time
# left when the batch starts).  Records' leases end that long before the Lambda deadline;
# a record still in a store round trip halfway through it is cut off, so the batch returns
# its batchItemFailures with the other half to spare.
_MAX_ANSWER_RESERVE = 0.25
_ANSWER_SHARE = 0.1
# Telemetry: the counts on the current (invocation) span.
_BATCH_SIZE = "idempotency.batch.size"
_BATCH_FAILURES = "idempotency.batch.failures"


_derived: weakref.WeakKeyDictionary[Manager, dict[str, Manager]] = weakref.WeakKeyDictionary()


def _batch_manager(manager: Manager, source: Source) -> Manager:
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

    With ``context`` (the Lambda context), the batch keeps min(0.25 s, 10 %) of the time
    left back to answer: records' leases end that long before Lambda ends the invocation,
    records not started by then fail without running, and one still in a store round trip
    halfway through that reserve is cut off and fails; the batch returns its
    ``batchItemFailures`` rather than being ended with the whole batch redelivered.

    ``event_type`` (:class:`~idempotency_async.integrations.aws_lambda.EventType` or
    its value) makes the expected kind explicit.
    :class:`~idempotency_async.errors.BatchEventError` is raised, before any record
    runs, for an event that is not a batch (no ``Records`` list), of another kind than
    ``event_type``, or holding a record that cannot be named (not an object, no id).
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    expected = parse_event_type(event_type)
    records = records_of(event)
    if not records:
        return {"batchItemFailures": []}
    source = source_of(records, expected)
    items = identified(records, source)
    run = RecordRunner(_batch_manager(manager, source), source, record_handler)
    for item in items:
        run.prepare(item)
    when = invocation_deadline(context)
    if when is not None:
        keep = min(_MAX_ANSWER_RESERVE, _ANSWER_SHARE * (when - asyncio.get_running_loop().time()))
        run.deadline = when - keep  # leases end here, and no record starts after it
        run.stop = when - keep / 2  # whatever still runs is cut off here
    failed = await _process(run, items, concurrency)
    if run.not_started:
        _log.warning(
            "%d of %d %s records were not started: the invocation's deadline was near; "
            "they are reported in batchItemFailures and will be redelivered",
            run.not_started,
            len(items),
            source.name,
        )
    annotate(manager, {_BATCH_SIZE: len(records), _BATCH_FAILURES: len(failed)})
    return {"batchItemFailures": [{"itemIdentifier": identifier} for identifier in failed]}


async def _process(run: RecordRunner, items: list[Item], concurrency: int) -> list[str]:
    if run.source.ordering is None:
        return await _unordered(run, items, concurrency)
    return await _in_order(run, items)


async def _unordered(run: RecordRunner, items: list[Item], concurrency: int) -> list[str]:
    slots = asyncio.Semaphore(concurrency)
    # The first record of each key runs; the duplicates after it in the batch wait for its
    # outcome (without holding a slot) and replay it, or fail with it.
    firsts: dict[str, asyncio.Future[bool]] = {}

    async def one(item: Item, first: asyncio.Future[bool] | None) -> bool:
        if first is not None and not await asyncio.shield(first):
            return run.failed_with_first(item)
        async with slots:
            return await run(item, duplicate=first is not None)

    async def first_of_its_key(item: Item, outcome: asyncio.Future[bool]) -> bool:
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
    # A task group, not gather: when a record raises past its runner (SystemExit) or the
    # batch is cancelled, the other records are cancelled and awaited before this returns,
    # so no handler keeps running after process_batch is done.
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as group_error:
        # A runner only lets a crash through (SystemExit, a BaseException): the batch ends
        # with it as it was raised, not wrapped in a group the caller never asked for.
        raise group_error.exceptions[0] from None
    return [item.identifier for item, task in zip(items, tasks, strict=True) if not task.result()]


async def _in_order(run: RecordRunner, items: list[Item]) -> list[str]:
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
