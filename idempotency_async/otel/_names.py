"""Every span, attribute and metric name this package emits (listed in docs/observability.md).

There is no OpenTelemetry semantic convention for idempotency: database conventions are used
where they fit (``db.*``, ``error.type``) and the ``idempotency.*`` namespace for the rest.
"""

from __future__ import annotations

from typing import Final

SCOPE: Final = "idempotency_async"
"""Instrumentation scope of the tracer and the meter."""

# Span and span events
CALL_SPAN: Final = "idempotency"
"""Name of the call span; ``idempotency <key prefix>`` when the prefix is not empty."""
STORE_EVENT: Final = "idempotency.store."
"""Prefix of a store round trip's span event: ``idempotency.store.claim`` etc."""
EVENT: Final = "idempotency."
"""Prefix of a lifecycle event's span event: ``idempotency.claimed`` etc."""

# Attributes
KEY: Final = "idempotency.key"
KEY_PREFIX: Final = "idempotency.key_prefix"
OUTCOME: Final = "idempotency.outcome"
CALLBACK_DURATION: Final = "idempotency.callback.duration"
WAIT_DURATION: Final = "idempotency.wait.duration"
STORE_DURATION: Final = "idempotency.store.duration"
STORE_RESULT: Final = "idempotency.store.result"
DB_SYSTEM: Final = "db.system.name"
DB_OPERATION: Final = "db.operation.name"
DB_COLLECTION: Final = "db.collection.name"
ERROR_TYPE: Final = "error.type"

# Metrics (histograms in seconds)
CALLS: Final = "idempotency.calls"
CALLBACK_METRIC: Final = "idempotency.callback.duration"
STORE_METRIC: Final = "idempotency.store.duration"
WAIT_METRIC: Final = "idempotency.wait.duration"

DURATION_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# Outcomes: how a call ended (``idempotency.outcome``)
CLAIMED: Final = "claimed"
REPLAYED: Final = "replayed"
CACHE_HIT: Final = "cache_hit"
JOINED: Final = "joined"
REJECTED_IN_PROGRESS: Final = "rejected_in_progress"
REJECTED_MISMATCH: Final = "rejected_payload_mismatch"
"""A duplicate whose payload differs from the first call's (``PayloadValidationError``)."""
NOT_STORED: Final = "replayed_not_stored"
"""A duplicate of a call whose response was not stored (``ResponseNotStoredError``)."""
FAILED: Final = "failed"
CUT_OFF: Final = "cut_off"
LEASE_LOST: Final = "lease_lost"
ERROR: Final = "error"
CANCELLED: Final = "cancelled"
UNPROTECTED: Final = "unprotected"

TERMINAL_EVENTS: Final = frozenset(
    {REPLAYED, CACHE_HIT, JOINED, REJECTED_IN_PROGRESS, CUT_OFF, LEASE_LOST}
)
"""Events that decide a call's outcome on their own (the last one wins)."""

EXPECTED_OUTCOMES: Final = frozenset({REJECTED_IN_PROGRESS, REJECTED_MISMATCH, NOT_STORED})
"""Outcomes raising an exception that are answers, not errors: the span keeps an unset
status and no ``error.type`` (an HTTP 409, 422 or not-stored replay is not a failure);
so does a ``cache_hit`` or ``replayed`` call whose response was not stored."""

SPAN_EVENTS: Final = frozenset({"released", "release_failed", "response_not_stored"})
"""Lifecycle events added to the call span: those its outcome does not tell."""


def error_type(exc: BaseException) -> str:
    """``error.type``: the exception's fully qualified class name (builtins unqualified)."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
