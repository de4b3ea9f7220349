"""Key derivation: what ``Manager.execute`` runs for a key, against aws-lambda-powertools.

    python benchmarks/bench_keys.py               # full run, ~2 min
    python benchmarks/bench_keys.py --only akl    # some shapes only
    python benchmarks/bench_keys.py --smoke       # a few seconds: byte identity on every shape (CI)

Each row derives the key of the *whole* payload, both sides through their own wrappers:

* anchor: aws-lambda-powertools (Python), ``BasePersistenceLayer._get_hashed_idempotency_key``
  of a layer configured as ``idempotent_function`` configures it, without a JMESPath
  expression — what its wrapped call runs for the key (the missing-key check,
  ``json.dumps(sort_keys=True)``, md5 hex, the prefix);
* warm: ``KeyDeriver.derive`` of a default ``Manager(MemoryStore(), Options(key_prefix=...))``
  — the call ``Manager.execute`` makes (selection, the missing-key check, canonical JSON,
  md5, the key and validation pair) — with the key-order cache holding the shape's key sets;
* churn: the same deriver with the key-order cache emptied before every call, so every
  object's key set is one it has not seen (a cold start; payloads with new key sets).  The
  emptying is timed with the call: it is what a full cache costs when it turns over;
* floor: ``orjson.dumps`` + md5 + Base64, no key order and no JavaScript number rules
  (what no correct implementation can beat; a reference, not a contender).

Every call gets a fresh payload object (``json.loads`` of the payload's text, decoded before
the clock starts), as a Lambda handler gets a fresh event.  A round runs a small chunk of
calls of every contender, in an order rotated each round; ratios are taken within a round
and quoted as the median and range over the rounds, for CPU time (``time.process_time``)
and wall time.  The key of every shape is checked against the general (reference) path
before timing.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).parent))

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
    varied_mixed_case_batch,
)
from _stats import Clock, Timing, load, median_of, ratios, rotated_rounds

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.canonical import _orders, digest_bytes, idempotency_key
from idempotency_async.canonical._general import general_bytes

PREFIX = "process-order"


class Shape(NamedTuple):
    label: str
    make: Callable[[], Any]
    budget: float
    """anchor / ours to reach with a warm cache; with churn the budget is 1x (never slower)."""


# DESIGN budgets: at least 2x on flat objects and events; never slower on any shape.
SHAPES: dict[str, Shape] = {
    "a": Shape("API Gateway v2 event", api_gateway_v2_event, 2.0),
    "b": Shape("batch of orders", order_batch, 1.0),
    "c": Shape("small payload", small_payload, 2.0),
    "d": Shape("mixed-case object", mixed_case_object, 2.0),
    "e": Shape("mixed-case DTO", mixed_case_dto, 2.0),
    "f": Shape("non-ASCII keys", non_ascii_keys, 2.0),
    "g": Shape("array-index keys", index_keys, 2.0),
    "h": Shape("JavaScript floats", javascript_floats, 2.0),
    "i": Shape("REST API v1 event", rest_v1_event, 2.0),
    "j": Shape("SNS-in-SQS event", sns_in_sqs_event, 2.0),
    "k": Shape("mixed-case batch", mixed_case_batch, 1.0),
    "l": Shape("varied mixed-case batch", varied_mixed_case_batch, 1.0),
}
CHURN_BUDGET = 1.0


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


def our_deriver() -> Callable[[Any], Any]:
    """The bound ``derive`` of a default manager: what ``execute`` calls for a key."""
    return Manager(MemoryStore(), Options(key_prefix=PREFIX))._keys.derive


def floor(value: Any) -> str:
    return base64.b64encode(hashlib.md5(orjson.dumps(value)).digest()).decode()


def check_identity(derive: Callable[[Any], Any], value: Any) -> None:
    expected = idempotency_key(PREFIX, digest_bytes(general_bytes(value, strict_integers=True)))
    _orders.clear_cache()
    cold = derive(value)
    warm = derive(value)
    if cold.key != expected or warm.key != expected:
        raise SystemExit(
            "the deriver's key differs from the general path's: the fast path is wrong"
        )


# ------------------------------------------------------------------------------ measuring


def chunk(
    function: Callable[[Any], Any],
    text: str,
    calls: int,
    *,
    churn: bool = False,
    clear: Callable[[], None] = _orders.clear_cache,
) -> Timing:
    """µs per call over ``calls`` calls, each on a fresh copy decoded before timing."""
    copies = [json.loads(text) for _ in range(calls)]
    if churn:
        with Clock() as clock:
            for value in copies:
                clear()
                function(value)
    else:
        with Clock() as clock:
            for value in copies:
                function(value)
    return clock.per_call(calls)


def calls_for(function: Callable[[Any], Any], text: str, target_us: float) -> int:
    """How many calls make a chunk of about ``target_us`` of CPU."""
    function(json.loads(text))
    probe = chunk(function, text, 8)
    return max(2, int(target_us / max(probe.cpu, 0.05)))


def cache_worst_case() -> float:
    """MiB the key-order cache holds when full of the largest key sets it keeps.

    512 key sets (``CACHE_ENTRIES``) of 64 keys (``CACHE_MAX_KEYS``) of 16 astral-plane
    characters each (``CACHE_MAX_CHARS`` is 1,024), in mixed case, so that every entry keeps
    its rebuild template; the keys themselves are counted (the cache keeps them alive).
    """
    import random
    import tracemalloc

    rng = random.Random(1)
    letters = [chr(0x10400 + n) for n in range(80)]  # Deseret: capitals and small letters
    key_sets = [
        tuple("".join(rng.choice(letters) for _ in range(16)) for _ in range(64))
        for _ in range(_orders.CACHE_ENTRIES)
    ]
    _orders.clear_cache()
    tracemalloc.start()
    for keys in key_sets:
        _orders.learn_order(keys)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert _orders.cache_size() == _orders.CACHE_ENTRIES
    _orders.clear_cache()
    key_bytes = sum(sys.getsizeof(key) for keys in key_sets for key in keys)
    return (held + key_bytes) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks identity")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--chunk-ms", type=float, default=2.0, help="CPU per chunk")
    parser.add_argument("--only", default="", help="shape letters to run, e.g. 'akl'")
    parser.add_argument(
        "--baseline", default=None, help="also time this commit's deriver (git rev), warm and churn"
    )
    args = parser.parse_args()
    rounds = 3 if args.smoke else max(5, args.rounds)
    target_us = 200.0 if args.smoke else args.chunk_ms * 1000
    anchor, derive = anchor_key_function(), our_deriver()
    then: dict[str, Any] = {}
    if args.baseline:
        import importlib
        import tempfile

        from compare_baseline import export_baseline

        package = export_baseline(args.baseline, Path(tempfile.mkdtemp()))
        then["derive"] = package.Manager(
            package.MemoryStore(), package.Options(key_prefix=PREFIX)
        )._keys.derive
        then["clear"] = importlib.import_module(f"{package.__name__}.canonical._orders").clear_cache

    print(f"python {sys.version.split()[0]}, orjson {orjson.__version__}; {load()}")
    print(
        f"{rounds} rounds of ~{target_us / 1000:g} ms chunks per contender, order rotated; "
        "µs per key (median CPU, wall); ratios anchor/ours within rounds, median (range)"
    )
    print(
        f"{'shape':<30}{'bytes':>7}{'anchor':>8}{'warm':>8}{'churn':>8}{'floor':>7}"
        f"  {'anchor/warm CPU':<20}{'anchor/churn CPU':<20}{'wall: warm, churn':<18}budget"
    )
    missed = []
    for name, shape in SHAPES.items():
        if args.only and name not in args.only:
            continue
        value = shape.make()
        check_identity(derive, value)
        text = json.dumps(value, ensure_ascii=False)
        size = len(general_bytes(value))
        calls = {
            "anchor": calls_for(anchor, text, target_us),
            "warm": calls_for(derive, text, target_us),
            "floor": calls_for(floor, text, target_us),
        }
        calls["churn"] = calls["warm"]
        runs = {
            "anchor": lambda t=text, n=calls["anchor"]: chunk(anchor, t, n),
            "warm": lambda t=text, n=calls["warm"]: chunk(derive, t, n),
            "churn": lambda t=text, n=calls["churn"]: chunk(derive, t, n, churn=True),
            "floor": lambda t=text, n=calls["floor"]: chunk(floor, t, n),
        }
        if then:
            runs["then warm"] = lambda t=text, n=calls["warm"]: chunk(then["derive"], t, n)
            runs["then churn"] = lambda t=text, n=calls["warm"]: chunk(
                then["derive"], t, n, churn=True, clear=then["clear"]
            )
        samples = rotated_rounds(runs, rounds)
        warm = ratios(samples["anchor"], samples["warm"])
        churn = ratios(samples["anchor"], samples["churn"])
        wall = (
            ratios(samples["anchor"], samples["warm"], "wall").median,
            ratios(samples["anchor"], samples["churn"], "wall").median,
        )
        ok = warm.median >= shape.budget and churn.median >= CHURN_BUDGET
        if not ok:
            missed.append(name)
        print(
            f"({name}) {shape.label:<26}{size:>7}"
            + "".join(
                f"{median_of(samples[who]):>{width}.1f}"
                for who, width in (("anchor", 8), ("warm", 8), ("churn", 8), ("floor", 7))
            )
            + f"  {warm!s:<20}{churn!s:<20}{wall[0]:.2f}, {wall[1]:.2f}{'':<8}"
            + f"{shape.budget:g}x / {CHURN_BUDGET:g}x {'met' if ok else 'MISSED'}"
        )
        if then:
            print(
                f"    {args.baseline}: anchor/warm "
                f"{ratios(samples['anchor'], samples['then warm'])}"
                f", anchor/churn {ratios(samples['anchor'], samples['then churn'])}; now/then "
                f"warm {ratios(samples['then warm'], samples['warm'])}, churn "
                f"{ratios(samples['then churn'], samples['churn'])} (then/now CPU)"
            )
    print(f"after: {load()}")
    print(f"key-order cache when full of its largest key sets: {cache_worst_case():.1f} MiB")
    if args.smoke:
        # Timings of a few milliseconds on a loaded CI machine are not meaningful.
        print("smoke run: the key of every shape matches the general path; timings not meaningful")
    elif missed:
        print(f"budget missed (median) on: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
