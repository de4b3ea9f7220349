"""Async-first idempotency: run a side effect once per key and replay its result to duplicates."""

from idempotency_async import errors
from idempotency_async._call import Call
from idempotency_async._replayed import ReplayErrors
from idempotency_async._stored_redaction import Redaction
from idempotency_async.deadlines import current_deadline, deadline
from idempotency_async.decorators import idempotent_function
from idempotency_async.downstream import downstream_key
from idempotency_async.events import Event, EventKind
from idempotency_async.manager import Manager
from idempotency_async.options import LocalCache, Options, Renewal, ResponseCodec, Wait
from idempotency_async.record import Record, Status
from idempotency_async.steps import step
from idempotency_async.stores.base import Store
from idempotency_async.stores.memory import MemoryStore

__all__ = [
    "Call",
    "Event",
    "EventKind",
    "LocalCache",
    "Manager",
    "MemoryStore",
    "Options",
    "Record",
    "Redaction",
    "Renewal",
    "ReplayErrors",
    "ResponseCodec",
    "Status",
    "Store",
    "Wait",
    "current_deadline",
    "deadline",
    "downstream_key",
    "errors",
    "idempotent_function",
    "step",
]
