"""The tracer and the meter's instruments, resolved from the providers once they are set.

One :class:`Providers` per :class:`~idempotency_async.otel.Telemetry`, shared by every
manager it is bound to.  The observer imports this module, never ``otel`` itself, so the
package reads top-down: ``_names`` ← ``_providers``, ``_store`` ← ``_observer`` ← ``otel``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, MeterProvider, NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Tracer, TracerProvider

from idempotency_async.otel import _names as names

__all__ = ["Instruments", "Providers"]

_RECHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Instruments:
    """The meter's instruments, created once a meter provider is there."""

    calls: Counter
    callback: Histogram
    store: Histogram
    wait: Histogram


class Providers:
    """The tracer and instruments of the given providers (the global ones by default),
    each ``None`` until a real provider is there."""

    def __init__(
        self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self.tracer: Tracer | None = None
        self.instruments: Instruments | None = None
        self._next_check = 0.0
        self._version = _version()

    def active(self) -> bool:
        """Whether calls are observed: a tracer or a meter provider is really there."""
        if self.tracer is not None and self.instruments is not None:
            return True
        now = time.monotonic()
        if now >= self._next_check:
            # The global providers can be set later than the managers are built; a check
            # costs microseconds, so it runs at most once a second.
            self._next_check = now + _RECHECK_SECONDS
            self._resolve()
        return self.tracer is not None or self.instruments is not None

    def _resolve(self) -> None:
        if self.tracer is None:
            tracers = self._tracer_provider or trace.get_tracer_provider()
            if not isinstance(tracers, ProxyTracerProvider | NoOpTracerProvider):
                self.tracer = tracers.get_tracer(names.SCOPE, self._version)
        if self.instruments is None:
            meters = self._meter_provider or metrics.get_meter_provider()
            if not _is_noop(meters):
                self.instruments = _instruments(meters, self._version)


def _is_noop(provider: MeterProvider) -> bool:
    # The API returns a private proxy class until a provider is set.
    return isinstance(provider, NoOpMeterProvider) or type(provider).__name__.startswith("_Proxy")


def _instruments(provider: MeterProvider, version: str | None) -> Instruments:
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


def _version() -> str | None:
    try:
        return metadata.version("idempotency-async")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return None
