"""OpenTelemetry traces and metrics for idempotent calls (extra: ``idempotency-async[otel]``).

::

    from idempotency_async.otel import Telemetry

    manager = Manager(store, Options(telemetry=Telemetry()))

Every call then gets a span carrying its outcome and its store round trips (as span events),
and the meter records calls by outcome, callback, store and wait durations.  Spans, attributes
and metrics are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import time
from importlib import metadata

try:
    from opentelemetry import metrics, trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "idempotency_async.otel needs the OpenTelemetry API: pip install 'idempotency-async[otel]'"
    ) from exc

from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Tracer, TracerProvider

from idempotency_async.otel import _names as names
from idempotency_async.otel._instruments import Instruments, create_instruments
from idempotency_async.otel._observer import BoundTelemetry
from idempotency_async.stores.base import Store

__all__ = ["Telemetry"]

_RECHECK_SECONDS = 1.0


class Telemetry:
    """OpenTelemetry instrumentation for the managers whose options carry it.

    ``tracer_provider`` / ``meter_provider``: the providers to use; by default the global
    ones.  While no global provider is set (the API's no-op), calls are not observed at all
    and cost next to nothing; once the application sets one, calls are observed from the
    next second on.  One instance may be shared by many managers.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self.tracer: Tracer | None = None
        self.instruments: Instruments | None = None
        self._next_check = 0.0
        self._version = _version()

    def bind(self, key_prefix: str, store: Store) -> BoundTelemetry:
        """The view of one manager (called by the manager at construction)."""
        return BoundTelemetry(self, key_prefix, store)

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
                self.instruments = create_instruments(meters, self._version)


def _is_noop(provider: MeterProvider) -> bool:
    # The API returns a private proxy class until a provider is set.
    return isinstance(provider, NoOpMeterProvider) or type(provider).__name__.startswith("_Proxy")


def _version() -> str | None:
    try:
        return metadata.version("idempotency-async")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return None
