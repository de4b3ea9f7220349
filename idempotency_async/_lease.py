"""Lease and time arithmetic: a call's deadline, and the lease a claim asks for.

Inside the library a deadline has one representation: an absolute ``loop.time()`` value
(``None``: no deadline).  It is converted once, here, into what a store needs — a lease
in seconds counted from the store clock's ``now`` on the :class:`~idempotency_async.record.Claim`
— and into the loop times that bound the callback (``cutoff_at``) and the writes after it
(``ends_at``).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from typing import NamedTuple

from idempotency_async._keys import Keys
from idempotency_async.errors import ConfigError, DeadlineExceededError
from idempotency_async.options import Options
from idempotency_async.record import Claim

__all__ = [
    "AMBIENT",
    "Held",
    "Lease",
    "check_duration",
    "check_instant",
    "effective_deadline",
    "lease_for",
    "reserve_for",
]

AMBIENT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "idempotency_async_deadline", default=None
)
"""The ambient deadline of the running task (``deadlines.deadline``, the Lambda context)."""

_MAX_RESERVE = 0.5
_RESERVE_SHARE = 0.2


class Lease(NamedTuple):
    """A claim to write, with its bounds in loop time."""

    claim: Claim
    cutoff_at: float
    """When the callback is cut off: the lease end less the completion reserve."""
    ends_at: float
    """When the lease ends; cleanup and completion writes are abandoned here."""
    reserve: float


class Held:
    """The lease one call holds: the one object renewal moves and every door reads — the
    bounds of the writes after the callback (``execute``, ``Call.complete``, the HTTP gate
    through it) and an in-process duplicate's ``retry_after`` — never a copy taken at the
    claim.  Created when the store confirms the claim; owned by the call."""

    __slots__ = ("lease", "margin")

    def __init__(self, lease: Lease, margin: float) -> None:
        self.lease = lease
        """The lease as last confirmed by the store (the claim's, then each renewal's)."""
        self.margin = margin

    @property
    def end(self) -> float:
        """When the lease ends, in Unix seconds by this process's clock (without the
        margin other workers add for clock skew)."""
        claim = self.lease.claim
        return claim.now + claim.lease - self.margin


def effective_deadline(
    loop: asyncio.AbstractEventLoop, *, deadline: float | None, timeout: float | None
) -> float | None:
    """The earliest of an explicit deadline, a timeout from now and the ambient deadline.

    ``timeout`` must be a finite positive number and ``deadline`` a finite one: anything
    else (NaN, infinities, a timeout <= 0) is :class:`~idempotency_async.errors.ConfigError`
    here, at the call, rather than a lease that never lapses or an overflow later.
    """
    ambient = AMBIENT.get()
    if (
        deadline is None
        and ambient is None
        and timeout is not None
        and (timeout.__class__ is float or timeout.__class__ is int)
        and 0 < timeout < math.inf  # False for NaN
    ):
        return loop.time() + timeout  # the common case, cheaply
    candidates = [] if ambient is None else [ambient]
    if deadline is not None:
        candidates.append(check_instant("deadline", deadline))
    if timeout is not None:
        candidates.append(loop.time() + check_duration("timeout", timeout))
    return min(candidates) if candidates else None


def reserve_for(time_left: float, override: float | None = None) -> float:
    """Time kept back between the callback's cutoff and the lease end for the completion
    write: min(0.5 s, 20 % of the time left), or ``override`` (never more than the time left)."""
    if override is not None:
        return min(override, time_left)
    return min(_MAX_RESERVE, _RESERVE_SHARE * time_left)


def lease_for(
    keys: Keys, owner: str, deadline: float | None, options: Options, now: float
) -> Lease:
    """The claim to write at loop time ``now`` for a call with ``deadline``, and the loop
    times that bound its callback and cleanup.  Without a deadline the lease is
    ``Options.lease`` (or ``expires_after``)."""
    if deadline is None:
        left = options.lease or options.expires_after
    else:
        left = deadline - now
        if left <= 0:
            raise DeadlineExceededError(
                f"the deadline of key {keys.key} passed before it was claimed", key=keys.key
            )
    reserve = reserve_for(left, options.completion_reserve)
    claim = Claim(
        keys.key,
        owner,
        options.clock(),
        left + options.lease_margin,
        options.expires_after,
        keys.validation,
    )
    return Lease(claim, now + left - reserve, now + left, reserve)


def check_duration(name: str, value: object) -> float:
    """``value`` if it is a finite positive number of seconds, else ConfigError."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value < math.inf  # False for NaN
    ):
        return value
    raise ConfigError(
        f"{name} must be a finite positive number of seconds, got {value!r}: give the time "
        "the call may take (no deadline at all: leave it out)"
    )


def check_instant(name: str, value: object) -> float:
    """``value`` if it is a finite ``loop.time()`` value, else ConfigError."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    raise ConfigError(
        f"{name} must be a finite loop.time() value, got {value!r}: e.g. "
        "asyncio.get_running_loop().time() + seconds (no deadline at all: leave it out)"
    )
