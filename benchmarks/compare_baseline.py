"""Manager overhead now vs an earlier commit, side by side in one process.

    python benchmarks/compare_baseline.py fe463bc            # medians of 15 interleaved rounds
    python benchmarks/compare_baseline.py fe463bc --rounds 5

The earlier commit's package is exported with ``git archive`` into a temporary folder and
imported under another name, so both versions run in one interpreter, interleaved, on
the same payloads: machine noise hits both alike.  Reports µs per call for an
uncontended first call and a replay (MemoryStore, ``timeout=10``) and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

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


async def one_round(module: ModuleType, tag: str) -> tuple[float, float]:
    store: Any = module.MemoryStore()
    if hasattr(store, "max_records"):
        store.max_records = 10**7
    manager = module.Manager(store, module.Options(key_prefix="b"))

    async def callback() -> dict[str, int]:
        return {"ok": 1}

    payloads = [{"id": f"{tag}-{n}", "amount": n} for n in range(CALLS)]
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        for payload in payloads:
            await manager.execute(payload, callback, timeout=10)
        first = (time.perf_counter() - started) / CALLS * 1e6
        started = time.perf_counter()
        for payload in payloads:
            await manager.execute(payload, callback, timeout=10)
        replay = (time.perf_counter() - started) / CALLS * 1e6
    finally:
        gc.enable()
    return first, replay


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit, e.g. fe463bc")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import idempotency_async as current

    with tempfile.TemporaryDirectory() as folder:
        baseline = export_baseline(args.rev, Path(folder))
        results: dict[str, list[tuple[float, float]]] = {"baseline": [], "current": []}
        for number in range(args.rounds):
            results["baseline"].append(await one_round(baseline, f"b{number}"))
            results["current"].append(await one_round(current, f"c{number}"))
    for index, name in enumerate(("first call", "replay")):
        before = statistics.median(result[index] for result in results["baseline"])
        after = statistics.median(result[index] for result in results["current"])
        ratio = after / before
        print(f"{name:10}  {args.rev} {before:6.2f} µs  now {after:6.2f} µs  now/then {ratio:.3f}")


if __name__ == "__main__":
    asyncio.run(main())
