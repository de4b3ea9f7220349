"""Emission: one place where a lifecycle step becomes a log line, a telemetry event and a
call of the ``on_event`` hook."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from idempotency_async.events import Event, EventKind
from idempotency_async.instrumentation import Observer
from idempotency_async.options import Options

__all__ = ["Emitter"]

_log = logging.getLogger("idempotency_async")
_DEBUG = logging.DEBUG  # a global: read on every event
_cache = getattr(_log, "_cache", None)
_ENABLED: Final[dict[int, bool]] = _cache if isinstance(_cache, dict) else {}
"""What ``_log.isEnabledFor`` answered per level: logging's own cache, emptied in place
whenever a level changes (``setLevel``, ``logging.disable``), so a False in it is current.
Read here it costs no frame, where ``isEnabledFor`` costs one on every event; a level it
does not hold (or a logger without it) is asked of ``isEnabledFor``, which fills it."""


class Emitter:
    """Emits the events of one manager; a failing hook never changes a call's outcome."""

    __slots__ = ("_hook", "observer", "timed")

    def __init__(self, options: Options, observer: Observer | None) -> None:
        self._hook = options.on_event  # (frozen options: read once, not on every event)
        self.observer = observer
        self.timed = observer is not None or options.on_event is not None
        """Whether anything receives durations (an observer, an ``on_event`` hook): a call
        takes the time its callback starts only then (one float less per call in flight)."""

    def emit(
        self,
        kind: EventKind,
        key: str,
        *,
        duration: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        if _ENABLED.get(_DEBUG) is not False and _log.isEnabledFor(_DEBUG):
            _log.debug(
                "idempotency %s", kind, extra={"idempotency_event": kind, "idempotency_key": key}
            )
        if self.observer is not None:
            self.observer.event(kind, key, duration, error)
        hook = self._hook
        if hook is None:
            return
        try:
            hook(Event(kind, key, duration, error))
        except Exception:
            # Metrics must never change the outcome of a call.
            _log.exception("on_event hook failed", extra={"idempotency_event": kind})

    def ran(self, started: float, loop: asyncio.AbstractEventLoop) -> None:
        """A callback that started at loop time ``started`` ended (for telemetry)."""
        if self.observer is not None:
            self.observer.ran(loop.time() - started)

    def waited(self, seconds: float) -> None:
        """A call spent ``seconds`` waiting on another holder of its key."""
        if self.observer is not None:
            self.observer.waited(seconds)
