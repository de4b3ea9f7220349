"""Small helpers shared by the benchmarks: interleaved repeats and medians."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--repeats", type=int, default=None)
    return parser.parse_args()


def interleaved(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Run each measurement ``repeats`` times, round-robin, and return the medians."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}
