"""The light DynamoDB client's cost per request, now vs an earlier commit, interleaved.

    python benchmarks/light_round_trip.py 220ed0f            # medians of 15 rounds
    python benchmarks/light_round_trip.py 220ed0f --rounds 5

Both versions (the earlier one exported as in ``compare_baseline.py``) send GetItem
requests one after another over one kept-alive connection to a loopback server (in this
process) that answers each at once with a small item, as DynamoDB would.  Reports the
median µs of wall time and of client CPU (``time.process_time``, server included: the same
for both) per request, and the ratio now / then.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

from compare_baseline import export_baseline

import idempotency_async.stores.dynamodb_light as now_light

REQUESTS = 2000
_ITEM = {"Item": {"id": {"S": "k#1"}, "status": {"S": "COMPLETED"}, "data": {"N": "1"}}}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    body = json.dumps(_ITEM).encode()
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n"
        + f"x-amz-crc32: {zlib.crc32(body)}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(answer)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def one_round(module: Any, url: str) -> tuple[float, float]:
    client = module.LightDynamoDBClient(
        region="us-east-1", endpoint_url=url, access_key_id="AKID", secret_access_key="s"
    )
    async with client:
        await client.get_item(TableName="t", Key={"id": {"S": "k#1"}})  # connect first
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(REQUESTS):
            await client.get_item(TableName="t", Key={"id": {"S": "k#1"}})
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / REQUESTS * 1e6, cpu / REQUESTS * 1e6


async def main(baseline: ModuleType, rounds: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    results: dict[str, list[tuple[float, float]]] = {"now": [], "then": []}
    modules = {"now": now_light, "then": baseline}
    for index in range(rounds):
        order = ["now", "then"] if index % 2 == 0 else ["then", "now"]
        for name in order:
            results[name].append(await one_round(modules[name], url))
    server.close()
    await server.wait_closed()
    medians = {
        name: tuple(statistics.median(values[i] for values in runs) for i in (0, 1))
        for name, runs in results.items()
    }
    for name, (wall, cpu) in medians.items():
        print(f"{name:5} {wall:8.1f} µs wall  {cpu:8.1f} µs CPU per request")
    walls = sorted(
        now[0] / then[0] for now, then in zip(results["now"], results["then"], strict=True)
    )
    cpus = sorted(
        now[1] / then[1] for now, then in zip(results["now"], results["then"], strict=True)
    )
    print(
        f"now/then wall: median {statistics.median(walls):.3f} "
        f"(range {walls[0]:.3f}-{walls[-1]:.3f}); CPU: median {statistics.median(cpus):.3f} "
        f"(range {cpus[0]:.3f}-{cpus[-1]:.3f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("rev")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        export_baseline(args.rev, Path(folder))
        then_light = __import__(
            "idempotency_baseline.stores.dynamodb_light", fromlist=["LightDynamoDBClient"]
        )
        asyncio.run(main(then_light, args.rounds))
