"""The async protocol every record store implements (version 2).

A store stores and judges: the manager sends durations and its clock's ``now``, and the
store answers with its *verdict* on the key — claimed, in progress (with the time left on
the lease), completed, or claimable — by its own clock when it has one (Redis ``TIME``),
else by ``now``.  The manager acts on the verdict and never re-judges it with its clock.
Each method is one atomic operation.
"""

from __future__ import annotations

import enum
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

from idempotency_async.errors import InconsistentStateError
from idempotency_async.record import Claim, Completion, Record, Status

__all__ = [
    "CLAIMED",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Extended",
    "Found",
    "RecordsSteps",
    "RecordsStepsIn",
    "StepTransaction",
    "StepWrite",
    "Stepped",
    "Store",
    "Verdict",
    "Wakes",
    "Watch",
    "Written",
    "check_key",
    "judge",
    "judge_extend",
]

DEFAULT_MAX_RESPONSE_BYTES = 350_000


class Found(enum.Enum):
    """What a store found when it judged a key (a :class:`Verdict`'s ``found``).

    Not a record's :class:`~idempotency_async.record.Status`, which is what the record
    says: an ``INPROGRESS`` record whose lease ended is found ``CLAIMABLE``, and an expired
    ``COMPLETED`` one too.
    """

    CLAIMED = "claimed"
    """The claim was written (or was found already written under its own owner token)."""
    IN_PROGRESS = "in_progress"
    """Another owner holds a live lease."""
    COMPLETED = "completed"
    """An unexpired completed record: replay it."""
    CLAIMABLE = "claimable"
    """No live record (absent, expired or lapsed); a claim that gets this raced an expiry."""
    RESUMABLE = "resumable"
    """Only a claim answers this (stores that record steps): a lapsed or released record
    carrying another payload's recovery points (another validation hash).  Nothing was
    written; the progress belongs to the payload that made it."""


class Verdict(NamedTuple):
    """A store's answer about one key: what it found, the record it judged, and how long
    that lasts by the store's own clock.

    Durations, never instants: a worker whose wall clock differs from the store's still
    counts them right (from when it sent the request, on its monotonic clock).
    """

    found: Found
    record: Record | None = None
    retry_after: float | None = None
    """``IN_PROGRESS``: seconds until the holder's lease ends."""
    expires_in: float | None = None
    """``COMPLETED``: seconds until the record expires (how long a local cache may keep it)."""


CLAIMED = Verdict(Found.CLAIMED)
"""The verdict of a successful claim (shared: building one per call costs time)."""


class StepWrite(NamedTuple):
    """One recovery point to record (:meth:`RecordsSteps.record_step`): the whole step list
    after the step, encoded once by the manager."""

    key: str
    owner: str
    now: float
    """The manager's clock (Unix seconds), for stores without a clock of their own."""
    ttl: float
    """Seconds from ``now`` until the record expires: a step moves the expiry, as a claim
    does (never before the lease end)."""
    position: int
    """How many steps the record holds before this one: the write applies only then (or
    when the record already holds exactly ``steps``: this write, sent again)."""
    steps: str
    """The step list after this step, as JSON text (a list of ``[name, result]`` and
    ``[name, null, reason]`` entries).  Stores keep it as it is."""


class Stepped(enum.Enum):
    """What :meth:`RecordsSteps.record_step` found, and did."""

    RECORDED = "recorded"
    """The owner's INPROGRESS record now holds the list (written, or already held)."""
    LOST = "lost"
    """Nothing was written: another claim's record, a completed one, none, or a record
    holding another number of steps.  The lease is lost."""
    TOO_LARGE = "too_large"
    """Nothing was written: the list does not fit the store's own bound."""


class Written(enum.Enum):
    """What :meth:`Store.complete` wrote."""

    RESPONSE = "response"
    """The COMPLETED record with its response — or nothing, when a completion without a
    response met the owner's record already completed with one (it is kept: final)."""
    WITHOUT_RESPONSE = "without_response"
    """The COMPLETED record without its response (the store could not fit it)."""
    NOTHING = "nothing"
    """Nothing: another claim owns the key (the lease was lost)."""


class Extended(enum.Enum):
    """What :meth:`Store.extend` found, and did."""

    RENEWED = "renewed"
    """The owner's lease now ends where the renewal asked (it was moved there)."""
    ALREADY_LATER = "already_later"
    """The owner's lease already ends after where the renewal asked: nothing was written
    (a renewal sent earlier, landing late, must not shorten a newer one).  The lease is
    still held, at least until the requested end."""
    LOST = "lost"
    """Nothing was written: another claim's record, a completed one, or none at all.  The
    lease is lost."""


# Read on every replay: an Enum member read through its class costs far more than a global
# (Python 3.11), and ``Verdict(...)`` runs a Python-level ``__new__`` where the tuple
# constructor (every field passed, in order) does not.  Called as it is, not through a
# ``partial``: that layer costs a fifth of the construction.
_FOUND_CLAIMABLE, _FOUND_COMPLETED, _FOUND_IN_PROGRESS = (
    Found.CLAIMABLE,
    Found.COMPLETED,
    Found.IN_PROGRESS,
)
_STATUS_COMPLETED = Status.COMPLETED
_tuple_new: Final = tuple.__new__


def judge(record: Record | None, now: float) -> Verdict:
    """The verdict on ``record`` at ``now`` (Unix seconds), for stores judging in Python."""
    if record is None or record.expiration < now:
        return _tuple_new(Verdict, (_FOUND_CLAIMABLE, record, None, None))
    if record.status is _STATUS_COMPLETED:
        return _tuple_new(Verdict, (_FOUND_COMPLETED, record, None, record.expiration - now))
    end = record.lease_end
    if end is None:  # a foreign writer without a lease: held until the record expires
        end = record.expiration
    elif end < now:
        return _tuple_new(Verdict, (_FOUND_CLAIMABLE, record, None, None))
    return _tuple_new(Verdict, (_FOUND_IN_PROGRESS, record, end - now, None))


def check_key(verdict: Verdict, key: str) -> None:
    """Refuse a verdict whose record is for another key than ``key``, the one asked about:
    a store bug, a proxy that mixed answers up or a crafted record is never an answer
    (``InconsistentStateError``)."""
    record = verdict.record
    if record is not None and record.key != key:
        raise InconsistentStateError(
            f"the store answered a request about key {key!r} with the record of key "
            f"{str(record.key)[:200]!r}: it was not used (a store or proxy that mixes answers "
            "up, or a damaged record)"
        )


def judge_extend(record: Record | None, owner: str, lease_end: float) -> Extended:
    """What :meth:`Store.extend` owes for ``record`` when ``owner`` asks for its lease to
    end at ``lease_end`` (Unix seconds), for stores that judge in Python: write the renewal
    only on ``RENEWED``, in the same atomic step as the read."""
    if record is None or record.status is not Status.INPROGRESS or record.owner != owner:
        return Extended.LOST
    if record.lease_end is not None and record.lease_end > lease_end:
        return Extended.ALREADY_LATER
    return Extended.RENEWED


@runtime_checkable
class Store(Protocol):
    max_response_bytes: int
    """Largest encoded (JSON, UTF-8) response this store accepts."""

    async def claim(self, claim: Claim) -> Verdict:
        """Write ``claim`` atomically if the key is free, and say what happened.

        Free means: no record, an expired record, an INPROGRESS record whose lease ended,
        or an INPROGRESS record carrying ``claim.owner`` (this claim, sent again after its
        answer was lost).  Returns :data:`CLAIMED` when written; otherwise the verdict on
        the record that blocked it — read in the same atomic step, never by a second
        request.  A store returns ``CLAIMED`` only on the backend's explicit confirmation;
        an answer it does not recognise raises ``StoreUnavailableError``.
        """
        ...

    async def get(self, key: str, *, now: float) -> Verdict:
        """Read the record of ``key`` with strong consistency and judge it at ``now``.

        ``CLAIMABLE`` with ``record=None`` when there is no record; expired records are
        returned (``CLAIMABLE``) so operators can see them.
        """
        ...

    async def complete(self, completion: Completion) -> Written:
        """Write the COMPLETED record if ``completion.owner`` still owns the key.

        Owning means the record carries the owner token, whatever its status: a completion
        sent again after a lost answer, or sent later to attach a response to a record this
        owner completed without one, succeeds.  Returns :attr:`Written.NOTHING` (writing
        nothing) when another claim replaced the record or it is gone.

        A response, once the owner's record holds it, is final: a completion without a
        response (``completion.encoded is None``) meeting the owner's COMPLETED record
        that holds one writes nothing and answers :attr:`Written.RESPONSE` (what the record
        holds).  That is the first completion of a streamed HTTP response, resent after
        its answer was lost and landing after the body was attached.  The check is part
        of the write's own atomic condition, judged by the store (no extra request).
        """
        ...

    async def release(self, key: str, owner: str) -> bool:
        """Delete the record if ``owner`` still owns it; ``False`` when another claim does.

        A record already gone counts as released (``True``).
        """
        ...

    async def extend(self, claim: Claim) -> Extended:
        """Renew the lease ``claim.owner`` holds: rewrite its INPROGRESS record as ``claim``
        describes — the lease ends ``claim.lease`` seconds after ``claim.now`` (or the
        store's own clock), the record expires as a fresh claim's would.

        Fenced like :meth:`complete`, and never backwards: only an INPROGRESS record
        carrying ``claim.owner`` whose lease ends no later than the requested end is
        rewritten (:attr:`Extended.RENEWED`); the owner's record whose lease already ends
        later is left as it is (:attr:`Extended.ALREADY_LATER`: a renewal that lands after
        a newer one).  Anything else — another claim's record, a completed one, none at
        all — is left as it is too, and the answer is :attr:`Extended.LOST`.  Each check is
        part of the write's own atomic condition, judged by the store.  A record whose lease
        lapsed but that nobody claimed since is still the owner's.
        """
        ...

    async def force_release(self, key: str) -> Record | None:
        """Delete the record of ``key`` whatever its state; return what was deleted."""
        ...

    async def aclose(self) -> None:
        """Release what the store owns (clients it opened itself)."""
        ...


@runtime_checkable
class RecordsSteps(Protocol):
    """An optional store capability: recording the steps of a call (recovery points).

    A store that has it takes on these obligations in its other operations (each still one
    atomic request):

    - ``claim`` keeps the steps of a record it takes over when that record is unexpired,
      INPROGRESS, and has the claim's validation hash (``None`` equals ``None``): a lapsed
      record, a released one (no owner), or the claim's own.  Its answer carries them —
      ``Verdict(Found.CLAIMED, record)`` with ``record.steps`` set — and stays
      :data:`CLAIMED` when there are none.  An expired record's steps are dropped.  A
      lapsed or released unexpired record carrying steps under *another* validation hash
      is not taken over: the answer is ``Verdict(Found.RESUMABLE, record)``.
    - ``extend`` keeps the steps.
    - ``complete`` drops them, in the write that stores the response.
    - ``release(key, owner)`` on the owner's record carrying steps writes the *released*
      state instead of deleting it: INPROGRESS, no owner, its lease ended (just before
      now), steps, validation and expiry kept.  A release meeting an ownerless record
      answers ``True``.
    - ``force_release`` removes the record with its steps.
    """

    async def record_step(self, write: StepWrite) -> Stepped:
        """Write ``write.steps`` on the INPROGRESS record ``write.owner`` holds, when it
        holds ``write.position`` steps (or already exactly ``write.steps``), and move its
        expiry as a claim would; never moves its lease end."""
        ...


class StepTransaction(Protocol):
    """A transactional step's own transaction on the caller's connection, opened by
    :meth:`RecordsStepsIn.begin_step`: the step's function runs in it, then
    :meth:`record` writes the recovery point through it and commits, so that the step's
    database writes and its recovery point commit together or not at all."""

    async def record(self, write: StepWrite) -> Stepped:
        """Write ``write`` (as :meth:`RecordsSteps.record_step` would) in the transaction,
        and commit it when it is ``RECORDED``.  ``TOO_LARGE``: nothing written, the
        transaction still open (a shorter list may follow).  ``LOST``: rolled back.  A
        failure rolls back what it can and raises."""
        ...

    async def rollback(self) -> None:
        """Roll the transaction back (the step's function raised); never raises."""
        ...


@runtime_checkable
class RecordsStepsIn(Protocol):
    """An optional store capability, with :class:`RecordsSteps`: transactional steps
    (``step(name, fn, connection=...)``), whose database writes commit with their
    recovery point in one transaction on the caller's connection."""

    async def begin_step(self, connection: Any) -> StepTransaction:
        """Open the step's transaction on ``connection``: ``ConfigError`` before any
        statement when it is not a connection this store writes through, or is already in a
        transaction."""
        ...


class Watch(Protocol):
    """One waiter's view of a key's wake-ups (see :class:`Wakes`)."""

    @property
    def listening(self) -> bool:
        """True while a completion or release of the key would wake this watch (the
        store's subscription to it is confirmed).  A waiter polls less often then."""
        ...

    async def wait(self, timeout: float) -> None:
        """Return when the key's record may have changed — it was completed or released,
        or the subscription was confirmed or lost (either may have hidden a change) — or
        after ``timeout`` seconds, whichever is first.  The caller re-reads the record
        either way: a wake-up is a hint, never a verdict."""
        ...


@runtime_checkable
class Wakes(Protocol):
    """An optional store capability: waking the duplicates that wait on a key in progress
    when its holder completes or releases it, instead of leaving them to their next poll.

    A waiting call enters ``store.watch(key)`` for as long as it waits and leaves it on
    every path (a ``with`` block, cancellation included).  Polling stays on underneath: a
    lost wake-up only means waiting until the next read.  Whatever a store runs to deliver
    wake-ups (a subscription, a task) is its own and ends in :meth:`Store.aclose`; leaving
    a watch sends nothing on the caller's behalf.
    """

    def watch(self, key: str) -> AbstractContextManager[Watch]:
        """Wake-ups of ``key`` (the logical key, as given to :meth:`Store.get`) while the
        returned context is entered."""
        ...
