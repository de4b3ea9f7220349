"""Typed events for metrics and tracing, delivered to ``Options(on_event=...)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["Event", "EventHook", "EventKind"]

EventKind: TypeAlias = Literal[
    "claimed",
    "completed",
    "replayed",
    "cache_hit",
    "rejected_in_progress",
    "released",
    "release_failed",
    "lease_lost",
    "response_not_stored",
    "joined",
    "cut_off",
    "record_unreadable",
    "renew_failed",
    "transaction_not_run",
    "step_recorded",
    "step_replayed",
]


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one key.

    ``kind`` is one of :data:`EventKind`; ``error`` is set for ``release_failed``,
    ``lease_lost`` and ``response_not_stored`` (why: ``ResponseTooLargeError``,
    ``ResponseEncodingError``, a response codec's error, or ``ResponseNotStoredError``
    when the store could not keep a response the manager encoded); ``duration`` is the callback's
    run time in seconds for ``completed``.  ``cut_off``: the callback was cut off before its
    lease ended and the caller got ``DeadlineExceededError``.  ``record_unreadable``: the
    store holds a record for the key whose control fields (status, expiry, lease, owner)
    are malformed — a foreign or damaged record; ``error`` is the
    ``InconsistentStateError`` the caller got.  Delete the record to free the key.
    ``renew_failed``: a lease renewal (``Options(renewal=Renewal(...))``) got no answer; ``error``
    says why (a ``TimeoutError`` when it was abandoned unanswered at the next interval), and
    the next renewal goes out at the next interval.  A renewal the store refused is
    ``lease_lost``.  ``transaction_not_run``: an HTTP route that declares a
    transaction returned a response without running it (nothing was recorded; the
    middleware answered 500 instead); ``error`` is a ``ConfigError`` naming the route.
    """

    kind: EventKind
    key: str
    duration: float | None = None
    error: BaseException | None = None


EventHook: TypeAlias = Callable[[Event], None]
