"""The fault simulator's command line: ``python -m idempotency_async.testing --seed N``.

Runs scenarios against ``MemoryStore`` on a virtual clock; ``--seed`` reruns one scenario
(the command a failure prints), ``--verbose`` adds its full trace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from idempotency_async.stores.memory import MemoryStore
from idempotency_async.testing._scenario import generate
from idempotency_async.testing._simulate import SimulationFailure, simulate, trace_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m idempotency_async.testing",
        description="Run fault-simulator scenarios against MemoryStore on a virtual clock.",
    )
    parser.add_argument("--seed", type=int, help="run this one seed and print its scenario")
    parser.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1")
    parser.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--scale", type=float, default=1.0, help="duration scale of scenarios")
    parser.add_argument("--workers", type=int, default=1, help="processes to spread seeds over")
    parser.add_argument("--verbose", action="store_true", help="print the trace of --seed")
    args = parser.parse_args(argv)
    if args.seed is not None:
        print(generate(args.seed, scale=args.scale).describe())
        seeds: Iterable[int] = [args.seed]
    else:
        seeds = range(args.start, args.start + args.seeds)
    try:
        if args.verbose and args.seed is not None:
            print(trace_text(args.seed, args.scale))
        report = simulate(MemoryStore, seeds, scale=args.scale, workers=args.workers)
    except SimulationFailure as failure:
        print(failure, file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
