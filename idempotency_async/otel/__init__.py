"""OpenTelemetry traces and metrics for idempotent calls (extra: ``idempotency-async[otel]``).

::

    from idempotency_async.otel import Telemetry

    manager = Manager(store, Options(telemetry=Telemetry()))

Every call then gets a span carrying its outcome and its store round trips (as span events),
and the meter records calls by outcome, callback, store and wait durations.  Spans, attributes
and metrics are listed in ``docs/observability.md``.
"""

from __future__ import annotations

try:
    import opentelemetry.trace  # noqa: F401 - checks that the extra is installed
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "idempotency_async.otel needs the OpenTelemetry API: pip install 'idempotency-async[otel]'"
    ) from exc

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from idempotency_async.otel._observer import BoundTelemetry
from idempotency_async.otel._providers import Providers
from idempotency_async.stores.base import Store

__all__ = ["Telemetry"]


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
        self._providers = Providers(tracer_provider, meter_provider)

    def bind(self, key_prefix: str, store: Store) -> BoundTelemetry:
        """The view of one manager (called by the manager at construction)."""
        return BoundTelemetry(self._providers, key_prefix, store)

    def active(self) -> bool:
        """Whether calls are observed: a tracer or a meter provider is really there."""
        return self._providers.active()
