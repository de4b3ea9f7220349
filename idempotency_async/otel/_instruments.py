"""What the observer reads from a :class:`~idempotency_async.otel.Telemetry`: the tracer
and the meter's instruments as resolved so far.

The observer and the store wrapper import this module, never ``otel`` itself, so the
package reads top-down: ``_names`` ← ``_instruments`` ← ``_store`` ← ``_observer`` ← ``otel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from opentelemetry.metrics import Counter, Histogram, MeterProvider
from opentelemetry.trace import Tracer

from idempotency_async.otel import _names as names

__all__ = ["Instruments", "Providers", "create_instruments"]


class Providers(Protocol):
    """What a bound view reads from the :class:`~idempotency_async.otel.Telemetry` it
    belongs to (which implements it): its tracer and instruments, each ``None`` while
    no provider is set, and whether calls are observed at all."""

    @property
    def tracer(self) -> Tracer | None: ...

    @property
    def instruments(self) -> Instruments | None: ...

    def active(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Instruments:
    """The meter's instruments, created once a meter provider is there."""

    calls: Counter
    callback: Histogram
    store: Histogram
    wait: Histogram


def create_instruments(provider: MeterProvider, version: str | None) -> Instruments:
    """The instruments of ``provider``'s meter for this library (``version``: ours)."""
    meter = provider.get_meter(names.SCOPE, version)

    def histogram(name: str, description: str) -> Histogram:
        return meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=names.DURATION_BUCKETS,
        )

    return Instruments(
        calls=meter.create_counter(
            names.CALLS, unit="{call}", description="Idempotent calls, by outcome"
        ),
        callback=histogram(names.CALLBACK_METRIC, "Run time of callbacks that ran"),
        store=histogram(names.STORE_METRIC, "Store round trips, by operation"),
        wait=histogram(names.WAIT_METRIC, "Time calls spent waiting on another holder"),
    )
