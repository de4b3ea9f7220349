"""Record stores: the :class:`Store` protocol and its implementations."""

from idempotency_async.stores.base import Store
from idempotency_async.stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]
