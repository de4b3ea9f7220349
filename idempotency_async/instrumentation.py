"""The hook a manager calls when ``Options(telemetry=...)`` is set (no tracing imports here).

:class:`idempotency_async.otel.Telemetry` implements it with OpenTelemetry; another backend
can implement the two protocols.  A manager without telemetry never touches this module's
objects, so an uninstrumented call pays one ``is None`` test at construction, not per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Protocol, TypeAlias, TypeVar

from idempotency_async.events import EventKind
from idempotency_async.stores.base import Store

__all__ = ["Attributes", "Instrumentation", "Observed", "Observer"]

T = TypeVar("T")

Attributes: TypeAlias = Mapping[str, str | bool | int | float]
"""Span attributes an integration adds (OpenTelemetry attribute values)."""

# A one-item list, emptied by the call that takes it: calls nested in that call's callback
# must not inherit its route or batch item.
_CALL_ATTRIBUTES: ContextVar[list[Attributes] | None] = ContextVar(
    "idempotency_async_call_attributes", default=None
)


class Observer(Protocol):
    """One manager's view of an :class:`Instrumentation` (what ``bind`` returns)."""

    store: Store
    """The store the manager calls once calls are observed (e.g. one that times each
    round trip); until then it calls its own."""

    def active(self) -> bool:
        """Whether calls are observed now.  While not, the manager runs them exactly as an
        unobserved manager does; once it is, it stays so."""
        ...

    async def call(
        self,
        run: Callable[[Callable[[], Awaitable[T]]], Awaitable[T]],
        callback: Callable[[], Awaitable[T]],
    ) -> T:
        """Observe one idempotent call: ``run(callback)`` runs it; the observer may wrap
        ``callback`` (to time it) before passing it on."""
        ...

    def event(
        self, kind: EventKind, key: str, duration: float | None, error: BaseException | None
    ) -> None:
        """Something happened to the current call (the same events ``on_event`` gets)."""
        ...

    def waited(self, seconds: float) -> None:
        """The current call spent ``seconds`` waiting on another holder of its key."""
        ...

    def annotate(self, attributes: Attributes) -> None:
        """Add ``attributes`` to the current span (the framework's, between calls)."""
        ...


class Observed(Protocol):
    """What the helpers below take: a manager, whose observer is set when it has telemetry."""

    @property
    def observer(self) -> Observer | None: ...


class Instrumentation(Protocol):
    """What ``Options(telemetry=...)`` accepts; each manager binds it once."""

    def bind(self, key_prefix: str, store: Store) -> Observer: ...


def observer_of(manager: Observed) -> Observer | None:
    return manager.observer


@contextlib.contextmanager
def call_attributes(manager: Observed, attributes: Attributes) -> Iterator[None]:
    """Attributes the next calls of ``manager`` in this context put on their call spans.

    For integrations that know more than the payload (route template, batch item id).
    Free when the manager has no telemetry.
    """
    if manager.observer is None:
        yield
        return
    token = _CALL_ATTRIBUTES.set([attributes])
    try:
        yield
    finally:
        _CALL_ATTRIBUTES.reset(token)


def take_call_attributes() -> Attributes | None:
    """The attributes set by :func:`call_attributes` for the call starting now (once)."""
    pending = _CALL_ATTRIBUTES.get()
    return pending.pop() if pending else None


def annotate(manager: Observed, attributes: Attributes) -> None:
    """Add ``attributes`` to the current span when ``manager`` has telemetry."""
    observer = manager.observer
    if observer is not None:
        observer.annotate(attributes)
