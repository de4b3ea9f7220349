"""Lease renewal: a short lease, renewed through the owner-fenced ``Store.extend`` while the
callback runs, so a crashed worker blocks its key for one short lease, not its deadline.

The renewing task belongs to one call: :meth:`Renewal.start` creates it after the claim,
:meth:`Renewal.cancel` cancels it as soon as the callback ends (without yielding
to the loop), and :meth:`Renewal.stop` awaits it before the call returns.  Each confirmed renewal
postpones the callback's cutoff to a reserve before the new lease end, counted from when
the ``extend`` was sent.  A refused renewal (the lease is lost) cuts the callback off at
once; one that fails or is not answered in time leaves the cutoff where it was, so the
callback is cut off before the current lease ends.
"""

from __future__ import annotations

import asyncio

from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._lease import Lease
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.options import Options
from idempotency_async.stores.base import Extended, Store

__all__ = ["Renewal", "short_lease"]


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
    """The renewing task of one call, and the lease as last renewed."""

    __slots__ = (
        "_cutoff",
        "_cutoffs",
        "_emitter",
        "_every",
        "_hard_end",
        "_loop",
        "_options",
        "_store",
        "_task",
        "lease",
        "lost",
        "renewed",
    )

    def __init__(
        self,
        store: Store,
        options: Options,
        emitter: Emitter,
        lease: Lease,
        hard_end: float,
        cutoffs: Cutoffs,
        cutoff: Cutoff,
    ) -> None:
        assert options.renew_lease is not None
        self._store = store
        self._options = options
        self._emitter = emitter
        self.lease = lease
        """The lease as last confirmed by the store."""
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

    def start(self) -> None:
        self._task = self._loop.create_task(self._run(self._loop.time() + self._every))

    def cancel(self) -> None:
        """Cancel the renewing task: from now on it sends nothing (a request already on
        its way may still land, and is owner-fenced)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        """Cancel the renewing task and wait for it to end."""
        task = self._task
        if task is None:
            return
        self._task = None
        task.cancel()
        await asyncio.wait((task,))

    def _over(self) -> bool:
        cutoff = self._cutoff
        return cutoff.closed or cutoff.expired or cutoff.cancelled_elsewhere()

    async def _run(self, at: float) -> None:
        options, loop, key = self._options, self._loop, self.lease.claim.key
        renew = options.renew_lease
        assert renew is not None
        while True:
            await asyncio.sleep(max(0.0, at - loop.time()))
            if self._over():
                return  # the callback ended, was cut off, or its caller was cancelled
            sent = loop.time()  # the renewed lease counts from here
            length = min(renew, self._hard_end - sent)
            if sent + length <= self.lease.ends_at:
                return  # at the call's hard bound: nothing left to add
            claim = self.lease.claim._replace(
                now=options.clock(), lease=length + options.lease_margin
            )
            at = sent + self._every
            try:
                answer = await self._store.extend(claim)
                if answer.__class__ is not Extended:
                    raise StoreUnavailableError(
                        f"the store answered a renewal of key {key} with {answer!r}, not an "
                        "Extended"
                    )
            except Exception as exc:
                # Unconfirmed: the cutoff stays where it is; try again at the next interval.
                self._emitter.emit("renew_failed", key, error=exc)
                continue
            if self._over():
                return
            if answer is Extended.LOST:
                self.lost = True
                self._emitter.emit("lease_lost", key)
                self._cutoff.expire()  # cut the callback off now
                return
            self.renewed += 1
            ends = sent + length
            reserve = self.lease.reserve
            self.lease = Lease(claim, ends - reserve, ends, reserve)
            self._cutoffs.postpone(self._cutoff, ends - reserve)
