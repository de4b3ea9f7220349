"""Lease and time arithmetic: a call's deadline, and the lease it holds.

Inside the library a deadline has one representation, :data:`Deadline`: an absolute
``loop.time()`` value (``None``: no deadline).  It is converted once, by
the :class:`Lease` of its claim, into what a store needs — a lease in seconds counted from the store
clock's ``now`` on the :class:`~idempotency_async.record.Claim` — and into the loop times
that bound the callback (``cutoff_at``) and the writes after it (``ends_at``).  Every other
piece of lease arithmetic (the completion reserve, a renewed call's short lease, a renewal,
the bound of a write after the callback, the end another worker sees) is a method of
:class:`Lease`; nothing else computes one.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from typing import Final, TypeAlias

from idempotency_async._keys import Keys
from idempotency_async.errors import ConfigError, DeadlineExceededError
from idempotency_async.options import Options
from idempotency_async.record import Claim

__all__ = [
    "AMBIENT",
    "Deadline",
    "Lease",
    "check_duration",
    "check_instant",
    "effective_deadline",
]

Deadline: TypeAlias = float | None
"""A call's deadline: an absolute ``loop.time()`` value, or None for none."""

AMBIENT: contextvars.ContextVar[Deadline] = contextvars.ContextVar(
    "idempotency_async_deadline", default=None
)
"""The ambient deadline of the running task (``deadlines.deadline``, the Lambda context)."""

# ``Claim(...)`` runs a Python-level ``__new__``; the tuple constructor, called as it is (a
# ``partial`` costs a fifth more), does not: a claim is built for every call.  Every field is
# passed, in the order ``Claim`` declares them.
_tuple_new: Final = tuple.__new__

_INF: Final = math.inf  # a global reads faster than a module's attribute
_MAX_RESERVE = 0.5
_RESERVE_SHARE = 0.2
# Undoing a transactional call is a statement in the caller's transaction: cutting it short
# could abort that transaction, so it may take this long past the lease end at least.
_UNDO_BOUND = 0.5


class Lease:
    """The lease one call holds: the one object renewal moves and every door reads — the
    bounds of the writes after the callback (``execute``, ``Call.complete``, the HTTP gate
    through it) and an in-process duplicate's ``retry_after`` — never a copy taken at the
    claim.  Made for each claim sent; owned by the call.

    It holds the claim's fields rather than a :class:`~idempotency_async.record.Claim`
    (one object less per call in flight); :attr:`claim` builds the claim to send:

    - ``owner``: the claim's owner token;
    - ``now``: the store clock's now of the claim as last confirmed (the claim's, then
      each renewal's), and ``length``: the lease the store was asked for, in seconds
      from ``now`` (margin included);
    - ``ends_at``: when the lease ends (loop time); cleanup and completion writes end
      here.  ``limit``: the call's hard bound (a renewed lease never ends later);
    - ``cutoff_at``: when the callback is cut off (loop time), the lease end less
      ``reserve``, the time kept for the completion write.

    (Listed here, not as attribute docstrings: each of those is an instruction that every
    claim would run.)
    """

    __slots__ = (
        "cutoff_at",
        "ends_at",
        "keys",
        "length",
        "limit",
        "now",
        "options",
        "owner",
        "reserve",
    )

    def __init__(
        self,
        keys: Keys,
        owner: str,
        deadline: Deadline,
        options: Options,
        sent: float,
        renew: float | None,
    ) -> None:
        """The lease of a claim sent at loop time ``sent`` by a call with ``deadline``.
        Without a deadline it lasts ``Options.lease`` (or ``expires_after``).  A renewed
        call (``renew`` seconds) writes a short lease; the call's bound stays."""
        if deadline is None:
            left = options.lease or options.expires_after
        else:
            left = deadline - sent
            if left <= 0:
                raise DeadlineExceededError(
                    f"the deadline of key {keys.key} passed before it was claimed", key=keys.key
                )
        # The completion reserve: min(0.5 s, 20 % of the time left), or the option's
        # (never more than the time left).
        override = options.completion_reserve
        if override is None:
            reserve = _RESERVE_SHARE * left
            if reserve > _MAX_RESERVE:
                reserve = _MAX_RESERVE
        else:
            reserve = override if override < left else left
        margin = options.lease_margin
        self.keys = keys
        self.owner = owner
        self.now = options.clock()
        self.length = left + margin if margin else left  # no float per call for no margin
        self.options = options
        self.ends_at = self.limit = ends = sent + left
        self.cutoff_at = ends - reserve
        self.reserve = reserve
        if renew is not None:
            self.shorten(renew, override)

    @property
    def key(self) -> str:
        return self.keys.key

    @property
    def margin(self) -> float:
        """What other workers add to the lease for clock skew (``Options.lease_margin``)."""
        return self.options.lease_margin

    @property
    def claim(self) -> Claim:
        """The claim as last confirmed by the store (the claim's, then each renewal's)."""
        options = self.options
        keys = self.keys
        return _tuple_new(
            Claim,
            (
                keys.key,
                self.owner,
                self.now,
                self.length,
                options.expires_after,
                keys.validation,
                0.0 if options.wait is None else options.wait.timeout,
            ),
        )

    def shorten(self, renew: float, completion_reserve: float | None) -> None:
        """Make this the first lease of a renewed call: ``renew`` seconds (never past the
        call's hard bound), with the reserve of a lease that long."""
        margin = self.margin
        now = self.ends_at - (self.length - margin)  # when the claim was sent
        if renew >= self.ends_at - now:
            return
        if completion_reserve is None:
            reserve = min(self.reserve, _RESERVE_SHARE * renew)
        else:
            reserve = min(completion_reserve, renew)
        self.length = renew + margin
        self.reserve = reserve
        self.ends_at = now + renew
        self.cutoff_at = self.ends_at - reserve

    def renewal(self, renew: float, sent: float, clock_now: float) -> tuple[Claim, float] | None:
        """The claim a renewal sent at loop time ``sent`` asks for (``renew`` seconds, not
        past the hard bound) and the loop time its lease would end at (counted from the
        send, not the answer); None when it would not move the lease end."""
        length = min(renew, self.limit - sent)
        if sent + length <= self.ends_at:
            return None
        return self.claim._replace(now=clock_now, lease=length + self.margin), sent + length

    def renewed(self, claim: Claim, ends_at: float) -> None:
        """The store confirmed ``claim`` (a renewal): the lease ends at least at ``ends_at``."""
        self.now = claim.now
        self.length = claim.lease
        self.ends_at = ends_at
        self.cutoff_at = ends_at - self.reserve

    @property
    def end(self) -> float:
        """When the lease ends, in Unix seconds by this process's clock (without the
        margin other workers add for clock skew)."""
        return self.now + self.length - self.margin

    def write_bound(self, now: float) -> float:
        """Until when (loop time) a write after the callback (completion, release) may
        run, asked at ``now``: the lease end, or a reserve from now if that is later."""
        bound = now + self.reserve
        return bound if bound > self.ends_at else self.ends_at

    def undo_bound(self, now: float) -> float:
        """As :meth:`write_bound`, for undoing a call in a caller's transaction: at least
        half a second, so the undo does not abort that transaction."""
        return max(self.ends_at, now + max(self.reserve, _UNDO_BOUND))


def effective_deadline(
    loop: asyncio.AbstractEventLoop, deadline: float | None, timeout: float | None
) -> Deadline:
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
        and 0 < timeout < _INF  # False for NaN
    ):
        return loop.time() + timeout  # the common case, cheaply
    if deadline is None and timeout is None:
        return ambient  # nothing of the call's own: the ambient deadline, or none
    candidates = [] if ambient is None else [ambient]
    if deadline is not None:
        candidates.append(check_instant("deadline", deadline))
    if timeout is not None:
        candidates.append(loop.time() + check_duration("timeout", timeout))
    return min(candidates) if candidates else None


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
