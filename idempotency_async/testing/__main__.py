"""The fault simulator's command line: ``python -m idempotency_async.testing --seed N``.

Runs scenarios against ``MemoryStore`` on a virtual clock; ``--seed`` reruns one scenario
(the command a failure prints), ``--scenario '<json>'`` runs a scenario given as JSON (the
reproducer a shrunk failure prints), ``--verbose`` adds its full trace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from idempotency_async.stores.memory import MemoryStore
from idempotency_async.testing._scenario import FEATURES, Scenario, generate
from idempotency_async.testing._simulate import (
    SimulationFailure,
    run_one,
    simulate,
    trace_text,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m idempotency_async.testing",
        description="Run fault-simulator scenarios against MemoryStore on a virtual clock.",
    )
    parser.add_argument("--seed", type=int, help="run this one seed and print its scenario")
    parser.add_argument("--scenario", help="run this scenario (JSON, as a failure prints it)")
    parser.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1")
    parser.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--scale", type=float, default=1.0, help="duration scale of scenarios")
    parser.add_argument("--workers", type=int, default=1, help="processes to spread seeds over")
    parser.add_argument(
        "--exclude",
        default="",
        help=f"comma-separated generator features to leave out: {', '.join(sorted(FEATURES))}",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="generate seeds as a real-time run does (what a real-time failure's rerun prints)",
    )
    parser.add_argument(
        "--server-clock",
        action="store_true",
        help="with --live: the scenarios of a store judging by its own clock",
    )
    parser.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    parser.add_argument("--verbose", action="store_true", help="print the trace of one scenario")
    args = parser.parse_args(argv)
    exclude = tuple(name for name in args.exclude.split(",") if name)
    if args.scenario is not None:
        scenario = Scenario.from_json(args.scenario)
        print(scenario.describe())
        if args.verbose:
            print(trace_text(scenario))
        violations = run_one(scenario)
        if violations:
            text = "\n".join(f"  - {violation}" for violation in violations)
            print(f"the scenario broke the guarantee:\n{text}", file=sys.stderr)
            return 1
        print("the scenario kept the guarantee")
        return 0
    if args.seed is not None and args.live:
        # A real-time run's scenario, run here on MemoryStore in virtual time.
        scenario = generate(
            args.seed,
            scale=args.scale,
            live=True,
            exclude=exclude,
            server_clock=args.server_clock or None,
        )
        return main(["--scenario", scenario.to_json(), *(["--verbose"] if args.verbose else [])])
    if args.seed is not None:
        scenario = generate(args.seed, scale=args.scale, exclude=exclude)
        print(scenario.describe())
        if args.verbose:
            print(trace_text(scenario))
        seeds: Iterable[int] = [args.seed]
    else:
        seeds = range(args.start, args.start + args.seeds)
    try:
        report = simulate(
            MemoryStore,
            seeds,
            scale=args.scale,
            workers=args.workers,
            exclude=exclude,
            shrink=not args.no_shrink,
        )
    except SimulationFailure as failure:
        print(failure, file=sys.stderr)
        return 1
    print(report.summary(coverage=args.seed is None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
