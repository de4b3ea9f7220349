"""The hook a manager calls when ``Options(telemetry=...)`` is set (no tracing imports here).

:class:`idempotency_async.otel.Telemetry` implements it with OpenTelemetry; another backend
can implement the two protocols.  A manager binds its instrumentation once, when it is
built: with one, every call runs inside the observer's synchronous span scope and every
round trip goes through the observer's store; without one, neither is there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Protocol, TypeAlias

from idempotency_async.events import EventKind
from idempotency_async.stores.base import Store

__all__ = ["Attributes", "Instrumentation", "Observed", "Observer"]

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
    """The store the manager calls, chosen when it is built (e.g. one that times each
    round trip while calls are observed)."""

    def span(self) -> AbstractContextManager[None]:
        """The scope of one idempotent call: entered before it starts, left when it ends
        (with its exception, if it raised).  Synchronous, so it costs the call no frame."""
        ...

    def ran(self, seconds: float) -> None:
        """The current call's callback ran for ``seconds``."""
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
