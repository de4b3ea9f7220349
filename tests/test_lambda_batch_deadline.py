"""A Lambda batch under a slow store answers before its deadline.

1,000 ms left, 50 ms per store round trip, 40 records: the batch cannot finish them all.
It must still return ``batchItemFailures`` (Lambda then redelivers only those records),
never raise ``TimeoutError`` at the deadline (Lambda would redeliver the whole batch).
The exact timings run on a virtual clock (``VirtualClockLoop``: timers fire in order with
no real waiting, so a busy machine cannot move a verdict); one run on the real clock is
judged by what the store saw.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

from support import RecordingStore

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.record import Status
from idempotency_async.testing._vloop import VirtualClockLoop

EVENTS = Path(__file__).parent / "events"
BUDGET_MS = 1000
ROUND_TRIP = 0.05
RECORDS = 40
OPERATIONS = ("claim", "get", "complete", "release", "extend")


class LoopContext:
    """The Lambda context, its remaining time counted on the running loop's clock."""

    def __init__(self, remaining_ms: int) -> None:
        self.ends = asyncio.get_running_loop().time() + remaining_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.ends - asyncio.get_running_loop().time()) * 1000))


def _batch(source: str) -> dict[str, Any]:
    """``RECORDS`` distinct messages (FIFO: each in a group of its own)."""
    template = json.loads((EVENTS / source).read_text())["Records"][0]
    records = []
    for n in range(RECORDS):
        record = copy.deepcopy(template)
        record["messageId"] = f"m-{n:02d}"
        record["body"] = json.dumps({"order_id": f"o-{n:02d}"})
        if "MessageGroupId" in record["attributes"]:
            record["attributes"]["MessageGroupId"] = f"g-{n:02d}"
        records.append(record)
    return {"Records": records}


def _slow_store() -> RecordingStore:
    return RecordingStore(MemoryStore(), delay=dict.fromkeys(OPERATIONS, ROUND_TRIP))


async def _completed(store: RecordingStore, manager: Manager, event: dict[str, Any]) -> set[str]:
    """The messages whose record the store holds COMPLETED."""
    done = set()
    for record in event["Records"]:
        key = manager.key_for({"body": json.loads(record["body"])})
        verdict = await store.inner.get(key or "", now=time.time())
        if verdict.record is not None and verdict.record.status is Status.COMPLETED:
            done.add(record["messageId"])
    return done


def _claimed(store: RecordingStore, manager: Manager, event: dict[str, Any]) -> set[str]:
    """The messages whose key the store was asked to claim."""
    keys = {claim.key for claim in store.claims}
    return {
        record["messageId"]
        for record in event["Records"]
        if manager.key_for({"body": json.loads(record["body"])}) in keys
    }


async def _run(source: str, work: float, concurrency: int = 10) -> dict[str, Any]:
    store = _slow_store()
    manager = Manager(store, Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    event = _batch(source)
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        await asyncio.sleep(work)
        ran.append(record["messageId"])

    loop = asyncio.get_running_loop()
    context = LoopContext(BUDGET_MS)
    response = await process_batch(manager, event, handle, context=context, concurrency=concurrency)
    return {
        "failed": {item["itemIdentifier"] for item in response["batchItemFailures"]},
        "answered_before_deadline": context.ends - loop.time(),
        "completed": await _completed(store, manager, event),
        "claimed": _claimed(store, manager, event),
        "ran": set(ran),
        "all": {record["messageId"] for record in event["Records"]},
    }


def _on_virtual_clock(source: str, work: float) -> dict[str, Any]:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(_run(source, work))
    finally:
        loop.close()


def _accounted(outcome: dict[str, Any]) -> None:
    """Every record either completed in the store or is reported failed; never both."""
    failed, completed = outcome["failed"], outcome["completed"]
    assert failed | completed == outcome["all"]
    assert not failed & completed
    assert outcome["ran"] <= completed | failed


def test_a_slow_store_batch_answers_with_failures_instead_of_timing_out() -> None:
    # Standard SQS, 10 at a time: two waves complete (50 + 200 + 50 ms each); the third
    # is cut off before its leases end; the batch answers with time to spare.
    outcome = _on_virtual_clock("sqs.json", work=0.2)

    _accounted(outcome)
    assert len(outcome["completed"]) == 20 and len(outcome["failed"]) == 20
    # It answered at least the half of the reserve it kept back (min(0.25 s, 10 %) of 1 s).
    assert outcome["answered_before_deadline"] >= 0.05


def test_records_not_started_before_the_deadline_fail_without_a_claim() -> None:
    # FIFO, one record at a time (120 ms each): those not started by the records' deadline
    # are reported without ever reaching the store, so each is redelivered alone.
    outcome = _on_virtual_clock("sqs_fifo.json", work=0.02)

    _accounted(outcome)
    not_started = outcome["all"] - outcome["claimed"]
    # Seven complete by 0.84 s; the next two are claimed before the records' deadline
    # (0.9 s) but answered too late to run, and are cut off.
    assert len(outcome["completed"]) == 7
    assert len(not_started) == RECORDS - 9
    assert not_started <= outcome["failed"]
    assert outcome["answered_before_deadline"] >= 0.05


async def test_on_the_real_clock_the_batch_answers_and_the_store_agrees() -> None:
    # Judged by what the store saw, not by how late a busy machine woke the loop.
    outcome = await _run("sqs.json", work=0.2)

    _accounted(outcome)
    assert outcome["failed"]  # a second of budget does not fit 40 records here
    assert outcome["completed"]
