"""``POWERTOOLS_IDEMPOTENCY_DISABLED``: the switch that turns idempotency off for a process."""

from __future__ import annotations

import os

__all__ = ["DISABLED_ENV", "disabled_by_environment"]

DISABLED_ENV = "POWERTOOLS_IDEMPOTENCY_DISABLED"
_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})


def disabled_by_environment() -> bool:
    """Whether ``POWERTOOLS_IDEMPOTENCY_DISABLED`` is set to an extended true (1, true, yes,
    on, y; any case), read when a manager is built."""
    return os.environ.get(DISABLED_ENV, "").strip().lower() in _TRUE_WORDS
