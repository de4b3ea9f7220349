"""Keys in the Powertools (Python) format: idempotency-async against aws-lambda-powertools.

Run ``python benchmarks/bench_powertools_python_keys.py`` (``--smoke``: a few seconds, and
still asserts that both sides derive the same key).  Each row hashes the *whole* payload
of ``bench_keys.py``, both sides through their wrappers:

* anchor: ``BasePersistenceLayer._get_hashed_idempotency_key`` of the installed
  aws-lambda-powertools, configured without a JMESPath expression;
* ours: ``KeyDeriver.derive`` of ``Manager(..., Options(key_format="powertools-python"))``,
  the deriver ``execute`` runs — the same key, by the same ``json.dumps`` rules.

A fresh payload object per call; rounds of small chunks in rotated order; the ratio is
taken within rounds (median and range), on CPU time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import json

from _stats import load, median_of, ratios, rotated_rounds
from bench_keys import PREFIX, SHAPES, anchor_key_function, calls_for, chunk

from idempotency_async import Manager, MemoryStore, Options

BUDGET = 0.9
"""Slowest acceptable anchor/ours ratio: the text is the same json.dumps, so on par."""


def ours_key_function() -> Callable[[Any], Any]:
    manager = Manager(MemoryStore(), Options(key_format="powertools-python", key_prefix=PREFIX))
    return manager._keys.derive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks identity")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    rounds = 3 if args.smoke else max(5, args.rounds)
    target_us = 200.0 if args.smoke else 2000.0
    anchor, ours = anchor_key_function(), ours_key_function()
    print(f"python {sys.version.split()[0]}; {load()}; {rounds} rounds, order rotated")
    print(f"{'payload':<30}{'anchor µs':>11}{'ours µs':>9}  {'anchor/ours CPU':<20}budget")
    failed = []
    for name, shape in SHAPES.items():
        value = shape.make()
        derived = ours(value)
        if derived is None or anchor(value) != derived.key:
            raise SystemExit(f"({name}): the keys differ from Powertools' keys")
        text = json.dumps(value, ensure_ascii=False)
        calls = {
            "anchor": calls_for(anchor, text, target_us),
            "ours": calls_for(ours, text, target_us),
        }
        samples = rotated_rounds(
            {
                "anchor": lambda t=text, n=calls["anchor"]: chunk(anchor, t, n),
                "ours": lambda t=text, n=calls["ours"]: chunk(ours, t, n),
            },
            rounds,
        )
        ratio = ratios(samples["anchor"], samples["ours"])
        met = ratio.median >= BUDGET
        if not met:
            failed.append(name)
        print(
            f"({name}) {shape.label:<26}{median_of(samples['anchor']):>11.1f}"
            f"{median_of(samples['ours']):>9.1f}  {ratio!s:<20}"
            f"{'>=' if met else '<'} {BUDGET}x"
        )
    print(f"after: {load()}")
    if failed and not args.smoke:
        print(f"budget missed on: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
