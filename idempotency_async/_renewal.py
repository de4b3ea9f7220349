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
back, so an abandoned request that lands late cannot shorten a newer lease.  Each request
runs in a task of its own and acts on its answer as soon as it arrives; the renewing task
never waits for one (a driver may take a round trip to unwind a cancelled statement).  An
abandoned request is cancelled twice (drivers that answer the first cancellation by
waiting for the server's close the connection on the second), and every request is
awaited before the call returns.
"""

from __future__ import annotations

import asyncio

from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._lease import Held, Lease
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.options import Options
from idempotency_async.record import Claim
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
        "_in_flight",
        "_loop",
        "_options",
        "_requests",
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
        self._requests: set[asyncio.Task[None]] = set()
        """``extend`` requests not awaited yet: the one in flight, and abandoned ones."""
        self._in_flight: asyncio.Task[None] | None = None
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
        """Cancel the renewing task and its requests, and wait for them to end."""
        task = self._task
        if task is None:
            return
        self._task = None
        task.cancel()
        self._in_flight = None  # an answer from now on changes nothing
        requests = self._requests
        for request in requests:
            _abandon(request, self._loop)
        await asyncio.wait((task, *requests))
        for request in requests:
            _retrieve(request)
        requests.clear()

    def _over(self) -> bool:
        cutoff = self._cutoff
        return cutoff.closed or cutoff.expired or cutoff.cancelled_elsewhere()

    async def _run(self, at: float) -> None:
        options, loop, held = self._options, self._loop, self._held
        key = held.lease.claim.key
        renew = options.renew_lease
        assert renew is not None
        requests = self._requests
        while True:
            await asyncio.sleep(max(0.0, at - loop.time()))
            in_flight = self._in_flight
            if in_flight is not None:
                # Unanswered when the next renewal is due: abandoned (cancelled, so the
                # client closes its connection), and the next one goes out now.
                self._in_flight = None
                _abandon(in_flight, loop)
                self._emitter.emit(
                    "renew_failed",
                    key,
                    error=TimeoutError(
                        f"the store did not answer the renewal within renew_every "
                        f"({self._every:g} s): abandoned"
                    ),
                )
            if requests:
                for request in [request for request in requests if request.done()]:
                    _retrieve(request)
                    requests.discard(request)
            if self._over():
                return  # the callback ended, was cut off, or its caller was cancelled
            sent = loop.time()  # the renewed lease counts from here
            length = min(renew, self._hard_end - sent)
            if sent + length <= held.lease.ends_at:
                return  # at the call's hard bound: nothing left to add
            claim = held.lease.claim._replace(
                now=options.clock(), lease=length + options.lease_margin
            )
            at = sent + self._every
            task = loop.create_task(self._request(claim, sent + length))
            requests.add(task)
            self._in_flight = task

    async def _request(self, claim: Claim, ends: float) -> None:
        """One renewal, in a task of its own (abandoned if unanswered when the next is
        due), acting on its answer as soon as it arrives; ``ends``: the lease end (loop
        time) it confirms, counted from its send."""
        key, this = claim.key, asyncio.current_task()
        try:
            answer = await self._store.extend(claim)
            if answer.__class__ is not Extended:
                raise StoreUnavailableError(
                    f"the store answered a renewal of key {key} with {answer!r}, not an Extended"
                )
        except Exception as exc:
            if self._in_flight is this and not self._over():
                # Unconfirmed: the cutoff stays where it is; the next one goes out on time.
                self._emitter.emit("renew_failed", key, error=exc)
            return
        finally:
            if self._in_flight is this:
                self._in_flight = None
                self._requests.discard(this)
        if self._over():
            return
        if answer is _LOST:
            self.lost = True
            self._emitter.emit("lease_lost", key)
            self._cutoff.expire()  # cut the callback off now
            return
        # RENEWED, or ALREADY_LATER: either way the lease ends at least there.
        self.renewed += 1
        held = self._held
        current = held.lease
        if ends > current.ends_at:
            reserve = current.reserve
            held.lease = Lease(claim, ends - reserve, ends, reserve)
            self._cutoffs.postpone(self._cutoff, ends - reserve)


def _abandon(request: asyncio.Task[None], loop: asyncio.AbstractEventLoop) -> None:
    """Cancel an extend request, and again at the next turn of the loop: a driver that
    answers the first cancellation by asking the server to cancel and waiting for its
    answer (asyncpg, psycopg) closes the connection on the second, instead of waiting."""
    if not request.done():
        request.cancel()
        loop.call_soon(request.cancel)


def _retrieve(request: asyncio.Task[None]) -> None:
    # An abandoned request's outcome is of no use, but asyncio logs an exception that
    # nobody retrieved.
    if not request.cancelled():
        request.exception()
