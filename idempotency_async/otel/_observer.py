"""One observed call: its span, its outcome, and the metrics it records when it ends."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from idempotency_async.errors import (
    AlreadyInProgressError,
    PayloadValidationError,
    ResponseNotStoredError,
)
from idempotency_async.events import EventKind
from idempotency_async.instrumentation import Attributes, take_call_attributes
from idempotency_async.otel import _names as names
from idempotency_async.otel._providers import Providers
from idempotency_async.otel._store import ObservedStore, system_of
from idempotency_async.stores.base import Store

__all__ = ["BoundTelemetry"]


@dataclass(slots=True)
class _Call:
    """What one call has shown so far."""

    span: Span | None
    key: str | None = None
    claimed: bool = False
    outcome: str | None = None
    """Set by a terminal event (see ``names.TERMINAL_EVENTS``)."""
    callback_duration: float | None = None
    waited: float | None = None
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


_CURRENT: ContextVar[_Call | None] = ContextVar("idempotency_async_otel_call", default=None)


class BoundTelemetry:
    """A :class:`~idempotency_async.otel.Telemetry` bound to one manager: its key prefix
    and its store."""

    def __init__(self, providers: Providers, key_prefix: str, store: Store) -> None:
        self.providers = providers
        self.store: Store = ObservedStore(store, self)
        # The providers' own method: one call, not two, per unobserved call.
        self.active: Callable[[], bool] = providers.active
        self._span_name = f"{names.CALL_SPAN} {key_prefix}" if key_prefix else names.CALL_SPAN
        self._prefix: dict[str, AttributeValue] = {names.KEY_PREFIX: key_prefix}
        self._store_attributes: dict[str, AttributeValue] = {
            names.KEY_PREFIX: key_prefix,
            names.DB_SYSTEM: system_of(store),
        }
        table = getattr(store, "table_name", None)
        if isinstance(table, str):
            self._store_attributes[names.DB_COLLECTION] = table

    # ------------------------------------------------------------------ the call

    def span(self) -> _CallScope:
        """The scope of one call: its span and metrics, when calls are observed."""
        return _CallScope(self)

    def _begin(self) -> tuple[_Call, Token[_Call | None], object]:
        providers = self.providers
        extra = take_call_attributes()
        span = None
        tracer = providers.tracer
        if tracer is not None:
            attributes: dict[str, AttributeValue] = dict(self._prefix)
            if extra:
                attributes.update(extra)
            span = tracer.start_span(self._span_name, kind=SpanKind.INTERNAL, attributes=attributes)
            if not span.is_recording():
                span = None
        call = _Call(span)
        token = _CURRENT.set(call)
        # The callback's own spans (and a driver's client spans) nest under the call span.
        attached = None if span is None else otel_context.attach(trace.set_span_in_context(span))
        return call, token, attached

    def _end(self, call: _Call, failure: BaseException | None) -> None:
        outcome = _outcome_of(call, failure)
        metric: dict[str, AttributeValue] = {**self._prefix, names.OUTCOME: outcome}
        if isinstance(failure, _EXPECTED):
            failure = None  # an answer to the caller (HTTP 409, 422, not stored), not an error
        if failure is not None:
            metric[names.ERROR_TYPE] = names.error_type(failure)
        instruments = self.providers.instruments
        if instruments is not None:
            instruments.calls.add(1, metric)
            if call.callback_duration is not None:
                instruments.callback.record(call.callback_duration, metric)
            if call.waited is not None:
                instruments.wait.record(call.waited, metric)
        span = call.span
        if span is None:
            return
        span.set_attribute(names.OUTCOME, outcome)
        if call.key is not None:
            span.set_attribute(names.KEY, call.key)
        if call.callback_duration is not None:
            span.set_attribute(names.CALLBACK_DURATION, call.callback_duration)
        if call.waited is not None:
            span.set_attribute(names.WAIT_DURATION, call.waited)
        if call.attributes:
            span.set_attributes(call.attributes)
        if failure is not None:
            span.set_attribute(names.ERROR_TYPE, names.error_type(failure))
            if outcome in (names.FAILED, names.ERROR):
                span.record_exception(failure)
            span.set_status(Status(StatusCode.ERROR, str(failure) or type(failure).__name__))
        span.end()

    # ------------------------------------------------------------------ during the call

    def event(
        self, kind: EventKind, key: str, duration: float | None, error: BaseException | None
    ) -> None:
        call = _CURRENT.get()
        if call is None:
            return
        call.key = key
        if kind == "claimed":
            call.claimed = True
        elif kind in names.TERMINAL_EVENTS:
            call.outcome = kind
        # Events the outcome already tells are not repeated as span events (each costs
        # the SDK microseconds).
        if call.span is not None and kind in names.SPAN_EVENTS:
            attributes: dict[str, AttributeValue] = {}
            if error is not None:
                attributes[names.ERROR_TYPE] = names.error_type(error)
            call.span.add_event(names.EVENT + kind, attributes)

    def ran(self, seconds: float) -> None:
        call = _CURRENT.get()
        if call is not None:
            call.callback_duration = seconds

    def waited(self, seconds: float) -> None:
        call = _CURRENT.get()
        if call is not None:
            call.waited = (call.waited or 0.0) + seconds

    def annotate(self, attributes: Attributes) -> None:
        call = _CURRENT.get()
        if call is not None:
            call.attributes.update(attributes)
            return
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(attributes)

    def store_round_trip(
        self,
        operation: str,
        key: str,
        seconds: float,
        started_ns: int,
        result: str | None,
        failure: BaseException | None,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            **self._store_attributes,
            names.DB_OPERATION: operation,
        }
        if failure is not None:
            attributes[names.ERROR_TYPE] = names.error_type(failure)
        instruments = self.providers.instruments
        if instruments is not None:
            instruments.store.record(seconds, attributes)
        call = _CURRENT.get()
        if call is None:
            return
        if call.key is None:
            call.key = key
        if call.span is None:
            return
        event: dict[str, AttributeValue] = {
            names.DB_OPERATION: operation,
            names.STORE_DURATION: seconds,
        }
        if result is not None:
            event[names.STORE_RESULT] = result
        if failure is not None:
            event[names.ERROR_TYPE] = attributes[names.ERROR_TYPE]
        call.span.add_event(names.STORE_EVENT + operation, event, timestamp=started_ns)


_EXPECTED: Final = (AlreadyInProgressError, PayloadValidationError, ResponseNotStoredError)
"""Exceptions that are outcomes (``names.EXPECTED_OUTCOMES``), never an ERROR span."""


class _CallScope:
    """One call's scope (``BoundTelemetry.span``): nothing while calls are not observed."""

    __slots__ = ("_begun", "_bound")

    def __init__(self, bound: BoundTelemetry) -> None:
        self._bound = bound
        self._begun: tuple[_Call, Token[_Call | None], object] | None = None

    def __enter__(self) -> None:
        if self._bound.active():
            self._begun = self._bound._begin()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        failure: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        begun = self._begun
        if begun is None:
            return
        call, token, attached = begun
        if attached is not None:
            otel_context.detach(attached)  # type: ignore[arg-type]
        _CURRENT.reset(token)
        self._bound._end(call, failure)


def _outcome_of(call: _Call, failure: BaseException | None) -> str:
    if call.outcome is not None:
        return call.outcome
    if isinstance(failure, AlreadyInProgressError):
        return names.REJECTED_IN_PROGRESS
    if isinstance(failure, PayloadValidationError):
        return names.REJECTED_MISMATCH
    if isinstance(failure, ResponseNotStoredError):
        return names.NOT_STORED
    if failure is None:
        return names.CLAIMED if call.claimed else names.UNPROTECTED
    if not isinstance(failure, Exception):
        return names.CANCELLED
    return names.FAILED if call.claimed else names.ERROR
