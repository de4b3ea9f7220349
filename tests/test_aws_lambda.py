"""The AWS Lambda integration: idempotent handlers, the warm-loop entry point, batches."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import itertools
import json
import logging
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _moto import new_session
from support import Clock, checkout_env

from idempotency_async import Manager, MemoryStore, Options, Wait, current_deadline, errors
from idempotency_async.integrations.aws_lambda import (
    EventType,
    LambdaEntrypoint,
    idempotent_handler,
    lambda_entrypoint,
    process_batch,
)
from idempotency_async.stores.base import Store

EVENTS = Path(__file__).parent / "events"
EXAMPLES = Path(__file__).parent.parent / "examples" / "lambda"


class FakeContext:
    """The Lambda context object: the time left is measured from its creation."""

    def __init__(self, remaining_ms: int = 30_000, function_name: str = "orders") -> None:
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = function_name
        self._ends = time.monotonic() + remaining_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._ends - time.monotonic()) * 1000))


def load(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def redelivered(event: dict[str, Any]) -> dict[str, Any]:
    """The same request as AWS delivers it again: new per-delivery fields."""
    again = copy.deepcopy(event)
    context = again.get("requestContext", {})
    if "requestId" in context:
        context["requestId"] = str(uuid.uuid4())
    for record in again.get("Records", []):
        if "receiptHandle" in record:
            record["receiptHandle"] = f"AQEB{uuid.uuid4().hex}=="
            record["attributes"]["ApproximateReceiveCount"] = "2"
    return again


def body_key_manager(store: MemoryStore | None = None, **options: Any) -> Manager:
    return Manager(
        store or MemoryStore(),
        Options(
            key_prefix="orders", event_key_jmespath="powertools_json(body).order_id", **options
        ),
    )


# ---------------------------------------------------------------------- idempotent_handler


@pytest.mark.parametrize(
    "fixture", ["api_gateway_rest_v1.json", "api_gateway_http_v2.json", "alb.json"]
)
async def test_duplicate_invocation_replays_response_without_running_handler(fixture: str) -> None:
    runs = 0

    @idempotent_handler(body_key_manager())
    async def handler(event: dict[str, Any], context: FakeContext) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return {"statusCode": 201, "headers": {"x-run": str(runs)}, "body": uuid.uuid4().hex}

    event = load(fixture)
    first = await handler(event, FakeContext())
    retry = await handler(redelivered(event), FakeContext())

    assert runs == 1
    assert retry == first
    other = json.loads(event["body"]) | {"order_id": "ord-2002"}
    assert await handler({**event, "body": json.dumps(other)}, FakeContext()) != first
    assert runs == 2


async def test_handler_without_key_selection_warns_at_decoration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="orders"))
    runs = 0
    with caplog.at_level(logging.WARNING, logger="idempotency_async"):

        @idempotent_handler(manager)
        async def handler(event: dict[str, Any], context: FakeContext) -> int:
            nonlocal runs
            runs += 1
            return runs

    warnings = [r for r in caplog.records if "requestContext.requestId" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    # What the warning is about: a retry carries a new requestId, so it runs again.
    event = load("api_gateway_rest_v1.json")
    await handler(event, FakeContext())
    await handler(redelivered(event), FakeContext())
    assert runs == 2

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="idempotency_async"):
        idempotent_handler(body_key_manager())
    assert not [r for r in caplog.records if "requestContext.requestId" in r.getMessage()]


async def test_overrunning_handler_leaves_key_claimable_right_after_lambda_deadline(
    clock: Clock,
) -> None:
    manager = body_key_manager(clock=clock)
    slow = True
    runs = 0

    @idempotent_handler(manager)
    async def handler(event: dict[str, Any], context: FakeContext) -> str:
        nonlocal runs
        runs += 1
        if slow:
            await asyncio.sleep(30)
        return "done"

    event = load("api_gateway_http_v2.json")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5):  # guards the test only: the handler is cut off at 0.3 s
            await handler(event, FakeContext(remaining_ms=300))
    assert time.monotonic() - started < 1.0  # cut off at ~0.24 s, not by the 5 s guard

    # Until the Lambda deadline the key is held: the invocation might still be running.
    with pytest.raises(errors.AlreadyInProgressError) as held:
        await handler(redelivered(event), FakeContext())
    assert held.value.lease_end is not None
    assert clock.now < held.value.lease_end <= clock.now + 0.31

    # Right after the deadline the retry claims the key and runs the handler.
    clock.advance(0.31)
    slow = False
    assert await handler(redelivered(event), FakeContext()) == "done"
    assert runs == 2


async def test_handler_sees_lambda_deadline_as_ambient_deadline() -> None:
    seen: list[float | None] = []

    @idempotent_handler(body_key_manager())
    async def handler(event: dict[str, Any], context: FakeContext) -> None:
        seen.append(current_deadline())

    before = asyncio.get_running_loop().time()
    await handler(load("alb.json"), FakeContext(remaining_ms=8_000))
    after = asyncio.get_running_loop().time()
    (when,) = seen
    assert when is not None
    assert before + 7.9 <= when <= after + 8.0


async def test_a_duplicate_waiting_past_the_lambda_deadline_gets_deadline_exceeded() -> None:
    # The deadline is registered as the ambient one but not enforced by a timer of its own:
    # the manager's wait ends at it with its own error, never a bare TimeoutError.
    manager = body_key_manager(wait=Wait(timeout=10))
    release = asyncio.Event()

    @idempotent_handler(manager)
    async def handler(event: dict[str, Any], context: FakeContext) -> str:
        await release.wait()
        return "done"

    first = asyncio.create_task(handler(load("alb.json"), FakeContext()))
    await asyncio.sleep(0.05)
    with pytest.raises(errors.DeadlineExceededError):
        await handler(redelivered(load("alb.json")), FakeContext(remaining_ms=200))
    release.set()
    assert await first == "done"


async def test_handler_raising_releases_key_so_retry_runs() -> None:
    store = MemoryStore()
    attempts = 0

    @idempotent_handler(body_key_manager(store))
    async def handler(event: dict[str, Any], context: FakeContext) -> dict[str, Any]:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("payment provider unreachable")
        return {"statusCode": 201, "body": "created"}

    event = load("api_gateway_rest_v1.json")
    with pytest.raises(ConnectionError):
        await handler(event, FakeContext())
    assert len(store) == 0
    created = {"statusCode": 201, "body": "created"}
    assert await handler(redelivered(event), FakeContext()) == created
    assert await handler(redelivered(event), FakeContext()) == created
    assert attempts == 2


async def test_disabled_env_var_runs_handler_on_every_invocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "True")
    store = MemoryStore()
    runs = 0

    @idempotent_handler(body_key_manager(store))
    async def handler(event: dict[str, Any], context: FakeContext) -> int:
        nonlocal runs
        runs += 1
        return runs

    event = load("api_gateway_rest_v1.json")
    assert await handler(event, FakeContext()) == 1
    assert await handler(event, FakeContext()) == 2
    assert len(store) == 0


def test_idempotent_handler_refuses_a_sync_handler() -> None:
    def handler(event: Any, context: Any) -> None:
        return None

    with pytest.raises(errors.ConfigError):
        idempotent_handler(body_key_manager())(handler)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- batches


def failures(response: dict[str, list[dict[str, str]]]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


async def test_sqs_batch_reports_failed_message_ids_and_replays_the_rest() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    shipped: list[str] = []

    async def ship(record: dict[str, Any]) -> str:
        order = record["body"]  # parsed from the JSON text
        if order["quantity"] <= 0:
            raise ValueError("nothing to ship")
        shipped.append(order["order_id"])
        return str(order["order_id"])

    event = load("sqs.json")
    bad = event["Records"][1]["messageId"]
    assert failures(await process_batch(manager, event, ship)) == [bad]
    assert sorted(shipped) == ["ord-1001", "ord-1003"]

    # Redelivery: completed records replay (no failure, no second shipment).
    assert failures(await process_batch(manager, redelivered(event), ship)) == [bad]
    assert sorted(shipped) == ["ord-1001", "ord-1003"]


async def test_sqs_without_key_selection_keys_records_by_message_id() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    seen: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        seen.append(record["messageId"])

    event = load("sqs.json")
    await process_batch(manager, event, handle)
    # New receipt handles and receive counts: still the same messages.
    await process_batch(manager, redelivered(event), handle)
    assert seen == [record["messageId"] for record in event["Records"]]


def _errors_about(caplog: pytest.LogCaptureFixture, identifier: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR and identifier in record.getMessage()
    ]


async def test_in_batch_duplicates_join_the_first_record_and_replay_its_result(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[str] = []
    manager = Manager(
        store,
        Options(
            key_prefix=f"ship-{uuid.uuid4().hex[:8]}",
            event_key_jmespath="body.order_id",
            on_event=lambda event: events.append(event.kind),
        ),
    )
    runs: list[str] = []

    async def slow(record: dict[str, Any]) -> str:
        runs.append(record["messageId"])
        await asyncio.sleep(0.05)  # the copies arrive while it runs
        return "shipped"

    event = load("sqs.json")
    first, other = copy.deepcopy(event["Records"][0]), copy.deepcopy(event["Records"][2])
    copies = [{**copy.deepcopy(first), "messageId": str(uuid.uuid4())} for _ in range(2)]
    batch = {"Records": [first, *copies, other]}
    caplog.set_level(logging.INFO, logger="idempotency_async")
    assert failures(await process_batch(manager, batch, slow)) == []
    assert sorted(runs) == sorted([first["messageId"], other["messageId"]])
    # Each copy replays (two concurrent replays of one key may share one store read).
    assert events.count("replayed") + events.count("joined") == 2
    assert "rejected_in_progress" not in events
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    # Redelivered later: every copy replays.
    assert failures(await process_batch(manager, redelivered(batch), slow)) == []
    assert len(runs) == 2


async def test_in_batch_duplicates_of_a_failed_record_fail_with_it_unrun(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    runs: list[str] = []
    declined = True

    async def handle(record: dict[str, Any]) -> None:
        runs.append(record["messageId"])
        await asyncio.sleep(0.01)
        if declined:
            raise RuntimeError("card declined")

    first = copy.deepcopy(load("sqs.json")["Records"][0])
    duplicate = {**copy.deepcopy(first), "messageId": str(uuid.uuid4())}
    batch = {"Records": [first, duplicate]}
    caplog.set_level(logging.INFO, logger="idempotency_async")
    assert failures(await process_batch(manager, batch, handle)) == [
        first["messageId"],
        duplicate["messageId"],
    ]
    assert runs == [first["messageId"]]
    assert _errors_about(caplog, first["messageId"])
    assert not _errors_about(caplog, duplicate["messageId"])
    # Both come back: the first runs again, its copy replays it.
    declined = False
    assert failures(await process_batch(manager, redelivered(batch), handle)) == []
    assert runs == [first["messageId"], first["messageId"]]


async def test_fifo_duplicates_replay_or_fail_with_the_first_and_stop_their_group() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="fifo", event_key_jmespath="body.order_id"))
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["messageId"])
        if record["body"]["order_id"] == "declined":
            raise RuntimeError("declined")

    template = load("sqs_fifo.json")["Records"][0]

    def message(group: str, order: str) -> dict[str, Any]:
        record = copy.deepcopy(template)
        record["messageId"] = f"{group}-{order}-{uuid.uuid4().hex[:6]}"
        record["body"] = json.dumps({"order_id": order})
        record["attributes"]["MessageGroupId"] = group
        return record

    a1, b1 = message("a", "paid"), message("b", "paid")
    a2, b2 = message("a", "declined"), message("b", "declined")
    a3, b3 = message("a", "later"), message("b", "after")
    batch = {"Records": [a1, b1, a2, b2, a3, b3]}
    response = await process_batch(manager, batch, handle)
    # b1 replays a1; b2 is a copy of a2, which failed: it fails unrun and stops group b.
    assert ran == [a1["messageId"], a2["messageId"]]
    assert failures(response) == [m["messageId"] for m in (a2, b2, a3, b3)]


async def test_with_idempotency_disabled_every_record_of_a_batch_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "1")
    manager = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    ran: list[str] = []
    declined = {"declined"}

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["messageId"])
        if record["body"]["order_id"] in declined:
            raise RuntimeError("declined")

    template = load("sqs.json")["Records"][0]
    records = [
        {**copy.deepcopy(template), "messageId": str(uuid.uuid4()), "body": json.dumps(body)}
        for body in (
            {"order_id": "declined"},
            {"order_id": "declined"},  # a copy of a failure: still runs, nothing is skipped
            {"order_id": 2**60},  # no key could be derived: nothing needs one
        )
    ]
    response = await process_batch(manager, {"Records": records}, handle)
    assert sorted(ran) == sorted(record["messageId"] for record in records)
    assert failures(response) == [records[0]["messageId"], records[1]["messageId"]]


async def test_one_unreadable_stream_record_fails_alone(caplog: pytest.LogCaptureFixture) -> None:
    deep: Any = {"S": "bottom"}
    for _ in range(600):
        deep = {"M": {"k": deep}}
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["eventID"])

    event = load("dynamodb_stream.json")
    records = event["Records"]
    records[1]["dynamodb"]["Keys"] = {"pk": deep}
    by_id = Manager(MemoryStore(), Options(key_prefix="ddb"))
    response = await process_batch(by_id, event, handle)
    assert failures(response) == [records[1]["dynamodb"]["SequenceNumber"]]
    assert ran == [r["eventID"] for i, r in enumerate(records) if i != 1]
    assert any("cannot be read" in r.getMessage() for r in caplog.records)

    # The same with the key selected from the deep value: only that record fails.
    ran.clear()
    by_keys = Manager(
        MemoryStore(), Options(key_prefix="ddb", event_key_jmespath="[eventID, dynamodb.Keys]")
    )
    response = await process_batch(by_keys, event, handle)
    assert failures(response) == [records[1]["dynamodb"]["SequenceNumber"]]
    assert len(ran) == len(records) - 1

    sqs = load("sqs.json")
    sqs["Records"][0]["body"] = json.dumps({"order_id": 2**60})  # too wide for a key
    strict = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    seen: list[str] = []

    async def ship(record: dict[str, Any]) -> None:
        seen.append(record["messageId"])

    response = await process_batch(strict, sqs, ship)
    assert failures(response) == [sqs["Records"][0]["messageId"]]
    assert seen == [record["messageId"] for record in sqs["Records"][1:]]


async def test_sqs_body_with_duplicate_json_members_fails_without_running() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    ran: list[Any] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["body"])

    good, bad, text = copy.deepcopy(load("sqs.json")["Records"])
    bad["body"] = '{"order_id": "ord-1", "order_id": "ord-2"}'
    text["body"] = "plain text, not JSON"
    text_manager = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body"))
    assert failures(await process_batch(manager, {"Records": [good, bad]}, handle)) == [
        bad["messageId"]
    ]
    assert failures(await process_batch(text_manager, {"Records": [text]}, handle)) == []
    assert ran == [{"order_id": "ord-1001", "quantity": 2}, "plain text, not JSON"]


async def test_standard_sqs_runs_records_concurrently_within_the_bound() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    running = peak = 0

    async def handle(record: dict[str, Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    template = load("sqs.json")["Records"][0]
    records = [{**template, "messageId": str(uuid.uuid4())} for _ in range(7)]
    assert failures(await process_batch(manager, {"Records": records}, handle, concurrency=3)) == []
    assert peak == 3


async def test_response_that_cannot_be_stored_still_counts_as_processed() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    runs = 0

    async def handle(record: dict[str, Any]) -> object:
        nonlocal runs
        runs += 1
        return object()  # not JSON: the record completes with "response not stored"

    event = load("sqs.json")
    assert failures(await process_batch(manager, event, handle)) == []
    assert failures(await process_batch(manager, redelivered(event), handle)) == []
    assert runs == 3


async def test_fifo_runs_each_group_in_order_and_stops_a_group_at_its_first_failure() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="fifo"))
    ran: list[str] = []
    running = 0

    async def handle(record: dict[str, Any]) -> None:
        nonlocal running
        running += 1
        assert running == 1, "FIFO records must not overlap"
        await asyncio.sleep(0.001)
        running -= 1
        ran.append(record["body"]["order_id"])
        if record["body"]["order_id"] == "ord-a2":
            raise RuntimeError("declined")

    event = load("sqs_fifo.json")
    ids = {json.loads(r["body"])["order_id"]: r["messageId"] for r in event["Records"]}
    response = await process_batch(manager, event, handle, concurrency=10)

    assert ran == ["ord-a1", "ord-b1", "ord-a2", "ord-b2"]  # ord-a3 never ran
    assert failures(response) == [ids["ord-a2"], ids["ord-a3"]]

    # The redelivered group resumes where it stopped; the rest replays.
    ran.clear()
    retry = {"Records": [r for r in event["Records"] if r["messageId"] in failures(response)]}
    assert failures(await process_batch(manager, retry, handle)) == [ids["ord-a2"], ids["ord-a3"]]
    assert ran == ["ord-a2"]


async def test_kinesis_records_run_in_order_per_partition_key_with_decoded_data() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="kin", event_key_jmespath="kinesis.data"))
    ran: list[tuple[str, int]] = []

    async def handle(record: dict[str, Any]) -> None:
        data = record["kinesis"]["data"]  # Base64 JSON, decoded
        ran.append((data["user"], data["step"]))
        if data == {"user": "user-1", "step": 2}:
            raise RuntimeError("bad step")

    event = load("kinesis.json")
    seq = [r["kinesis"]["sequenceNumber"] for r in event["Records"]]
    response = await process_batch(manager, event, handle)

    assert ran == [("user-1", 1), ("user-2", 1), ("user-1", 2), ("user-2", 2)]
    assert failures(response) == [seq[2], seq[4]]


async def test_kinesis_binary_data_stays_base64() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="kin"))
    seen: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        seen.append(record["kinesis"]["data"])

    record = copy.deepcopy(load("kinesis.json")["Records"][0])
    record["kinesis"]["data"] = "/w=="  # 0xff: not UTF-8
    assert failures(await process_batch(manager, {"Records": [record]}, handle)) == []
    assert seen == ["/w=="]


async def test_dynamodb_stream_runs_in_order_per_item_key() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ddb"))
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["eventID"])
        if record["eventName"] == "MODIFY" and record["dynamodb"]["Keys"]["pk"]["S"] == "order#1":
            raise RuntimeError("cannot apply update")

    event = load("dynamodb_stream.json")
    records = event["Records"]
    # The same item key with its members in another order is the same partition.
    last = records[4]["dynamodb"]
    last["Keys"] = dict(reversed(list(last["Keys"].items())))
    response = await process_batch(manager, event, handle)

    assert ran == [r["eventID"] for r in records[:4]]
    assert failures(response) == [
        records[2]["dynamodb"]["SequenceNumber"],
        records[4]["dynamodb"]["SequenceNumber"],
    ]
    # Without a JMESPath the stable eventID is the key: a redelivery replays successes.
    ran.clear()
    await process_batch(manager, event, handle)
    assert ran == [records[2]["eventID"]]


async def test_batch_records_are_cut_off_at_the_lambda_deadline() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))

    async def handle(record: dict[str, Any]) -> None:
        if record["body"]["quantity"] == 0:
            await asyncio.sleep(30)

    event = load("sqs.json")
    async with asyncio.timeout(5):
        response = await process_batch(manager, event, handle, context=FakeContext(600))
    assert failures(response) == [event["Records"][1]["messageId"]]


async def test_batch_rejects_unknown_sources_and_accepts_empty_batches() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="x"))

    async def handle(record: dict[str, Any]) -> None:
        return None

    assert await process_batch(manager, {"Records": []}, handle) == {"batchItemFailures": []}
    with pytest.raises(errors.PayloadError):
        await process_batch(manager, {"Records": [{"eventSource": "aws:s3"}]}, handle)
    with pytest.raises(errors.ConfigError):
        await process_batch(manager, load("sqs.json"), handle, concurrency=0)


def batch_entrypoint(
    handle: Any, **options: Any
) -> LambdaEntrypoint[dict[str, Any], Any, dict[str, Any]]:
    """The Lambda entry point of a batch function running ``handle`` on each record."""
    manager = Manager(MemoryStore(), Options(key_prefix="batch"))

    async def consume(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return await process_batch(manager, event, handle, context=context, **options)

    return lambda_entrypoint(consume)


@pytest.mark.parametrize(
    "event",
    [
        load("api_gateway_rest_v1.json"),
        {},
        {"Records": "not a list"},
        {"Records": None},
        [load("sqs.json")],
        {"Records": [*load("sqs.json")["Records"], "not a record"]},
        {
            "Records": [
                {k: v for k, v in load("sqs.json")["Records"][0].items() if k != "messageId"}
            ]
        },
        {"Records": [{**load("sqs.json")["Records"][0], "messageId": ""}]},
        {"Records": [{**r, "kinesis": {"data": "e30="}} for r in load("kinesis.json")["Records"]]},
    ],
    ids=[
        "api-gateway",
        "empty-object",
        "records-not-a-list",
        "records-null",
        "list",
        "non-object-record",
        "no-message-id",
        "empty-message-id",
        "no-sequence-number",
    ],
)
def test_a_misrouted_or_unnameable_batch_raises_before_any_record_runs(
    event: Any,
) -> None:
    ran: list[Any] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record)

    handler = batch_entrypoint(handle)
    try:
        with pytest.raises(errors.BatchEventError) as raised:
            handler(event, FakeContext())
    finally:
        handler.close()
    assert isinstance(raised.value, errors.PayloadError)
    assert ran == []


def test_event_type_pins_the_kind_of_batch() -> None:
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record["messageId"])

    sqs = batch_entrypoint(handle, event_type=EventType.SQS)
    kinesis = batch_entrypoint(handle, event_type="KinesisDataStreams")
    try:
        assert sqs(load("sqs_fifo.json"), FakeContext()) == {"batchItemFailures": []}
        with pytest.raises(errors.BatchEventError, match="KinesisDataStreams"):
            kinesis(load("sqs.json"), FakeContext())
        assert kinesis({"Records": []}, FakeContext()) == {"batchItemFailures": []}
    finally:
        sqs.close()
        kinesis.close()
    assert len(ran) == len(load("sqs_fifo.json")["Records"])
    with pytest.raises(errors.ConfigError, match="event_type"):
        asyncio.run(process_batch(Manager(MemoryStore()), {"Records": []}, handle, event_type="S3"))


def test_broken_records_with_an_id_fail_alone_and_other_partitions_run() -> None:
    ran: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        ran.append(record.get("messageId") or record["eventID"])

    sqs = load("sqs.json")
    del sqs["Records"][1]["body"]
    kinesis = load("kinesis.json")
    del kinesis["Records"][1]["kinesis"]["partitionKey"]  # user-2's first record
    dynamodb = load("dynamodb_stream.json")
    dynamodb["Records"][0]["dynamodb"]["Keys"] = "not keys"  # order#1's first record
    fifo = load("sqs_fifo.json")
    fifo["Records"][0]["attributes"] = None

    handler = batch_entrypoint(handle)
    try:
        answers = [handler(event, FakeContext()) for event in (sqs, kinesis, dynamodb, fifo)]
    finally:
        handler.close()

    def ids(event: dict[str, Any], *indexes: int) -> list[str]:
        return [
            event["Records"][i].get("messageId") or event["Records"][i]["eventID"] for i in indexes
        ]

    assert failures(answers[0]) == [sqs["Records"][1]["messageId"]]
    assert failures(answers[1]) == [kinesis["Records"][1]["kinesis"]["sequenceNumber"]]
    assert failures(answers[2]) == [dynamodb["Records"][0]["dynamodb"]["SequenceNumber"]]
    assert failures(answers[3]) == [fifo["Records"][0]["messageId"]]
    assert sorted(ran) == sorted(
        ids(sqs, 0, 2)
        + ids(kinesis, 0, 2, 3, 4)
        + ids(dynamodb, 1, 2, 3, 4)
        + ids(fifo, *range(1, len(fifo["Records"])))
    )


# ---------------------------------------------------------------------- entry point


def test_entrypoint_keeps_one_loop_and_runs_init_once() -> None:
    calls: list[str] = []

    async def init() -> None:
        calls.append("init")

    async def shutdown() -> None:
        calls.append("shutdown")

    async def handle(event: dict[str, Any], context: Any) -> int:
        calls.append("handle")
        return id(asyncio.get_running_loop())

    handler = lambda_entrypoint(handle, init=init, shutdown=shutdown)
    loops = {handler({}, FakeContext()) for _ in range(3)}
    handler.close()
    handler.close()

    assert len(loops) == 1
    assert calls == ["init", "handle", "handle", "handle", "shutdown"]
    with pytest.raises(RuntimeError):
        handler({}, FakeContext())


def test_entrypoint_retries_init_after_it_failed() -> None:
    attempts = 0

    async def init() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("cold start hiccup")

    async def handle(event: dict[str, Any], context: Any) -> str:
        return "ok"

    handler = lambda_entrypoint(handle, init=init)
    try:
        with pytest.raises(ConnectionError):
            handler({}, FakeContext())
        assert handler({}, FakeContext()) == "ok"
        assert handler({}, FakeContext()) == "ok"
        assert attempts == 2
    finally:
        handler.close()


def test_entrypoint_close_skips_shutdown_when_init_never_succeeded() -> None:
    calls: list[str] = []

    async def init() -> None:
        calls.append("init")
        raise ConnectionError("cold start hiccup")

    async def shutdown() -> None:
        calls.append("shutdown")

    async def handle(event: dict[str, Any], context: Any) -> str:
        return "ok"

    handler = lambda_entrypoint(handle, init=init, shutdown=shutdown)
    with pytest.raises(ConnectionError):
        handler({}, FakeContext())
    handler.close()
    assert calls == ["init"]


def test_entrypoint_refuses_a_sync_handler() -> None:
    with pytest.raises(errors.ConfigError):
        lambda_entrypoint(lambda event, context: None)  # type: ignore[arg-type, return-value]


@pytest.mark.dynamodb
def test_warm_invocations_reuse_one_aioboto3_client(moto_endpoint: str) -> None:
    from idempotency_async.stores.dynamodb import DynamoDBStore, create_table

    session = new_session()
    table = f"idem-{uuid.uuid4().hex[:12]}"
    opened = 0

    def open_client() -> Any:
        nonlocal opened
        opened += 1
        return session.client("dynamodb", endpoint_url=moto_endpoint)

    store = DynamoDBStore(table_name=table, client_factory=open_client)
    manager = body_key_manager(store)  # type: ignore[arg-type]
    runs = 0

    async def init() -> None:
        async with session.client("dynamodb", endpoint_url=moto_endpoint) as client:
            await create_table(client, table)

    @idempotent_handler(manager)
    async def create(event: dict[str, Any], context: FakeContext) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return {"statusCode": 201, "body": json.loads(event["body"])["order_id"]}

    handler = lambda_entrypoint(create, init=init, shutdown=store.aclose)
    template = load("api_gateway_rest_v1.json")
    try:
        for n in range(20):
            order = f"ord-{n // 2}"  # every order twice: a claim, then a replay
            event = {**redelivered(template), "body": json.dumps({"order_id": order})}
            assert handler(event, FakeContext()) == {"statusCode": 201, "body": order}
    finally:
        handler.close()
    assert opened == 1
    assert runs == 10


# ---------------------------------------------------------------------- examples


@pytest.fixture
def example_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from idempotency_async.stores.dynamodb import create_table

    table = f"idem-{uuid.uuid4().hex[:12]}"
    for name, value in {
        "IDEMPOTENCY_TABLE": table,
        "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    async def setup() -> None:
        async with new_session().client("dynamodb", endpoint_url=moto_endpoint) as client:
            await create_table(client, table)

    asyncio.run(setup())
    yield table


def load_example(name: str) -> ModuleType:
    module_name = f"lambda_example_{name}_{next(_example_ids)}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_example_ids = itertools.count()


@pytest.mark.dynamodb
def test_example_api_handler_creates_each_order_once(example_env: str) -> None:
    example = load_example("api_handler")
    try:
        v1 = load("api_gateway_rest_v1.json")
        first = example.handler(v1, FakeContext())
        assert first["statusCode"] == 201
        # The same order through the HTTP API (v2) is the same request: replayed.
        assert example.handler(load("api_gateway_http_v2.json"), FakeContext()) == first
        assert example.handler(redelivered(v1), FakeContext()) == first

        changed = {
            **v1,
            "body": json.dumps({"order_id": "ord-1001", "amount": 1, "currency": "EUR"}),
        }
        assert example.handler(changed, FakeContext())["statusCode"] == 422
        assert example.handler({**v1, "body": "{}"}, FakeContext())["statusCode"] == 400
        deep = "[" * 10_000 + "]" * 10_000  # used to escape as RecursionError (a 502)
        assert example.handler({**v1, "body": deep}, FakeContext())["statusCode"] == 400
        other = {**v1, "body": json.dumps({"order_id": "ord-2", "amount": 1, "currency": "EUR"})}
        second = example.handler(other, FakeContext())
        assert second["statusCode"] == 201 and second["body"] != first["body"]
    finally:
        example.handler.close()


@pytest.mark.dynamodb
def test_example_sqs_handler_ships_each_order_once(example_env: str) -> None:
    example = load_example("sqs_handler")
    try:
        event = load("sqs.json")
        bad = event["Records"][1]["messageId"]
        expected = {"batchItemFailures": [{"itemIdentifier": bad}]}
        assert example.handler(event, FakeContext()) == expected
        assert example.handler(redelivered(event), FakeContext()) == expected
        assert sorted(example.shipped) == ["ord-1001", "ord-1003"]
    finally:
        example.handler.close()


# ---------------------------------------------------------------------- entry points in a process


def run_module(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a handler module in a fresh interpreter (this checkout first)."""
    module = tmp_path / "handler_module.py"
    module.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", str(module), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )


@pytest.mark.dynamodb
def test_two_entry_points_in_one_module_share_one_store(example_env: str, tmp_path: Path) -> None:
    completed = run_module(
        tmp_path,
        """
        import json, os, sys
        import aioboto3
        from idempotency_async import Manager, Options
        from idempotency_async.integrations.aws_lambda import (
            idempotent_handler, lambda_entrypoint, process_batch,
        )
        from idempotency_async.stores.dynamodb import DynamoDBStore

        session = aioboto3.Session()
        store = DynamoDBStore(
            table_name=os.environ["IDEMPOTENCY_TABLE"],
            client_factory=lambda: session.client("dynamodb"),
        )
        orders = Manager(store, Options(key_prefix="api", event_key_jmespath="order_id"))
        shipments = Manager(store, Options(key_prefix="ship"))

        @idempotent_handler(orders)
        async def create(event, context):
            return {"created": event["order_id"]}

        async def ship(record):
            return record["body"]["order_id"]

        async def consume(event, context):
            return await process_batch(shipments, event, ship)

        api = lambda_entrypoint(create, shutdown=store.aclose)
        sqs = lambda_entrypoint(consume)
        batch = json.loads(open(sys.argv[1]).read())
        answers = [api({"order_id": "a"}, None), sqs(batch, None), api({"order_id": "a"}, None)]
        print(json.dumps(answers))
        print(api.loop is sqs.loop)
        """,
        str(EVENTS / "sqs.json"),
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    answers, same_loop = completed.stdout.splitlines()
    created = {"created": "a"}
    assert json.loads(answers)[0] == json.loads(answers)[2] == created
    assert json.loads(answers)[1] == {"batchItemFailures": []}
    assert same_loop == "True"


def test_entry_point_called_inside_a_running_loop_says_what_to_do(tmp_path: Path) -> None:
    completed = run_module(
        tmp_path,
        """
        import asyncio, gc
        from idempotency_async.integrations.aws_lambda import lambda_entrypoint

        async def init():
            pass

        async def handle(event, context):
            return "ran"

        handler = lambda_entrypoint(handle, init=init)

        async def main():
            try:
                handler({}, None)
            except RuntimeError as exc:
                print(f"refused: {exc}")
            try:
                handler.close()
            except RuntimeError as exc:
                print(f"close refused: {exc}")

        asyncio.run(main())
        gc.collect()
        print(handler({}, None))
        handler.close()
        """,
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    refused, close_refused, ran = completed.stdout.splitlines()
    assert "running event loop" in refused and "await the async handler" in refused
    assert "synchronous code" in close_refused
    assert ran == "ran"
    assert "never awaited" not in completed.stderr
    assert completed.stderr == ""


def test_the_process_loop_outlives_each_entry_point_but_the_last() -> None:
    async def handle(event: dict[str, Any], context: Any) -> int:
        return id(asyncio.get_running_loop())

    first, second = lambda_entrypoint(handle), lambda_entrypoint(handle)
    try:
        loop = first({}, None)
        assert second({}, None) == loop and first.loop is second.loop
        first.close()
        assert second({}, None) == loop and second.loop is not None
        shared = second.loop
    finally:
        first.close()
        second.close()
    assert shared.is_closed()
    third = lambda_entrypoint(handle)
    try:
        third({}, None)
        assert third.loop is not shared
    finally:
        third.close()


async def test_handler_raising_its_own_cancelled_error_fails_only_its_record() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    template = load("sqs.json")["Records"][0]
    records = [{**template, "messageId": str(uuid.uuid4())} for _ in range(2)]
    finished: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        if record["messageId"] == records[0]["messageId"]:
            raise asyncio.CancelledError  # nobody cancelled the batch
        await asyncio.sleep(0.3)
        finished.append(record["messageId"])

    response = await process_batch(manager, {"Records": records}, handle)
    # The batch response is returned, naming the record whose handler cancelled itself,
    # and the other record finished before process_batch returned.
    assert failures(response) == [records[0]["messageId"]]
    assert finished == [records[1]["messageId"]]


async def test_fifo_handler_raising_its_own_cancelled_error_fails_its_record() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    event = load("sqs_fifo.json")
    first = event["Records"][0]["messageId"]

    async def handle(record: dict[str, Any]) -> None:
        if record["messageId"] == first:
            raise asyncio.CancelledError

    response = await process_batch(manager, event, handle)
    assert first in failures(response)


async def test_cancelling_a_batch_cancels_and_awaits_every_record() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="ship"))
    template = load("sqs.json")["Records"][0]
    records = [{**template, "messageId": str(uuid.uuid4())} for _ in range(3)]
    started = asyncio.Event()
    ended: list[str] = []

    async def handle(record: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        finally:
            ended.append(record["messageId"])

    batch = asyncio.create_task(process_batch(manager, {"Records": records}, handle))
    await started.wait()
    await asyncio.sleep(0.05)
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    # Every handler was cancelled and had ended by the time the batch task was done.
    assert sorted(ended) == sorted(record["messageId"] for record in records)
