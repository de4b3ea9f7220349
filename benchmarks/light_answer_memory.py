"""Memory an answer takes once decoded, against its size on the wire (light DynamoDB client).

    python benchmarks/light_answer_memory.py

For answers shaped as DynamoDB sends them (and as a hostile endpoint could), prints the
size on the wire, the JSON values the light client counts before decoding, whether it
accepts the answer, and the peak memory (``tracemalloc``) of decoding it: ``orjson.loads``
alone, and for accepted answers the client's whole decoding (Base64, nested maps).  The
bound the client applies is "no more values than one 400 KB item can hold" (see
``docs/dynamodb.md``, "Answers it reads").
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from idempotency_async.stores import dynamodb_light

_MIB = 1024 * 1024


def _item(data: dict[str, Any]) -> bytes:
    item = {"id": {"S": "k#1"}, "status": {"S": "COMPLETED"}, "data": data}
    return json.dumps({"Item": item}, separators=(",", ":")).encode()


SHAPES: dict[str, bytes] = {
    # The largest answers one 400 KB item can make, in values (a NULL costs two bytes in a
    # list, an empty map four):
    "item: 200,000 NULLs in a list": _item({"L": [{"NULL": True}] * 200_000}),
    "item: 100,000 empty maps in a list": _item({"L": [{"M": {}}] * 100_000}),
    "item: a 390 KB string": _item({"S": "x" * 390_000}),
    # Beyond what DynamoDB sends:
    "hostile: 300,000 empty maps": _item({"L": [{"M": {}}] * 300_000}),
    "hostile: 1,000,000 empty maps": _item({"L": [{"M": {}}] * 1_000_000}),
}


def _peak(decode: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        kept = decode()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak / _MIB


def main() -> None:
    print(
        f"{'answer':36} {'wire MB':>8} {'values':>10} {'accepted':>9} "
        f"{'orjson MiB':>11} {'client MiB':>11}"
    )
    for name, payload in SHAPES.items():
        values = dynamodb_light._values(payload)
        try:
            dynamodb_light._check_values("GetItem", payload)
            accepted = True
        except ConnectionError:
            accepted = False
        loaded = _peak(lambda payload=payload: orjson.loads(payload))
        whole = "-"
        if accepted:
            decoded = _peak(
                lambda payload=payload: dynamodb_light._decode_answer("GetItem", 200, {}, payload)
            )
            whole = f"{decoded:.1f}"
        print(
            f"{name:36} {len(payload) / 1e6:8.2f} {values:10,} {accepted!s:>9} "
            f"{loaded:11.1f} {whole:>11}"
        )


if __name__ == "__main__":
    main()
