"""Small helpers shared by the benchmarks: interleaved rounds, ratios within rounds, load.

The machine these numbers come from is shared: other jobs take the CPU away in bursts of
seconds.  Two things keep a comparison honest under that load:

* **rounds**: every contender runs a small chunk of work once per round, the order of
  the contenders rotated from one round to the next, so a burst of load hits all of them
  alike; a ratio is taken *within* each round, and the median and range of those ratios
  are quoted (never a ratio of two medians taken at different times);
* **CPU time** beside wall time: ``time.process_time()`` is what the process itself
  spent, which the other jobs move far less than the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple


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


class Timing(NamedTuple):
    """One chunk of work: µs per call of wall time and of the process's CPU time."""

    wall: float
    cpu: float


class Clock:
    """Times one chunk: ``with Clock() as clock: ...`` then ``clock.per_call(calls)``."""

    __slots__ = ("_cpu", "_wall", "cpu", "wall")

    def __enter__(self) -> Clock:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu = time.process_time() - self._cpu
        self.wall = time.perf_counter() - self._wall

    def per_call(self, calls: int) -> Timing:
        return Timing(self.wall / calls * 1e6, self.cpu / calls * 1e6)


def rotated_rounds(runs: dict[str, Callable[[], Timing]], rounds: int) -> dict[str, list[Timing]]:
    """Run every contender once per round, in an order rotated each round."""
    names = list(runs)
    samples: dict[str, list[Timing]] = {name: [] for name in names}
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(runs[name]())
    return samples


class Spread(NamedTuple):
    """The median and range of per-round values."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f} ({self.low:.2f}\u2013{self.high:.2f})"


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values))


def ratios(top: Sequence[Timing], bottom: Sequence[Timing], field: str = "cpu") -> Spread:
    """``top / bottom`` within each round (``field``: "cpu" or "wall"), median and range."""
    return spread([getattr(a, field) / getattr(b, field) for a, b in zip(top, bottom, strict=True)])


def paired(top: Sequence[float], bottom: Sequence[float]) -> Spread:
    """``top / bottom`` of two series of per-round values, within each round."""
    return spread([a / b for a, b in zip(top, bottom, strict=True)])


def median_of(samples: Sequence[Timing], field: str = "cpu") -> float:
    return statistics.median(getattr(sample, field) for sample in samples)


def load() -> str:
    """The load averages (1, 5, 15 minutes) as ``uptime`` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"
