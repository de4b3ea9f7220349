"""DynamoDBStore against raw aioboto3 requests, on a single-threaded moto server.

    python benchmarks/bench_dynamodb.py            # full run
    python benchmarks/bench_dynamodb.py --smoke    # a few seconds, for CI

One round = N sequential first calls.  "raw" sends the requests a first call needs
(PutItem with the claim condition, then UpdateItem) straight through aioboto3; "store"
sends the same two requests through ``DynamoDBStore.claim`` + ``complete``.  Rounds are
interleaved and the medians compared (budget: store <= 1.10 x raw).  Client CPU time is the
benchmark process's CPU time (the server runs in its own process).  The Manager's own
cost is measured by bench_manager.py.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import aioboto3
from _stats import parse_args

from idempotency_async.record import Claim, Completion
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table

BUDGET = 1.10
RESPONSE = {"order": 123, "status": "ACCEPTED", "amount": 10.5, "items": ["a", "b"]}
_SERVER = (
    "import sys\n"
    "from werkzeug.serving import run_simple\n"
    "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app\n"
    "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app),"
    " threaded=False)\n"
)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return process, url
        except urllib.error.HTTPError:
            return process, url
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the moto server did not start")


async def raw_first_call(client: Any, table: str, key: str, now: float) -> None:
    await client.put_item(
        TableName=table,
        Item={
            "id": {"S": key},
            "status": {"S": "INPROGRESS"},
            "expiration": {"N": str(int(now) + 3600)},
            "in_progress_expiration": {"N": str(int(now * 1000) + 30_000)},
            "owner": {"S": "raw"},
        },
        ConditionExpression=(
            "attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress AND "
            "attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis)"
        ),
        ExpressionAttributeNames={
            "#id": "id",
            "#expiry": "expiration",
            "#status": "status",
            "#in_progress_expiry": "in_progress_expiration",
        },
        ExpressionAttributeValues={
            ":now": {"N": repr(now)},
            ":now_in_millis": {"N": repr(now * 1000)},
            ":inprogress": {"S": "INPROGRESS"},
        },
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    await client.update_item(
        TableName=table,
        Key={"id": {"S": key}},
        UpdateExpression="SET #status = :status, #expiry = :expiry, #data = :data REMOVE #lease",
        ConditionExpression="#owner = :owner",
        ExpressionAttributeNames={
            "#status": "status",
            "#expiry": "expiration",
            "#data": "data",
            "#lease": "in_progress_expiration",
            "#owner": "owner",
        },
        ExpressionAttributeValues={
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
    )


async def store_first_call(store: DynamoDBStore, key: str, now: float) -> None:
    owner = uuid.uuid4().hex
    claim = Claim(key, owner, int(now) + 3600, int(now * 1000) + 30_000)
    assert await store.claim(claim, now=now) is None
    assert await store.complete(Completion(key, owner, int(now) + 3600, None, RESPONSE))


async def timed_round(call: Callable[[str], Awaitable[None]], calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await call(f"bench#{uuid.uuid4().hex}")
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


async def run(endpoint: str, calls: int, repeats: int) -> bool:
    session = aioboto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    async with session.client("dynamodb", endpoint_url=endpoint) as client:
        table = f"bench-{uuid.uuid4().hex[:8]}"
        await create_table(client, table)
        store = DynamoDBStore(client, table_name=table)
        now = time.time()
        paths: dict[str, Callable[[str], Awaitable[None]]] = {
            "raw": lambda key: raw_first_call(client, table, key, now),
            "store": lambda key: store_first_call(store, key, now),
        }
        for call in paths.values():  # warm up connections and code paths
            await timed_round(call, 5)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(repeats):
            for name, call in paths.items():
                samples[name].append(await timed_round(call, calls))
    wall = {name: statistics.median(s[0] for s in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(s[1] for s in runs) for name, runs in samples.items()}
    ratio = wall["store"] / wall["raw"]
    print(f"first call (PutItem + UpdateItem), {calls} calls x {repeats} interleaved rounds")
    for name in paths:
        print(f"  {name:5}  {wall[name] * 1e3:7.3f} ms/call   client CPU {cpu[name] * 1e3:6.3f} ms")
    print(f"  store / raw = {ratio:.3f}  (budget <= {BUDGET:.2f})")
    print(f"  store client CPU over raw = {(cpu['store'] - cpu['raw']) * 1e6:.0f} us/call")
    return ratio <= BUDGET


def main() -> None:
    args = parse_args(__doc__ or "")
    calls, repeats = (20, 3) if args.smoke else (200, 9)
    repeats = args.repeats or repeats
    process, endpoint = start_moto()
    try:
        within = asyncio.run(run(endpoint, calls, repeats))
    finally:
        process.terminate()
        process.wait(timeout=10)
    if not within and not args.smoke:
        raise SystemExit("over budget")


if __name__ == "__main__":
    main()
