"""The library's own logging, silenced while simulated scenarios run (they make it log on
purpose)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["quiet_library"]

_quiet_depth = 0
_saved_level = logging.NOTSET


@contextlib.contextmanager
def quiet_library() -> Iterator[None]:
    """Silence the library's warnings while scenarios run (they log on purpose); nested
    and concurrent scenarios restore the level once, when the last one ends."""
    global _quiet_depth, _saved_level
    logger = logging.getLogger("idempotency_async")
    if _quiet_depth == 0:
        _saved_level = logger.level
        logger.setLevel(logging.CRITICAL)
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1
        if _quiet_depth == 0:
            logger.setLevel(_saved_level)
