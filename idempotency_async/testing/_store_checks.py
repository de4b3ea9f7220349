"""The oracle's store checks: each operation answered and wrote what the record before it
called for (protocol v2), and no live record changed without an operation (G4, G7).

Independent of the library: the verdicts and expiries a store owes are computed here from
the contract's text, never with the library's own judgement code (a bug the two shared
would be invisible).  ``tests/test_simulator_oracle.py`` checks the imports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import Extended, Found, Stepped, StepWrite, Verdict, Written
from idempotency_async.testing._faults import Application, Op

__all__ = [
    "BOUNDARY",
    "StoreChecks",
    "expected_expiry",
    "expected_state",
    "renewed",
    "same",
    "shape",
    "step_names",
]


BOUNDARY = 0.002
"""Seconds around a lease end or expiry within which a store's judgement is not checked
(stores round to milliseconds and to whole seconds)."""


def expected_state(record: Record | None, now: float) -> Found:
    """The state a store owes for ``record`` at ``now``, from the contract: absent or past
    its expiry is claimable; completed and unexpired replays; in progress holds the key
    until its lease ends (a foreign record without a lease: until it expires)."""
    if record is None or record.expiration < now:
        return Found.CLAIMABLE
    if record.status is Status.COMPLETED:
        return Found.COMPLETED
    if record.lease_end is not None and record.lease_end < now:
        return Found.CLAIMABLE
    return Found.IN_PROGRESS


def expected_expiry(now: float, ttl: float, lease: float) -> int:
    """A record's expiry from the contract: ``ceil(now + ttl)``, never before its lease ends."""
    return math.ceil(now + max(ttl, lease))


def renewed(answer: Any) -> bool | None:
    """What an ``extend`` answer says: True — the lease holds at least as long as asked
    (``RENEWED``, or ``ALREADY_LATER``: a newer renewal landed first); False — the lease
    is lost; None — not an answer."""
    if answer is Extended.RENEWED or answer is Extended.ALREADY_LATER:
        return True
    if answer is Extended.LOST:
        return False
    return None


def same(one: Any, other: Any) -> bool:
    """Equal as replayed values (NaN equals NaN here)."""
    if one == other:
        return True
    return repr(one) == repr(other) and "nan" in repr(one)


def shape(record: Record | None) -> tuple[Any, ...] | None:
    if record is None:
        return None
    return (
        record.status,
        record.owner,
        record.expiration,
        None if record.lease_end is None else round(record.lease_end, 3),
        record.validation,
        record.response_stored,
    )


def step_names(record: Record | None) -> list[str]:
    """The names of the steps ``record`` holds (its recovery points), read from the step
    list's JSON here, not by the library: ``[["name", result], ["name", null, reason]]``.
    Unreadable: no names (the store checks then see the list change)."""
    text = None if record is None else record.steps
    if not text:
        return []
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [str(entry[0]) for entry in entries if isinstance(entry, list) and entry]


def _steps(record: Record | None) -> str | None:
    return None if record is None else record.steps


class StoreChecks:
    """Judges a store's history: ``applications`` per key in the order they applied;
    ``max_wall`` gives the most advanced manager clock at a loop time."""

    def __init__(
        self,
        applications: dict[str, list[tuple[Op, Application]]],
        max_wall: Callable[[float], float],
        fail: Callable[[str], None],
        store_clock: Callable[[Application], float] | None = None,
        boundary: float = BOUNDARY,
    ) -> None:
        self.applications = applications
        self.max_wall = max_wall
        self.fail = fail
        self.store_clock = store_clock
        """A store judging by a real clock of its own: the time it judged an application
        by (approximately: ``boundary`` absorbs the difference)."""
        self.boundary = boundary
        self.expiry_slack = 0 if store_clock is None else 1

    def now(self, application: Application, sent: float) -> float:
        """The time the store judged ``application`` by: the ``now`` the manager sent, or
        the store's own clock."""
        return sent if self.store_clock is None else self.store_clock(application)

    def near(self, record: Record | None, now: float) -> bool:
        return near(record, now, self.boundary)

    def check(self) -> None:
        for key, history in self.applications.items():
            previous: Application | None = None
            for op, application in history:
                if previous is not None and previous.done:
                    self.check_unchanged_between(key, previous, application)
                if application.done:
                    self.check_application(op, application)
                previous = application

    def check_unchanged_between(self, key: str, previous: Application, nxt: Application) -> None:
        if shape(previous.after) == shape(nxt.before) and _steps(previous.after) == _steps(
            nxt.before
        ):
            return
        gone = previous.after
        # A store judging by its own clock may have dropped it any time until the next
        # request's answer came back (a slow answer widens the window, never the verdict).
        latest = nxt.until if self.store_clock is not None and nxt.until is not None else nxt.at
        if gone is not None and nxt.before is None and gone.expiration < self.max_wall(latest):
            return  # an expired record was dropped
        self.fail(
            f"store: the record of {key} changed with no operation on it between "
            f"t={previous.at:.3f} and t={nxt.at:.3f}: {previous.after} -> {nxt.before} "
            "(a live record must never be forgotten, G7)"
        )

    def check_application(self, op: Op, application: Application) -> None:
        saved = self.boundary
        if self.store_clock is not None and application.until is not None:
            # A store judging by its own clock judged it somewhere while it was on its way:
            # a slow answer (a busy machine) widens the window, never the verdict.
            self.boundary = saved + (application.until - application.at)
        try:
            self._check_application(op, application)
        finally:
            self.boundary = saved

    def _check_application(self, op: Op, application: Application) -> None:
        before, after, answer = application.before, application.after, application.answer
        if application.error is not None:
            if shape(before) != shape(after) and not _applied_then_timed_out(op, application):
                self.fail(
                    f"store: {op.name} of {op.key} raised {application.error!r} but changed "
                    f"the record: {before} -> {after}"
                )
            return
        if op.name == "claim":
            claim: Claim = op.arg
            now = self.now(application, claim.now)
            self.check_claim(op, claim._replace(now=now), before, after, answer)
        elif op.name == "complete":
            done: Completion = op.arg
            now = self.now(application, done.now)
            self.check_complete(op, done._replace(now=now), before, after, answer)
        elif op.name == "release":
            self.check_release(op, application)
        elif op.name == "extend":
            self.check_extend(op, application)
        elif op.name == "record_step":
            self.check_record_step(op, application)
        elif op.name == "force_release":
            if after is not None or shape(answer) != shape(before):
                self.fail(
                    f"store: force_release of {op.key} answered {answer!r} and left {after} "
                    f"(record before: {before})"
                )
        elif op.name == "get" and not self.near(before, self.now(application, op.arg)):
            now = self.now(application, op.arg)
            expected = expected_state(before, now)
            if not isinstance(answer, Verdict) or answer.found is not expected:
                self.fail(
                    f"store: get of {op.key} at {now} answered {answer!r}, expected "
                    f"{expected} for {before}"
                )
            else:
                self.check_durations(op, before, now, answer)

    def check_release(self, op: Op, application: Application) -> None:
        """A release deletes its owner's record — or, when the record carries steps,
        writes the *released* state (in progress, no owner, its lease ended, steps,
        validation and expiry kept); a release meeting such an ownerless record answers
        True and leaves it.  Any other record is left as it is (False)."""
        before, after, answer = application.before, application.after, application.answer
        owner = op.arg
        stepped = before is not None and before.status is Status.INPROGRESS and bool(before.steps)
        if before is not None and before.owner is None and stepped:
            owned, kept = True, True  # released already: left as it is
            expected_ok = shape(after) == shape(before) and _steps(after) == _steps(before)
        elif before is None or before.owner == owner:
            owned, kept = True, stepped
            if stepped:
                assert before is not None
                expected_ok = (
                    after is not None
                    and after.status is Status.INPROGRESS
                    and after.owner is None
                    and after.lease_end is not None
                    and after.lease_end < self.max_wall(application.at) + self.boundary
                    and after.expiration == before.expiration
                    and after.validation == before.validation
                    and after.steps == before.steps
                )
            else:
                expected_ok = after is None
        else:
            owned, kept = False, False
            expected_ok = shape(after) == shape(before) and _steps(after) == _steps(before)
        if answer is not owned or not expected_ok:
            wanted = "the released state, its steps kept" if kept else "nothing"
            if not owned:
                wanted = "the record as it was"
            self.fail(
                f"store: release of {op.key} by {owner} answered {answer!r} and left "
                f"{after} (record before: {before}; expected {owned} and {wanted})"
            )

    def check_record_step(self, op: Op, application: Application) -> None:
        """A recovery point is owner-fenced and positioned: it applies to its owner's
        in-progress record holding ``position`` steps (the list written, the expiry moved
        as a claim's, the lease end untouched) or already holding exactly this list (a
        resend: nothing changes); anything else is ``LOST``, nothing written."""
        before, after, answer = application.before, application.after, application.answer
        write: StepWrite = op.arg
        now = self.now(application, write.now)
        unchanged = shape(after) == shape(before) and _steps(after) == _steps(before)
        owned = (
            before is not None
            and before.status is Status.INPROGRESS
            and before.owner == write.owner
        )
        if not owned or before is None:
            if answer is not Stepped.LOST or not unchanged:
                self.fail(
                    f"store: record_step of {op.key} by {write.owner} answered {answer!r} and "
                    f"left {after} for the record {before}: a recovery point is written on "
                    "its owner's in-progress record only"
                )
            return
        if before.steps == write.steps:
            if answer is not Stepped.RECORDED or not unchanged:
                self.fail(
                    f"store: record_step of {op.key} resent ({write.steps!r} already held) "
                    f"answered {answer!r} and left {after} (record before: {before})"
                )
            return
        if len(step_names(before)) != write.position:
            if answer is not Stepped.LOST or not unchanged:
                self.fail(
                    f"store: record_step of {op.key} at position {write.position} met a "
                    f"record holding {len(step_names(before))} step(s): answered {answer!r} "
                    f"and left {after} (expected LOST, nothing written; before: {before})"
                )
            return
        if answer is Stepped.TOO_LARGE and unchanged:
            return
        end = before.lease_end
        expiry = before.expiration
        if end is not None:
            expiry = max(expiry, expected_expiry(now, write.ttl, end - now))
        ok = (
            answer is Stepped.RECORDED
            and after is not None
            and after.status is Status.INPROGRESS
            and after.owner == write.owner
            and after.steps == write.steps
            and after.validation == before.validation
            and (end is None or after.lease_end is not None)
            and (end is None or abs((after.lease_end or 0.0) - end) < self.boundary)
            and abs(after.expiration - expiry) <= self.expiry_slack
        )
        if not ok:
            self.fail(
                f"store: record_step of {op.key} by its owner {write.owner} at position "
                f"{write.position} answered {answer!r} and left {after} (record before: "
                f"{before}; expected the list written, the lease end kept, expiry {expiry})"
            )

    def check_extend(self, op: Op, application: Application) -> None:
        """A renewal is owner-fenced and never moves a lease end back: it applies to an
        INPROGRESS record of its owner whose lease ends no later than ``lease`` after the
        store's now (``RENEWED``: the lease then ends there), leaves the owner's record
        whose lease ends later as it is (``ALREADY_LATER``), and changes nothing of any
        other record (``LOST``)."""
        before, after, answer = application.before, application.after, application.answer
        claim: Claim = op.arg
        now = self.now(application, claim.now)
        wanted = now + claim.lease
        owned = (
            before is not None
            and before.status is Status.INPROGRESS
            and before.owner == claim.owner
        )
        if not owned:
            if answer is not Extended.LOST or shape(after) != shape(before):
                self.fail(
                    f"store: extend of {op.key} by {claim.owner} answered {answer!r} and left "
                    f"{after} for the record {before}: a renewal applies to its owner's "
                    "in-progress record only"
                )
            return
        assert before is not None
        end = before.lease_end
        if (
            end is not None
            and after is not None
            and after.lease_end is not None
            and after.lease_end < end - self.boundary
        ):
            self.fail(
                f"store: extend of {op.key} at {now} for {claim.lease} s answered "
                f"{answer!r} and moved the lease end back: {before} -> {after}"
            )
            return
        if end is not None and abs(end - wanted) < self.boundary:
            expected: tuple[Extended, ...] = (Extended.RENEWED, Extended.ALREADY_LATER)
        elif end is not None and end > wanted:
            expected = (Extended.ALREADY_LATER,)
        else:
            expected = (Extended.RENEWED,)
        if answer not in expected:
            self.fail(
                f"store: extend of {op.key} at {now} for {claim.lease} s (to {wanted:.3f}) "
                f"answered {answer!r} for its owner's record {before}; expected "
                f"{' or '.join(str(e) for e in expected)}"
            )
        elif answer is Extended.ALREADY_LATER and shape(after) != shape(before):
            self.fail(
                f"store: extend of {op.key} answered {answer!r} but changed the record: "
                f"{before} -> {after}"
            )
        elif answer is Extended.RENEWED and (
            after is None
            or after.owner != claim.owner
            or after.status is not Status.INPROGRESS
            or after.lease_end is None
            or after.lease_end < wanted - self.boundary
        ):
            self.fail(
                f"store: extend of {op.key} at {now} for {claim.lease} s answered {answer!r} "
                f"but left {after}: a confirmed renewal must move the lease end"
            )
        elif answer is Extended.RENEWED and _steps(after) != before.steps:
            self.fail(
                f"store: extend of {op.key} answered {answer!r} and changed the record's "
                f"steps: {before.steps!r} -> {_steps(after)!r} (a renewal keeps them)"
            )

    def check_claim(
        self, op: Op, claim: Claim, before: Record | None, after: Record | None, answer: Any
    ) -> None:
        if self.near(before, claim.now):
            return
        own = (
            before is not None
            and before.status is Status.INPROGRESS
            and before.owner == claim.owner
        )
        free = before is None or own or expected_state(before, claim.now) is Found.CLAIMABLE
        stepped = (
            before is not None
            and before.status is Status.INPROGRESS
            and bool(before.steps)
            and before.expiration >= claim.now
        )
        if free and stepped:
            self.check_resume(op, claim, before, after, answer)
            return
        if free:
            ok = (
                answer is not None
                and isinstance(answer, Verdict)
                and answer.found is Found.CLAIMED
                and after is not None
                and after.status is Status.INPROGRESS
                and after.owner == claim.owner
                and after.validation == claim.validation
                and after.lease_end is not None
                and abs(after.lease_end - (claim.now + claim.lease)) < self.boundary
                and abs(after.expiration - expected_expiry(claim.now, claim.ttl, claim.lease))
                <= self.expiry_slack
                and not after.steps  # an expired record's steps are dropped
            )
            if not ok:
                self.fail(
                    f"store: claim of {op.key} by {claim.owner} at {claim.now} on a free key "
                    f"(record {before}) answered {answer!r} and left {after}"
                )
            return
        expected = expected_state(before, claim.now)
        if (
            not isinstance(answer, Verdict)
            or answer.found is not expected
            or shape(answer.record) != shape(before)
            or shape(after) != shape(before)
        ):
            self.fail(
                f"store: claim of {op.key} by {claim.owner} at {claim.now} met {before}: "
                f"answered {answer!r} and left {after}; expected {expected}"
            )
        else:
            self.check_durations(op, before, claim.now, answer)

    def check_resume(
        self, op: Op, claim: Claim, before: Record | None, after: Record | None, answer: Any
    ) -> None:
        """A claim that takes over an unexpired in-progress record carrying steps (lapsed,
        released, or its own) keeps them when the validation hashes are equal — its answer
        carries them — and is refused ``RESUMABLE`` otherwise, writing nothing."""
        assert before is not None
        if before.validation != claim.validation and before.owner != claim.owner:
            ok = (
                isinstance(answer, Verdict)
                and answer.found is Found.RESUMABLE
                and shape(answer.record) == shape(before)
                and shape(after) == shape(before)
                and _steps(after) == _steps(before)
            )
            expected = "RESUMABLE, nothing written"
        else:
            ok = (
                isinstance(answer, Verdict)
                and answer.found is Found.CLAIMED
                and answer.record is not None
                and answer.record.steps == before.steps
                and after is not None
                and after.status is Status.INPROGRESS
                and after.owner == claim.owner
                and after.validation == claim.validation
                and after.steps == before.steps
                and after.lease_end is not None
                and abs(after.lease_end - (claim.now + claim.lease)) < self.boundary
                and abs(after.expiration - expected_expiry(claim.now, claim.ttl, claim.lease))
                <= self.expiry_slack
            )
            expected = "CLAIMED carrying the steps, the record's steps kept"
        if not ok:
            self.fail(
                f"store: claim of {op.key} by {claim.owner} at {claim.now} met {before} "
                f"(unexpired, with steps): answered {answer!r} and left {after}; expected "
                f"{expected}"
            )

    def check_durations(self, op: Op, before: Record | None, now: float, answer: Verdict) -> None:
        """A verdict's durations are the record's remaining life (completed) or lease
        (in progress), counted from the ``now`` the store judged by."""
        if before is None:
            return
        if answer.found is Found.COMPLETED:
            expected: float = before.expiration - now
            got = answer.expires_in
        elif answer.found is Found.IN_PROGRESS:
            end = before.lease_end if before.lease_end is not None else before.expiration
            expected, got = end - now, answer.retry_after
        else:
            return
        if got is None or abs(got - expected) > self.boundary:
            self.fail(
                f"store: {op.name} of {op.key} at {now} answered {answer.found} with "
                f"{got!r} seconds left; the record ({before}) leaves {expected:.3f}"
            )

    def check_complete(
        self, op: Op, done: Completion, before: Record | None, after: Record | None, answer: Any
    ) -> None:
        owned = before is not None and before.owner == done.owner
        if not owned:
            if answer is not Written.NOTHING or shape(after) != shape(before):
                self.fail(
                    f"store: completion of {op.key} by {done.owner}, which does not own "
                    f"{before}, answered {answer!r} and left {after} (must fence)"
                )
            return
        assert before is not None
        if done.encoded is None and before.status is Status.COMPLETED and before.response_stored:
            # A response is final: a completion without one (a stream's first, landing
            # late) leaves the owner's record as it is, and answers what it holds.
            if (
                answer is not Written.RESPONSE
                or shape(after) != shape(before)
                or after is None
                or not same(after.response, before.response)
            ):
                self.fail(
                    f"store: completion of {op.key} without a response by its owner "
                    f"{done.owner} met {before}, which holds the owner's response: answered "
                    f"{answer!r} and left {after} (a response is final: nothing is written, "
                    "and the answer is Written.RESPONSE)"
                )
            return
        ok = (
            answer in (Written.RESPONSE, Written.WITHOUT_RESPONSE)
            and after is not None
            and after.status is Status.COMPLETED
            and after.owner == done.owner
            and after.response_stored is (answer is Written.RESPONSE)
            and (answer is not Written.RESPONSE or after.response == done.response)
            # The validation hash outlives the completion: without it a replay could not
            # refuse another payload (a missing hash is not a match).
            and after.validation == done.validation
            and not after.steps  # a completion drops the steps
            and abs(after.expiration - expected_expiry(done.now, done.ttl, 0.0))
            <= self.expiry_slack
        )
        if not ok:
            self.fail(
                f"store: completion of {op.key} by its owner {done.owner} answered "
                f"{answer!r} and left {after}"
            )


def near(record: Record | None, now: float, boundary: float = BOUNDARY) -> bool:
    if record is None:
        return False
    if abs(record.expiration - now) < boundary:
        return True
    return record.lease_end is not None and abs(record.lease_end - now) < boundary


def _applied_then_timed_out(op: Op, application: Application) -> bool:
    """A claim the store abandoned at the call's deadline (a ``TimeoutError``: its answer
    did not come back in time) after the server applied it: the claim's outcome is unknown
    to the caller, who releases it — a live store (Postgres, real time) does this under
    load.  Accepted when the change is exactly this claim's own record."""
    if op.name != "claim" or not isinstance(application.error, TimeoutError):
        return False
    after = application.after
    claim: Claim = op.arg
    return after is not None and after.owner == claim.owner and after.status is Status.INPROGRESS
