"""Key derivation: idempotency-async against aws-lambda-powertools (Python), in one process.

Run ``python benchmarks/bench_keys.py`` (``--smoke`` for a few-second check that still
verifies byte identity on every shape).  Each row hashes the *whole* payload on both sides:

* anchor: ``BasePersistenceLayer._get_hashed_idempotency_key`` (``json.dumps`` with
  ``sort_keys`` + md5 hex), configured without a JMESPath expression;
* ours: what the manager computes, ``idempotency_key(prefix, md5(canonical_bytes(value)))``
  with the manager's strict integers: the TypeScript-compatible key;
* public: the same key through the public pair, ``digest(canonical_json(value))``;
* floor: ``orjson.dumps`` + md5 + Base64 of the same value, no canonicalization at all.

Every call gets a fresh payload object (``json.loads`` of the payload's text, made before
the clock starts), as a Lambda handler gets a fresh event: nothing cached per object can
flatter either side.  Times are µs per key, the median of interleaved repeats (the machine
is small and noisy, so compare ratios, not absolute numbers).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
from _key_payloads import (
    api_gateway_v2_event,
    index_keys,
    javascript_floats,
    mixed_case_batch,
    mixed_case_dto,
    mixed_case_object,
    non_ascii_keys,
    order_batch,
    rest_v1_event,
    small_payload,
    sns_in_sqs_event,
)

from idempotency_async.canonical import (
    canonical_bytes,
    canonical_json,
    digest,
    digester,
    idempotency_key,
)
from idempotency_async.canonical._general import general_bytes

PREFIX = "process-order"


class Shape(NamedTuple):
    label: str
    make: Callable[[], Any]
    budget: float
    kind: str  # why this budget: "consistent", "flat" (≤ 1 KB) or "nested mixed"


SHAPES: dict[str, Shape] = {
    "a": Shape("API Gateway v2 event", api_gateway_v2_event, 2.0, "consistent"),
    "b": Shape("batch of orders", order_batch, 3.0, "consistent"),
    "c": Shape("small payload", small_payload, 2.0, "flat"),
    "d": Shape("mixed-case object", mixed_case_object, 2.0, "flat"),
    "e": Shape("mixed-case DTO", mixed_case_dto, 2.0, "flat"),
    "f": Shape("non-ASCII keys", non_ascii_keys, 2.0, "flat"),
    "g": Shape("array-index keys", index_keys, 2.0, "flat"),
    "h": Shape("JavaScript floats", javascript_floats, 2.0, "flat"),
    "i": Shape("REST API v1 event", rest_v1_event, 1.0, "nested mixed"),
    "j": Shape("SNS-in-SQS event", sns_in_sqs_event, 1.0, "nested mixed"),
    "k": Shape("mixed-case batch", mixed_case_batch, 1.0, "nested mixed"),
}


# ------------------------------------------------------------------------------ contenders


def anchor_key_function() -> Callable[[Any], Any]:
    from aws_lambda_powertools.utilities.idempotency.config import IdempotencyConfig
    from aws_lambda_powertools.utilities.idempotency.persistence.base import (
        BasePersistenceLayer,
    )

    class _KeyOnly(BasePersistenceLayer):  # type: ignore[misc]
        """Only the key derivation is used; the I/O methods are never called."""

        def _get_record(self, idempotency_key: str) -> Any:
            raise NotImplementedError

        def _put_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _update_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _delete_record(self, data_record: Any) -> None:
            raise NotImplementedError

    layer = _KeyOnly()
    layer.configure(IdempotencyConfig(), key_prefix=PREFIX)
    return layer._get_hashed_idempotency_key  # type: ignore[no-any-return]


_md5 = digester("md5")


def ours(value: Any) -> str:
    return idempotency_key(PREFIX, _md5(canonical_bytes(value, strict_integers=True)))


def public(value: Any) -> str:
    return idempotency_key(PREFIX, digest(canonical_json(value)))


def floor(value: Any) -> str:
    return base64.b64encode(hashlib.md5(orjson.dumps(value)).digest()).decode()


# ------------------------------------------------------------------------------ measuring


def per_call_us(function: Callable[[Any], Any], text: str, loops: int) -> float:
    """µs per call over ``loops`` calls, each on a fresh copy decoded before timing."""
    chunk = max(1, min(256, 4_000_000 // len(text)))
    elapsed = 0.0
    done = 0
    while done < loops:
        copies = [json.loads(text) for _ in range(min(chunk, loops - done))]
        started = time.perf_counter()
        for value in copies:
            function(value)
        elapsed += time.perf_counter() - started
        done += len(copies)
    return elapsed / loops * 1e6


def loops_for(function: Callable[[Any], Any], text: str, target_s: float) -> int:
    loops = 16
    while True:
        spent = per_call_us(function, text, loops) * loops / 1e6
        if spent >= target_s / 4:
            return max(1, int(loops * target_s / spent))
        loops *= 2


def check_identity(value: Any) -> None:
    fast = canonical_bytes(value)
    if fast != general_bytes(value):
        raise SystemExit("canonical_bytes differs from the general path: the fast path is wrong")
    if ours(value) != public(value):
        raise SystemExit("the public canonical_json/digest pair gives another key")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks identity")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", default="", help="shape letters to run, e.g. 'bik'")
    args = parser.parse_args()
    repeats = 3 if args.smoke else max(5, args.repeats)
    target_s = 0.01 if args.smoke else 0.12
    anchor = anchor_key_function()
    contenders = {"anchor": anchor, "ours": ours, "public": public, "floor": floor}

    print(f"python {sys.version.split()[0]}, orjson {orjson.__version__}, {repeats} repeats")
    print(
        f"{'shape':<26}{'bytes':>7}{'anchor µs':>11}{'ours µs':>9}{'public µs':>11}"
        f"{'floor µs':>10}{'anchor/ours':>13}{'budget':>9}"
    )
    ratios: dict[str, float] = {}
    for name, shape in SHAPES.items():
        if args.only and name not in args.only:
            continue
        value = shape.make()
        check_identity(value)
        text = json.dumps(value, ensure_ascii=False)
        size = len(canonical_bytes(value))
        loops = {who: loops_for(f, text, target_s) for who, f in contenders.items()}
        samples: dict[str, list[float]] = {who: [] for who in contenders}
        for _ in range(repeats):  # interleaved, so drift hits every contender alike
            for who, function in contenders.items():
                samples[who].append(per_call_us(function, text, loops[who]))
        median = {who: statistics.median(times) for who, times in samples.items()}
        ratio = ratios[name] = median["anchor"] / median["ours"]
        met = ratio >= shape.budget
        print(
            f"({name}) {shape.label:<22}{size:>7}{median['anchor']:>11.1f}{median['ours']:>9.1f}"
            f"{median['public']:>11.1f}{median['floor']:>10.1f}{ratio:>12.2f}x"
            f"{'>=' if met else '<':>5}{shape.budget:.0f}x"
        )
    if args.smoke:
        # Timings on a loaded CI machine, a few milliseconds each, are not meaningful.
        print("smoke run: byte identity checked on every shape; timings not meaningful")
    elif ratios:
        worst = min(ratios, key=lambda name: ratios[name] / SHAPES[name].budget)
        print(
            f"worst shape against its budget: ({worst}) {SHAPES[worst].label}, "
            f"{ratios[worst]:.2f}x (budget {SHAPES[worst].budget:.0f}x); lowest ratio "
            f"{min(ratios.values()):.2f}x"
        )
        missed = [name for name, ratio in ratios.items() if ratio < SHAPES[name].budget]
        if missed:
            print(f"budget missed on: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
