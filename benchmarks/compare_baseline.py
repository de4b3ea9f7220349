"""Manager overhead now vs an earlier commit, side by side in one process.

    python benchmarks/compare_baseline.py fe463bc            # medians of 15 interleaved rounds
    python benchmarks/compare_baseline.py fe463bc --rounds 5

The earlier commit's package is exported with ``git archive`` into a temporary folder and
imported under another name, so both versions run in one interpreter, in rounds whose
order alternates, on the same kind of payloads: machine noise hits both alike.  Reports CPU
µs per call (``time.process_time``; wall time beside) for an uncontended first call and a
replay (MemoryStore, default options, ``timeout=10``, a fresh payload per call) and the
ratio now/then within rounds (median and range).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from _stats import Clock, Timing, load, median_of, ratios

CALLS = 5000


def export_baseline(rev: str, into: Path) -> ModuleType:
    archive = subprocess.run(
        ["git", "archive", rev, "idempotency_async"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / "idempotency_baseline"
    (into / "idempotency_async").rename(package)
    for source in package.rglob("*.py"):
        text = source.read_text()
        source.write_text(text.replace("idempotency_async", "idempotency_baseline"))
    sys.path.insert(0, str(into))
    return importlib.import_module("idempotency_baseline")


async def one_round(module: ModuleType, tag: str) -> tuple[Timing, Timing]:
    store: Any = module.MemoryStore()
    if hasattr(store, "max_records"):
        store.max_records = 10**7
    manager = module.Manager(store, module.Options(key_prefix="b"))

    async def callback() -> dict[str, int]:
        return {"ok": 1}

    payloads = [{"id": f"{tag}-{n}", "amount": n} for n in range(CALLS)]
    again = [{"id": f"{tag}-{n}", "amount": n} for n in range(CALLS)]  # fresh copies
    gc.collect()
    gc.disable()
    try:
        with Clock() as clock:
            for payload in payloads:
                await manager.execute(payload, callback, timeout=10)
        first = clock.per_call(CALLS)
        with Clock() as clock:
            for payload in again:
                await manager.execute(payload, callback, timeout=10)
        replay = clock.per_call(CALLS)
    finally:
        gc.enable()
    return first, replay


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit, e.g. fe463bc")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import idempotency_async as current

    print(f"{load()}")
    with tempfile.TemporaryDirectory() as folder:
        baseline = export_baseline(args.rev, Path(folder))
        results: dict[str, list[tuple[Timing, Timing]]] = {"baseline": [], "current": []}
        for number in range(args.rounds):
            order = [("baseline", baseline), ("current", current)]
            for name, module in order[number % 2 :] + order[: number % 2]:
                results[name].append(await one_round(module, f"{name[0]}{number}"))
    for index, name in enumerate(("first call", "replay")):
        then = [result[index] for result in results["baseline"]]
        now = [result[index] for result in results["current"]]
        print(
            f"{name:10}  {args.rev} {median_of(then):6.2f} µs  now {median_of(now):6.2f} µs CPU"
            f" (wall {median_of(then, 'wall'):.2f}, {median_of(now, 'wall'):.2f})"
            f"  now/then within rounds: CPU {ratios(now, then)}, wall"
            f" {ratios(now, then, 'wall').median:.3f}"
        )
    print(f"after: {load()}")


if __name__ == "__main__":
    asyncio.run(main())
