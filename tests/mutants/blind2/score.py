"""Score the fault simulator on the second blind set: python tests/mutants/blind2/score.py

Each patch of this folder is applied to a copy of the project and run against the
simulator *on the store it mutates*: the virtual-time run on ``MemoryStore`` for code that
does not depend on the store (and for ``stores/memory.py``), the real-time runs of the
test suite for a store's own code (DynamoDB on moto through both transports, Redis by the
client's and the server's clock, Postgres and its transactional simulator).  A mutant the
simulator misses is then run against the project's tests of the code it mutates
("sim+tests").  The unpatched package runs every target first; it must pass.

    python tests/mutants/blind2/score.py [--seeds 2000] [--live-seeds 80] [--jobs 2]
        [--only 13,15] [--json scores.json]

Not a test: some are missed (docs/guarantees.md, "Mutants written without seeing the
simulator").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _scoring import LIVE_EXCLUDE, Target, memory, score  # noqa: E402

_SIM = "tests/test_simulator.py::"
_LIGHT = "tests/test_dynamodb_light.py::test_the_light_store_keeps_the_guarantee_in_real_time"
_PG = "tests/test_postgres_manager.py::test_postgres_store_keeps_the_guarantee_in_real_time"
_TX = "tests/test_simulator_transactions.py"

# The test files of the code each range of mutants changes (for sim+tests).
_TESTS: dict[range, tuple[str, ...]] = {
    range(1, 6): ("test_renewal.py", "test_renewal_doors.py", "test_renewal_clients.py"),
    range(6, 10): (
        "test_manager_call.py",
        "test_execute_door.py",
        "test_lifecycle_edges.py",
        "test_manager.py",
    ),
    range(10, 13): (
        "test_http_gate.py",
        "test_http_exchange.py",
        "test_http_lifecycle.py",
        "test_http_edges.py",
        "test_http_integrations.py",
    ),
    range(13, 17): ("test_dynamodb_light.py", "test_dynamodb_store.py", "test_dynamodb_manager.py"),
    range(17, 19): ("test_memory_store.py", "test_store_contract.py", "test_conformance_kit.py"),
    range(19, 21): ("test_redis_store.py", "test_redis_manager.py"),
    range(21, 23): (
        "test_postgres_store.py",
        "test_postgres_manager.py",
        "test_postgres_transactions.py",
    ),
    range(23, 25): ("test_cutoff.py", "test_lifecycle_edges.py", "test_manager.py"),
    range(25, 27): ("test_lifecycle_edges.py", "test_manager.py"),
    range(27, 28): ("test_manager_replay.py", "test_manager.py"),
    range(28, 31): ("test_aws_lambda.py", "test_lambda_batch_deadline.py"),
}


def _number(patch: Path) -> int:
    return int(patch.stem.split("_", 1)[0])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/mutants/blind2/score.py")
    parser.add_argument("--seeds", type=int, default=2000, help="MemoryStore seeds per mutant")
    parser.add_argument(
        "--live-seeds", type=int, default=0, help="seeds per real-time run (default: CI's)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants scored at once")
    parser.add_argument("--only", default="", help="comma-separated mutant numbers")
    parser.add_argument("--json", type=Path, help="write the scores here")
    parser.add_argument(
        "--live-exclude",
        default="",
        help="generator features the real-time runs leave out (comma-separated)",
    )
    args = parser.parse_args(argv)
    LIVE_EXCLUDE.extend(name for name in args.live_exclude.split(",") if name)

    def live(name: str, tests: tuple[str, ...], var: str, ci: int) -> Target:
        seeds = args.live_seeds or ci
        return Target(f"{name} ({seeds} seeds)", tests, var, seeds)

    dynamodb = live(
        "DynamoDB (moto)",
        (_SIM + "test_dynamodb_store_keeps_the_guarantee_in_real_time",),
        "SIM_LIVE_SEEDS",
        80,
    )
    light = live("DynamoDB light", (_LIGHT,), "SIM_LIGHT_SEEDS", 40)
    redis = live(
        "Redis",
        (
            _SIM + "test_redis_store_keeps_the_guarantee_in_real_time",
            _SIM + "test_redis_store_keeps_the_guarantee_by_its_server_clock",
        ),
        "SIM_REDIS_SEEDS",
        70,
    )
    postgres = live("Postgres", (_PG,), "SIM_POSTGRES_SEEDS", 70)
    transactions = live("Postgres transactional", (_TX,), "SIM_TX_SEEDS", 120)

    def targets_for(patch: Path) -> Sequence[Target]:
        number = _number(patch)
        if number in (13, 14):
            return (light,)
        if number in (15, 16):
            return (dynamodb, light)
        if number in (19, 20):
            return (redis,)
        if number in (21, 22):
            return (postgres, transactions)
        return (memory(args.seeds),)

    def tests_for(patch: Path) -> Sequence[str]:
        number = _number(patch)
        files = next(files for numbers, files in _TESTS.items() if number in numbers)
        return tuple(f"tests/{name}" for name in files)

    patches = sorted(HERE.glob("*.patch"))
    if args.only:
        chosen = {int(n) for n in args.only.split(",")}
        patches = [p for p in patches if _number(p) in chosen]
    return score(patches, targets_for, tests_for, jobs=args.jobs, report=args.json)


if __name__ == "__main__":
    sys.exit(main())
