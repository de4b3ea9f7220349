"""Lease renewal: a short lease, renewed through the owner-fenced ``Store.extend`` while the
callback runs, so a crashed worker blocks its key for one short lease, not its deadline.

A lifecycle chooses its leases once, when it is built: :class:`FixedLeases` (never
renewed) or :class:`RenewedLeases`, with one small interface — ``renew`` is the short
lease a claim writes (``Lease`` shapes it), ``start`` hands back the call's
:class:`Renewing` (a task, or nothing to do).  The renewing task belongs to one call:
``start`` creates it after the claim, :meth:`Renewal.cancel` cancels it as soon as the
callback ends (without yielding to the loop), and :meth:`Renewal.stop` is awaited before
the call returns.  Renewals go out
every ``Renewal.every`` seconds counted from the claim's send.  Each confirmed renewal moves
the call's :class:`~idempotency_async._lease.Lease` (which every door reads) and
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
next turn of the loop if it is still unwinding — psycopg answers the first cancellation
by asking its server to cancel and waiting for that answer, and closes the connection on
the second (asyncpg's pool shields that wait: ``PostgresStore.extend`` terminates the
connection itself).  A store must let a cancelled request end promptly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

from idempotency_async._cutoff import Cutoff, Cutoffs
from idempotency_async._emission import Emitter
from idempotency_async._lease import Lease
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.options import Options
from idempotency_async.stores.base import Extended, Store

__all__ = [
    "DONE",
    "NOT_RENEWING",
    "FixedLeases",
    "Leases",
    "Renewal",
    "RenewedLeases",
    "Renewing",
]

_LOST = Extended.LOST


class Renewing(Protocol):
    """What a call does with its lease while the callback runs."""

    lost: bool
    """Whether the store refused a renewal: another claim holds the key."""

    def cancel(self) -> None:
        """The callback ended: send nothing more (without yielding to the loop)."""

    def stop(self) -> Awaitable[None]:
        """Awaited before the call returns: nothing of the renewal outlives it."""

    def follow(self, write: Cutoff, sent: float) -> None:
        """A completion sent at ``sent`` (loop time) while the callback runs on (its point
        of no return) is bounded by ``write``: a renewal the store confirms after it was
        sent — one already on its way, as none is sent from then on — moves it too."""


class Leases(Protocol):
    """How the calls of one lifecycle hold their leases: fixed, or renewed."""

    renew: float | None
    """The short lease a claim writes (``Lease``), None for the whole lease."""

    def start(self, lease: Lease, cutoffs: Cutoffs, cutoff: Cutoff, claimed_at: float) -> Renewing:
        """The claim was confirmed and the callback is about to run under ``cutoff``."""


class _Done:
    """An awaitable that is already done: awaiting it neither yields nor makes a frame."""

    __slots__ = ()

    # An empty tuple's own iterator method, called as is (a builtin method is no descriptor:
    # ``await`` calls it without the instance): awaiting costs no Python frame, and every
    # call awaits this once (``Renewing.stop`` of a fixed lease).
    __await__: Callable[[], Generator[Any, None, None]] = ().__iter__  # type: ignore[assignment]


DONE: Awaitable[None] = _Done()
"""Already done: what a step with nothing to wait for hands back to be awaited."""


class _NotRenewing:
    """The :class:`Renewing` of a fixed lease: nothing to cancel or wait for."""

    __slots__ = ()
    lost = False

    def cancel(self) -> None:
        pass

    def stop(self) -> Awaitable[None]:
        return DONE

    def follow(self, write: Cutoff, sent: float) -> None:
        pass


NOT_RENEWING: Renewing = _NotRenewing()
"""The :class:`Renewing` of a call whose lease is fixed (or not yet held)."""


class FixedLeases:
    """Leases that are never renewed: the claim's lease bounds the whole call."""

    __slots__ = ()
    renew: float | None = None

    def start(self, lease: Lease, cutoffs: Cutoffs, cutoff: Cutoff, claimed_at: float) -> Renewing:
        return NOT_RENEWING


class RenewedLeases:
    """A short lease (``Options.renewal.lease``), renewed every ``renewal.every`` seconds while
    the callback runs, up to the call's hard bound."""

    __slots__ = ("_emitter", "_options", "_store", "renew")

    def __init__(self, store: Store, options: Options, emitter: Emitter) -> None:
        assert options.renewal is not None
        self._store = store
        self._options = options
        self._emitter = emitter
        self.renew: float | None = options.renewal.lease

    def start(self, lease: Lease, cutoffs: Cutoffs, cutoff: Cutoff, claimed_at: float) -> Renewing:
        renewal = Renewal(self._store, self._options, self._emitter, lease, cutoffs, cutoff)
        renewal.start(claimed_at)  # the first renewal counts from the claim's send
        return renewal


class Renewal:
    """The renewing task of one call; it moves the call's lease."""

    __slots__ = (
        "_cutoff",
        "_cutoffs",
        "_emitter",
        "_every",
        "_lease",
        "_loop",
        "_options",
        "_store",
        "_task",
        "_write",
        "lost",
        "renewed",
    )

    def __init__(
        self,
        store: Store,
        options: Options,
        emitter: Emitter,
        lease: Lease,
        cutoffs: Cutoffs,
        cutoff: Cutoff,
    ) -> None:
        assert options.renewal is not None
        self._store = store
        self._options = options
        self._emitter = emitter
        self._lease = lease
        self._cutoffs = cutoffs
        self._cutoff = cutoff
        self._every = options.renewal.interval
        self._loop = cutoffs.loop
        self._task: asyncio.Task[None] | None = None
        self._write: tuple[Cutoff, float] | None = None
        self.lost = False
        """Whether the store refused a renewal: another claim holds the key."""
        self.renewed = 0
        """How many renewals the store confirmed."""

    def start(self, claimed_at: float) -> None:
        """Start renewing; the first renewal is due ``renewal.every`` after ``claimed_at``,
        the loop time the claim was sent (the short lease counts from there too)."""
        self._task = self._loop.create_task(self._run(claimed_at + self._every))

    def cancel(self) -> None:
        """Cancel the renewing task: from now on it sends nothing (a request already on
        its way may still land, and is owner-fenced and never moves the lease back)."""
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> Awaitable[None]:
        """Cancel the renewing task; await this to wait for it to end.  A request in flight
        is cancelled twice, as an abandoned one is: the call does not wait for a driver to
        hear back from its server about it."""
        task = self._task
        if task is None:
            return DONE
        self._task = None
        task.cancel()
        self._loop.call_soon(task.cancel)
        return self._ended(task)

    def follow(self, write: Cutoff, sent: float) -> None:
        self._write = (write, sent)

    @staticmethod
    async def _ended(task: asyncio.Task[None]) -> None:
        await asyncio.wait((task,))

    def _over(self) -> bool:
        cutoff = self._cutoff
        return cutoff.closed or cutoff.expired or cutoff.cancelled_elsewhere()

    async def _run(self, at: float) -> None:
        options, loop, lease, cutoffs = self._options, self._loop, self._lease, self._cutoffs
        key = lease.key
        assert options.renewal is not None
        renew = options.renewal.lease
        while True:
            await asyncio.sleep(max(0.0, at - loop.time()))
            if self._over():
                return  # the callback ended, was cut off, or its caller was cancelled
            sent = loop.time()  # the renewed lease counts from here
            asked = lease.renewal(renew, sent, options.clock())
            if asked is None:
                return  # at the call's hard bound: nothing left to add
            claim, ends_at = asked
            at = sent + self._every
            # Unanswered when the next renewal is due, the request is abandoned: cancelled
            # (twice: see InsistingCutoff), so the client closes its connection.
            abandon = cutoffs.insist(at)
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
                        f"the store did not answer the renewal within Renewal.every "
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
            if answer is _LOST:
                if self._over():
                    return
                self.lost = True
                self._emitter.emit("lease_lost", key)
                self._cutoff.expire()  # cut the callback off now
                return
            # RENEWED, or ALREADY_LATER: either way the lease ends at least there — even
            # if the callback's work is over since the request went out (a fact of the
            # store's: a completion the callback sent meanwhile may run until then).
            self.renewed += 1
            lease.renewed(claim, ends_at)
            if self._over():
                if self._write is not None:
                    write, sent = self._write
                    cutoffs.postpone(write, lease.write_bound(sent))
                return
            cutoffs.postpone(self._cutoff, lease.cutoff_at)
