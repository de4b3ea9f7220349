"""DynamoDB: the Manager and the store against raw requests and powertools, on one moto server.

    python benchmarks/bench_dynamodb.py            # full run (about a minute)
    python benchmarks/bench_dynamodb.py --smoke    # a few seconds, for CI

Everything talks to one single-threaded moto server that this script starts in its own
process, so the benchmark process's CPU time (``time.process_time``) is the client's.

First calls (a fresh key each call):
  raw      PutItem with the claim condition + UpdateItem, straight through aioboto3
  store    the same two requests through ``DynamoDBStore.claim`` + ``complete``
  manager  ``Manager.execute(payload, callback, timeout=...)`` on that store
  anchor   aws-lambda-powertools ``idempotent_function`` on ``DynamoDBPersistenceLayer``
           (boto3, sync, called sequentially in the main thread)
  raw-b3   the raw requests through boto3 (sync): what the anchor's HTTP stack costs
Replays (one completed key, called again and again):
  raw      one conditional PutItem that fails with ReturnValuesOnConditionCheckFailure=ALL_OLD
  manager  ``Manager.execute`` of that key (no local cache)
  anchor   the powertools function called again with the same payload
  raw-b3   the failing PutItem through boto3

One round = N sequential calls of one path; the paths' rounds are interleaved (the order
rotates every repeat) and the medians of the per-round means are compared.  Budget:
manager <= 1.10 x raw, first calls and replays.  Round trips per call are counted with
botocore's ``before-send`` event hook in a separate, untimed pass.

Last, the library's own client CPU: the manager (and its store) against raw requests on a
stub client that answers at once, where botocore's ~1 ms per request cannot hide it.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parent))

import aioboto3
import boto3
import botocore.exceptions
from _moto_server import start_moto
from _stats import interleaved, paired, parse_args

from idempotency_async import Manager, Options
from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Found, Written
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table

BUDGET = 1.10
TIMEOUT = 10.0
RESPONSE = {"order": 123, "status": "ACCEPTED", "amount": 10.5, "items": ["a", "b"]}
REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
# -- the raw requests ----------------------------------------------------------------


def claim_request(table: str, key: str, now: float) -> dict[str, Any]:
    """The PutItem a first call sends (the store's claim, spelled out)."""
    return {
        "TableName": table,
        "Item": {
            "id": {"S": key},
            "status": {"S": "INPROGRESS"},
            "expiration": {"N": str(int(now) + 3600)},
            "in_progress_expiration": {"N": str(int(now * 1000) + 30_000)},
            "owner": {"S": "raw"},
        },
        "ConditionExpression": (
            "attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress AND "
            "attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis "
            "AND attribute_not_exists(#steps)) OR (#status = :inprogress AND #owner = :owner "
            "AND attribute_not_exists(#steps))"
        ),
        "ExpressionAttributeNames": {
            "#id": "id",
            "#expiry": "expiration",
            "#status": "status",
            "#in_progress_expiry": "in_progress_expiration",
            "#owner": "owner",
            "#steps": "steps",
        },
        "ExpressionAttributeValues": {
            ":now": {"N": repr(now)},
            ":now_in_millis": {"N": repr(now * 1000)},
            ":inprogress": {"S": "INPROGRESS"},
            ":owner": {"S": "raw"},
        },
        "ReturnConsumedCapacity": "TOTAL",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def complete_request(table: str, key: str, now: float) -> dict[str, Any]:
    """The UpdateItem a first call sends (the store's completion, spelled out)."""
    return {
        "TableName": table,
        "Key": {"id": {"S": key}},
        "UpdateExpression": (
            "SET #status = :status, #expiry = :expiry, #data = :data "
            "REMOVE #lease, #steps, #step_count"
        ),
        "ConditionExpression": "#owner = :owner",
        "ExpressionAttributeNames": {
            "#status": "status",
            "#expiry": "expiration",
            "#data": "data",
            "#lease": "in_progress_expiration",
            "#steps": "steps",
            "#step_count": "step_count",
            "#owner": "owner",
        },
        "ExpressionAttributeValues": {
            ":status": {"S": "COMPLETED"},
            ":expiry": {"N": str(int(now) + 3600)},
            ":data": {
                "M": {
                    "order": {"N": "123"},
                    "status": {"S": "ACCEPTED"},
                    "amount": {"N": "10.5"},
                    "items": {"L": [{"S": "a"}, {"S": "b"}]},
                }
            },
            ":owner": {"S": "raw"},
        },
    }


async def raw_first_call(client: Any, table: str, key: str, now: float) -> None:
    await client.put_item(**claim_request(table, key, now))
    await client.update_item(**complete_request(table, key, now))


async def raw_replay(client: Any, table: str, key: str) -> None:
    try:
        await client.put_item(**claim_request(table, key, time.time()))
    except botocore.exceptions.ClientError as exc:
        assert exc.response["Item"]["status"]["S"] == "COMPLETED"
    else:
        raise AssertionError("the replayed claim succeeded")


def raw_boto3_first_call(client: Any, table: str, key: str, now: float) -> None:
    client.put_item(**claim_request(table, key, now))
    client.update_item(**complete_request(table, key, now))


def raw_boto3_replay(client: Any, table: str, key: str) -> None:
    try:
        client.put_item(**claim_request(table, key, time.time()))
    except botocore.exceptions.ClientError as exc:
        assert exc.response["Item"]["status"]["S"] == "COMPLETED"
    else:
        raise AssertionError("the replayed claim succeeded")


# -- the library and the anchor ------------------------------------------------------


async def store_first_call(store: DynamoDBStore, key: str, now: float) -> None:
    owner = uuid.uuid4().hex
    claim = Claim(key, owner, now, 30.0, 3600.0)
    assert (await store.claim(claim)).found is Found.CLAIMED
    done = Completion(key, owner, now, 3600.0, None, encode_json(RESPONSE), RESPONSE)
    assert await store.complete(done) is Written.RESPONSE


def order(order_id: str) -> dict[str, Any]:
    return {"id": order_id, "amount": 10, "currency": "EUR", "customer": "c-1"}


async def respond() -> dict[str, Any]:
    return RESPONSE


async def manager_call(manager: Manager, payload: dict[str, Any]) -> None:
    assert await manager.execute(payload, respond, timeout=TIMEOUT) == RESPONSE


class _LambdaContext:
    def get_remaining_time_in_millis(self) -> int:
        return int(TIMEOUT * 1000)


def anchor_function(client: Any, table: str) -> Any:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    layer = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
    # As in a Lambda handler: the context gives the in-progress record a lease, like our
    # timeout does (and keeps powertools from warning on every call).
    config = IdempotencyConfig(
        expires_after_seconds=3600, lambda_context=cast(Any, _LambdaContext())
    )

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="order", persistence_store=layer, config=config
    )
    def process(order: dict[str, Any]) -> dict[str, Any]:
        return RESPONSE

    return process


# -- measuring -----------------------------------------------------------------------


@dataclass
class Bench:
    name: str
    kind: str  # "first" or "replay"
    run: Callable[[int], list[float]]  # makes n sequential calls, returns each one's time
    client: Any  # the botocore client whose requests are this path's round trips
    walls: list[float] = field(default_factory=list)  # per round: mean time per call
    cpus: list[float] = field(default_factory=list)  # per round: client CPU per call
    each: list[float] = field(default_factory=list)  # every timed call

    def timed_round(self, calls: int) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.each.extend(self.run(calls))
        self.walls.append((time.perf_counter() - wall) / calls)
        self.cpus.append((time.process_time() - cpu) / calls)

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)


@contextmanager
def sent_requests(client: Any) -> Iterator[list[str]]:
    """Names of the HTTP requests the client sends inside the block (each retry counts)."""
    sent: list[str] = []

    def record(event_name: str, **_: Any) -> None:
        sent.append(event_name.rsplit(".", 1)[-1])

    client.meta.events.register("before-send.dynamodb.*", record)
    try:
        yield sent
    finally:
        client.meta.events.unregister("before-send.dynamodb.*", record)


def round_trips(path: Bench, calls: int = 5) -> tuple[float, str]:
    with sent_requests(path.client) as sent:
        path.run(calls)
    kinds = sorted(set(sent), key=sent.index)
    return len(sent) / calls, "+".join(kinds)


def build_paths(
    loop: asyncio.AbstractEventLoop, client: Any, sync_client: Any, table: str
) -> list[Bench]:
    store = DynamoDBStore(client, table_name=table)
    manager = Manager(store, Options(key_prefix="bench"))
    process = anchor_function(sync_client, table)
    now = time.time()

    def looped(call: Callable[[], Awaitable[None]]) -> Callable[[int], list[float]]:
        async def calls(n: int) -> list[float]:
            times = []
            for _ in range(n):
                start = time.perf_counter()
                await call()
                times.append(time.perf_counter() - start)
            return times

        return lambda n: loop.run_until_complete(calls(n))

    def repeated(call: Callable[[], object]) -> Callable[[int], list[float]]:
        def calls(n: int) -> list[float]:
            times = []
            for _ in range(n):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            return times

        return calls

    def fresh() -> str:
        return f"bench#{uuid.uuid4().hex}"

    # One completed record per replay path, written the way that path writes it.
    replay_key = fresh()
    loop.run_until_complete(raw_first_call(client, table, replay_key, now))
    replay_order = order(uuid.uuid4().hex)
    loop.run_until_complete(manager_call(manager, replay_order))
    anchor_order = order(uuid.uuid4().hex)
    process(order=anchor_order)

    return [
        Bench("raw", "first", looped(lambda: raw_first_call(client, table, fresh(), now)), client),
        Bench("store", "first", looped(lambda: store_first_call(store, fresh(), now)), client),
        Bench(
            "manager",
            "first",
            looped(lambda: manager_call(manager, order(uuid.uuid4().hex))),
            client,
        ),
        Bench(
            "anchor",
            "first",
            repeated(lambda: process(order=order(uuid.uuid4().hex))),
            sync_client,
        ),
        Bench(
            "raw-b3",
            "first",
            repeated(lambda: raw_boto3_first_call(sync_client, table, fresh(), now)),
            sync_client,
        ),
        Bench("raw", "replay", looped(lambda: raw_replay(client, table, replay_key)), client),
        Bench("manager", "replay", looped(lambda: manager_call(manager, replay_order)), client),
        Bench("anchor", "replay", repeated(lambda: process(order=anchor_order)), sync_client),
        Bench(
            "raw-b3",
            "replay",
            repeated(lambda: raw_boto3_replay(sync_client, table, replay_key)),
            sync_client,
        ),
    ]


def measure(endpoint: str, calls: int, repeats: int) -> tuple[list[Bench], dict[Any, Any]]:
    loop = asyncio.new_event_loop()
    session = aioboto3.Session(region_name=REGION, **CREDENTIALS)
    context = session.client("dynamodb", endpoint_url=endpoint)
    client = loop.run_until_complete(context.__aenter__())
    sync_client = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION, **CREDENTIALS)
    try:
        table = f"bench-{uuid.uuid4().hex[:8]}"
        loop.run_until_complete(create_table(client, table))
        paths = build_paths(loop, client, sync_client, table)
        trips = {(p.name, p.kind): round_trips(p) for p in paths}
        for path in paths:  # warm up connections and code paths
            path.run(10)
        for repeat in range(repeats):
            shift = repeat % len(paths)
            for path in paths[shift:] + paths[:shift]:
                path.timed_round(calls)
        return paths, trips
    finally:
        sync_client.close()
        loop.run_until_complete(context.__aexit__(None, None, None))
        loop.close()


def report(paths: list[Bench], trips: dict[Any, Any], calls: int, repeats: int) -> bool:
    by = {(p.name, p.kind): p for p in paths}
    print(
        f"DynamoDB on a single-threaded moto server: {calls} sequential calls per round, "
        f"{repeats} interleaved rounds per path"
    )
    print(
        f"  {'path':<15}{'µs/call':>9}{'per-call':>10}{'client CPU':>12}  round trips\n"
        f"  {'':<15}{'(rounds)':>9}{'median':>10}{'µs/call':>12}"
    )
    for p in paths:
        count, kinds = trips[(p.name, p.kind)]
        print(
            f"  {p.kind + ' ' + p.name:<15}{p.wall * 1e6:9.0f}"
            f"{statistics.median(p.each) * 1e6:10.0f}{p.cpu * 1e6:12.0f}  {count:g} ({kinds})"
        )
    print(
        "  ratios: of the round medians [within rounds: median (range); of per-call medians;"
        " client CPU within rounds]"
    )
    within = True
    for kind in ("first", "replay"):
        raw, manager, anchor = by[("raw", kind)], by[("manager", kind)], by[("anchor", kind)]
        ratio = manager.wall / raw.wall
        ok = ratio <= BUDGET
        within &= ok
        names = ["manager/raw", "anchor/manager"] + (["store/raw"] if kind == "first" else [])
        pairs = [(manager, raw), (anchor, manager)]
        if kind == "first":
            pairs.append((by[("store", kind)], raw))
        parts = [f"{name} {_ratios(a, b)}" for name, (a, b) in zip(names, pairs, strict=True)]
        print(f"  {kind:<7}" + "   ".join(parts))
        print(
            f"  {'':<7}manager {'within' if ok else 'OVER'} budget ({ratio:.3f} vs {BUDGET:.2f});"
            f" client CPU manager - raw {(manager.cpu - raw.cpu) * 1e6:.0f} µs/call,"
            f" manager/raw {manager.cpu / raw.cpu:.2f},"
            f" anchor/manager {anchor.cpu / manager.cpu:.2f}"
        )
    return within


def _ratios(a: Bench, b: Bench) -> str:
    each = statistics.median(a.each) / statistics.median(b.each)
    within = paired(a.walls, b.walls)
    cpu = paired(a.cpus, b.cpus)
    return f"{a.wall / b.wall:.3f} [{within}; {each:.3f}; CPU {cpu}]"


class StubClient:
    """Answers PutItem and UpdateItem at once: what is left is the caller's own CPU."""

    def __init__(self) -> None:
        self.existing: dict[str, Any] | None = None

    async def put_item(self, **request: Any) -> dict[str, Any]:
        if self.existing is not None:
            # The record of the key asked about (an answer about another key is refused).
            existing = {**self.existing, "id": request["Item"]["id"]}
            error = {"Error": {"Code": "ConditionalCheckFailedException"}, "Item": existing}
            raise botocore.exceptions.ClientError(error, "PutItem")
        return {"ConsumedCapacity": {"TableName": "t", "CapacityUnits": 1.0}}

    async def update_item(self, **request: Any) -> dict[str, Any]:
        return {}


def library_cpu(calls: int, repeats: int) -> dict[str, float]:
    """Client CPU µs per call above a stub client, for raw requests and the manager.

    On the real server these differences drown in botocore's ~1 ms per request; here the
    only cost left is building the requests, the store and the manager.
    """
    stub = StubClient()
    manager = Manager(DynamoDBStore(stub, table_name="t"), Options(key_prefix="b"))
    completed = complete_request("t", "k", time.time())["ExpressionAttributeValues"]
    item = {"id": {"S": "k"}, "status": completed[":status"], "expiration": completed[":expiry"]}
    item["data"] = completed[":data"]
    replay_order = order("replayed")

    async def raw_first() -> None:
        await raw_first_call(stub, "t", f"bench#{uuid.uuid4().hex}", time.time())

    async def raw_again() -> None:
        await raw_replay(stub, "t", "k")

    async def first() -> None:
        await manager_call(manager, order(uuid.uuid4().hex))

    async def again() -> None:
        await manager_call(manager, replay_order)

    def cpu(call: Callable[[], Awaitable[None]], existing: dict[str, Any] | None) -> float:
        async def go() -> None:
            for _ in range(calls):
                await call()

        stub.existing = existing
        start = time.process_time()
        asyncio.run(go())
        return (time.process_time() - start) / calls * 1e6

    runs = {
        "first raw": lambda: cpu(raw_first, None),
        "first manager": lambda: cpu(first, None),
        "replay raw": lambda: cpu(raw_again, item),
        "replay manager": lambda: cpu(again, item),
    }
    return interleaved(runs, repeats)


def compression() -> str:
    """How much zlib (what the store compresses oversized responses with) shrinks JSON:
    the batches of ``_key_payloads.py`` grown to about the 400 KB item limit."""
    import zlib

    import orjson
    from _key_payloads import mixed_case_batch, order_batch, varied_mixed_case_batch

    ratios = []
    for make, count in (
        (order_batch, 480),
        (mixed_case_batch, 700),
        (varied_mixed_case_batch, 800),
    ):
        encoded = orjson.dumps(make(count))
        ratio = len(encoded) / len(zlib.compress(encoded))
        ratios.append(f"{make.__name__} {len(encoded) // 1000} KB {ratio:.1f}x")
    return ", ".join(ratios)


def main() -> None:
    args = parse_args(__doc__ or "")
    print(f"zlib on JSON near the item limit: {compression()}")
    calls, repeats = (20, 3) if args.smoke else (50, 25)
    repeats = args.repeats or repeats
    logging.getLogger("idempotency_async").setLevel(logging.ERROR)
    process, endpoint = start_moto()
    try:
        paths, trips = measure(endpoint, calls, repeats)
    finally:
        process.terminate()
        process.wait(timeout=10)
    within = report(paths, trips, calls, repeats)
    stub_calls = 500 if args.smoke else 5000
    lib = library_cpu(stub_calls, repeats)
    print(f"Library CPU above a stub client, µs/call ({stub_calls} calls, {repeats} rounds)")
    for kind in ("first", "replay"):
        raw, ours = lib[f"{kind} raw"], lib[f"{kind} manager"]
        print(f"  {kind:<7} raw {raw:6.1f}   manager+store {ours:6.1f}   library {ours - raw:6.1f}")
    if not within:
        if args.smoke:
            print("  (over budget: smoke runs are too short to judge; not failing)")
        else:
            raise SystemExit("over budget")


if __name__ == "__main__":
    main()
