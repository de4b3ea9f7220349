"""Keys in the Powertools (Python) format: idempotency-async against aws-lambda-powertools.

Run ``python benchmarks/bench_powertools_python_keys.py`` (``--smoke``: a few seconds, and
still asserts that both sides derive the same key).  Each row hashes the *whole* payload
of ``bench_keys.py``:

* anchor: ``BasePersistenceLayer._get_hashed_idempotency_key`` of the installed
  aws-lambda-powertools, configured without a JMESPath expression;
* ours: ``Manager.key_for`` with ``Options(key_format="powertools-python")`` — the same
  key, by the same ``json.dumps`` rules.

Times are µs per key, medians of interleaved repeats; compare the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import json

from bench_keys import PREFIX, SHAPES, anchor_key_function, loops_for, per_call_us

from idempotency_async import Manager, MemoryStore, Options

BUDGET = 0.9
"""Slowest acceptable anchor/ours ratio: the text is the same json.dumps, so on par."""


def ours_key_function() -> Callable[[Any], Any]:
    manager = Manager(MemoryStore(), Options(key_format="powertools-python", key_prefix=PREFIX))
    return manager.key_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks identity")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    repeats = 3 if args.smoke else max(7, args.repeats)
    target_s = 0.02 if args.smoke else 0.15
    contenders = {"anchor": anchor_key_function(), "ours": ours_key_function()}

    print(f"python {sys.version.split()[0]}, {repeats} repeats")
    print(f"{'payload':<26}{'anchor µs':>11}{'ours µs':>9}{'anchor/ours':>13}{'budget':>8}")
    failed = []
    for name, shape in SHAPES.items():
        label, value = shape.label, shape.make()
        if contenders["anchor"](value) != contenders["ours"](value):
            raise SystemExit(f"({name}): the keys differ from Powertools' keys")
        # Each timed call gets a fresh copy decoded from this text (bench_keys.per_call_us).
        text = json.dumps(value, ensure_ascii=False)
        loops = {who: loops_for(f, text, target_s) for who, f in contenders.items()}
        samples: dict[str, list[float]] = {who: [] for who in contenders}
        for _ in range(repeats):  # interleaved, so drift hits both alike
            for who, function in contenders.items():
                samples[who].append(per_call_us(function, text, loops[who]))
        median = {who: statistics.median(times) for who, times in samples.items()}
        ratio = median["anchor"] / median["ours"]
        met = ratio >= BUDGET
        if not met:
            failed.append(name)
        print(
            f"({name}) {label:<22}{median['anchor']:>11.1f}{median['ours']:>9.1f}"
            f"{ratio:>12.2f}x{'>=' if met else '<':>5}{BUDGET}x"
        )
    if failed and not args.smoke:
        print(f"budget missed on: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
