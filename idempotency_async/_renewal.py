"""Lease renewal: a short lease, renewed through the owner-fenced ``Store.extend`` while the
callback runs, so a crashed worker blocks its key for one short lease, not its deadline.

The renewing task belongs to one call: :meth:`Renewal.start` creates it after the claim,
:meth:`Renewal.cancel` cancels it as soon as the callback ends (without yielding
to the loop), and :meth:`Renewal.stop` awaits it before the call returns.  Renewals go out
every ``renew_every`` seconds counted from the claim's send.  Each confirmed renewal moves
the call's lease (:class:`~idempotency_async._lease.Held`, which every door reads) and
postpones the callback's cutoff to a reserve before the new lease end, counted from when
the ``extend`` was sent.  A refused renewal (the lease is lost) cuts the callback off at
once; one that fails leaves the cutoff where it was, so the callback is cut off before the
current lease ends unless a later renewal is confirmed.

Each ``extend`` is bounded: one not answered when the next one is due is abandoned — its
request cancelled, so the client closes that connection and nothing is left unread for
its next request — and the next one goes out on time.  The store never moves a lease end
back, so an abandoned request that lands late cannot shorten a newer lease.  The request
is awaited by the renewing task under an
:class:`~idempotency_async._cutoff.InsistingCutoff` (one heap entry of the loop's shared
cutoff timer, no task or timer per renewal): it cancels the request, and once more at the
next turn of the loop if it is still unwinding — a database driver answers the first
cancellation by asking its server to cancel and waiting for that answer (asyncpg,
psycopg), and closes the connection on the second.  A store must let a cancelled request
end promptly.
"""

from __future__ import annotations

import asyncio

from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._lease import Held, Lease
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.options import Options
from idempotency_async.stores.base import Extended, Store

__all__ = ["Renewal", "short_lease"]

_LOST = Extended.LOST


def short_lease(options: Options, lease: Lease) -> Lease:
    """The first lease of a renewed call: ``renew_lease`` seconds (never past ``lease``, the
    call's hard bound), with the reserve of a lease that long."""
    renew = options.renew_lease
    assert renew is not None
    claim = lease.claim
    now = lease.ends_at - (claim.lease - options.lease_margin)
    left = lease.ends_at - now
    if renew >= left:
        return lease
    reserve = lease.reserve
    if options.completion_reserve is None:
        reserve = min(reserve, 0.2 * renew)
    else:
        reserve = min(options.completion_reserve, renew)
    short = claim._replace(lease=renew + options.lease_margin)
    return Lease(short, now + renew - reserve, now + renew, reserve)


class Renewal:
    """The renewing task of one call; it moves the call's lease (``held``)."""

    __slots__ = (
        "_cutoff",
        "_cutoffs",
        "_emitter",
        "_every",
        "_hard_end",
        "_held",
        "_loop",
        "_options",
        "_store",
        "_task",
        "lost",
        "renewed",
    )

    def __init__(
        self,
        store: Store,
        options: Options,
        emitter: Emitter,
        held: Held,
        hard_end: float,
        cutoffs: Cutoffs,
        cutoff: Cutoff,
    ) -> None:
        assert options.renew_lease is not None
        self._store = store
        self._options = options
        self._emitter = emitter
        self._held = held
        self._hard_end = hard_end
        self._cutoffs = cutoffs
        self._cutoff = cutoff
        self._every = options.renew_every or options.renew_lease / 3
        self._loop = cutoffs.loop
        self._task: asyncio.Task[None] | None = None
        self.lost = False
        """Whether the store refused a renewal: another claim holds the key."""
        self.renewed = 0
        """How many renewals the store confirmed."""

    def start(self, claimed_at: float) -> None:
        """Start renewing; the first renewal is due ``renew_every`` after ``claimed_at``,
        the loop time the claim was sent (the short lease counts from there too)."""
        self._task = self._loop.create_task(self._run(claimed_at + self._every))

    def cancel(self) -> None:
        """Cancel the renewing task: from now on it sends nothing (a request already on
        its way may still land, and is owner-fenced and never moves the lease back)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        """Cancel the renewing task and wait for it to end.  A request in flight is
        cancelled twice, as an abandoned one is: the call does not wait for a driver to
        hear back from its server about it."""
        task = self._task
        if task is None:
            return
        self._task = None
        task.cancel()
        self._loop.call_soon(task.cancel)
        await asyncio.wait((task,))

    def _over(self) -> bool:
        cutoff = self._cutoff
        return cutoff.closed or cutoff.expired or cutoff.cancelled_elsewhere()

    async def _run(self, at: float) -> None:
        options, loop, held, cutoffs = self._options, self._loop, self._held, self._cutoffs
        key = held.lease.claim.key
        renew = options.renew_lease
        assert renew is not None
        while True:
            await asyncio.sleep(max(0.0, at - loop.time()))
            if self._over():
                return  # the callback ended, was cut off, or its caller was cancelled
            sent = loop.time()  # the renewed lease counts from here
            length = min(renew, self._hard_end - sent)
            current = held.lease
            if sent + length <= current.ends_at:
                return  # at the call's hard bound: nothing left to add
            claim = current.claim._replace(now=options.clock(), lease=length + options.lease_margin)
            at = sent + self._every
            # Unanswered when the next renewal is due, the request is abandoned: cancelled
            # (twice: see InsistingCutoff), so the client closes its connection.
            abandon = cutoffs.start(at, insist=True)
            try:
                answer = await self._store.extend(claim)
                if answer.__class__ is not Extended:
                    raise StoreUnavailableError(
                        f"the store answered a renewal of key {key} with {answer!r}, not an "
                        "Extended"
                    )
            except asyncio.CancelledError:
                if not abandon.fired():
                    raise  # the renewal was stopped
                self._emitter.emit(
                    "renew_failed",
                    key,
                    error=TimeoutError(
                        f"the store did not answer the renewal within renew_every "
                        f"({self._every:g} s): abandoned"
                    ),
                )
                continue  # the next one goes out now
            except Exception as exc:
                # Unconfirmed: the cutoff stays where it is; try again at the next interval.
                self._emitter.emit("renew_failed", key, error=exc)
                continue
            finally:
                abandon.close()
            if self._over():
                return
            if answer is _LOST:
                self.lost = True
                self._emitter.emit("lease_lost", key)
                self._cutoff.expire()  # cut the callback off now
                return
            # RENEWED, or ALREADY_LATER: either way the lease ends at least there.
            self.renewed += 1
            ends = sent + length
            reserve = current.reserve
            held.lease = Lease(claim, ends - reserve, ends, reserve)
            self._cutoffs.postpone(self._cutoff, ends - reserve)
