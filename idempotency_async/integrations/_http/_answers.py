"""The middleware's answers to duplicates and store failures (409, 422, 503), shared by
the claiming path (:mod:`._exchange`) and transactional routes (:mod:`._transaction`)."""

from __future__ import annotations

import logging
import math
from typing import Final

from idempotency_async.errors import AlreadyInProgressError, InconsistentStateError
from idempotency_async.integrations._http._responses import HttpResponse, problem
from idempotency_async.integrations._http._rules import HttpIdempotency

__all__ = ["in_progress", "retry_after", "reused", "store_unavailable"]

# Retry-After of a 503 for a record the store found inconsistent (at least a minute).
_INCONSISTENT_RETRY_AFTER: Final = 60

_log = logging.getLogger("idempotency_async.http")


def retry_after(exc: AlreadyInProgressError, rules: HttpIdempotency) -> int:
    """The seconds a client is told to wait before retrying a request still in progress.

    As long as the first request has run so far (work that took 2 s is likely done 2 s
    later), at least 1 and never past the holder's lease end (the key is claimable then).
    The run time is derived from the lease left: the holder's lease is this middleware's
    ``request_timeout`` plus the manager's ``lease_margin`` from its claim.
    """
    if exc.retry_after is None:
        return 1
    # Leases are kept to the millisecond; rounding first keeps a lease of 5.0004 s at 5.
    left = max(1, math.ceil(round(exc.retry_after, 3)))
    lease = rules.settings.request_timeout + rules.manager.options.lease_margin
    ran = lease - exc.retry_after
    return min(max(1, math.ceil(round(ran, 3))), left)


def in_progress(exc: AlreadyInProgressError, rules: HttpIdempotency) -> HttpResponse:
    seconds = retry_after(exc, rules)
    return problem(
        409,
        "Request in progress",
        f"a request with this Idempotency-Key is still being processed: retry after {seconds} s",
        headers=(("retry-after", str(seconds)),),
    )


def store_unavailable(exc: Exception) -> HttpResponse:
    # The store's message names endpoints, tables and SDK advice: for the operator's log,
    # never for the client.
    if isinstance(exc, InconsistentStateError):
        # A record the store cannot make sense of stays until an operator removes it (or
        # it expires): retrying at once would only meet it again.
        _log.error(
            "the idempotency record of this request is inconsistent (remove it with the CLI "
            "if it persists); answered 503",
            exc_info=exc,
        )
        wait = _INCONSISTENT_RETRY_AFTER
    else:
        _log.error("idempotency store failed before the request ran; answered 503", exc_info=exc)
        wait = 1
    return problem(
        503,
        "Service unavailable",
        "the request was not processed: retry it with the same Idempotency-Key",
        headers=(("retry-after", str(wait)),),
    )


def reused() -> HttpResponse:
    """422: the key was first sent with another request."""
    return problem(
        422,
        "Idempotency-Key reused",
        "this request differs from the one first sent with this Idempotency-Key (its "
        "path, query, content type or body): send that request unchanged to get its "
        "response, or use a new key for a new request",
    )
