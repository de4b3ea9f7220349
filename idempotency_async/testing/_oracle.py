"""The oracle: checks a scenario's trace against the guarantee (G1-G7), and the steps
(recovery points) of its callbacks against the ledger of their effects.

Each check returns violations as text naming the invariant, the calls and the times.
The documented exceptions are recognised, never assumed: a late holder (G1 a-c) is
excused only when the caller was told (``CompletionError``/``LeaseLostError``).

The oracle has a judgement of its own: it imports only the library's data types and
errors, and computes from the contract's text what a store or the manager owed —
verdicts, expiries, the lease, the cutoff (lease end minus the reserve) and validation
hashes (``tests/test_simulator_oracle.py`` checks its imports).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from idempotency_async import errors
from idempotency_async.record import Claim, Record, Status
from idempotency_async.stores.base import Found, Verdict
from idempotency_async.testing._faults import Application, Op
from idempotency_async.testing._managers import clock_offset
from idempotency_async.testing._plans import (
    REDACTED_FIELD,
    ManagerPlan,
    can_renew,
    renewal_reserve,
)
from idempotency_async.testing._store_checks import (
    BOUNDARY,
    StoreChecks,
    renewed,
    same,
    shape,
    step_names,
)
from idempotency_async.testing._trace import (
    CallbackDeclined,
    CallbackExit,
    CallbackFailed,
    Outcome,
    Released,
    Run,
    StepRun,
    Trace,
)

__all__ = ["check"]

# The HTTP status policy as docs/http.md states it (store_server_errors off, as the
# simulator's gates and routes have it): 2xx-4xx are the endpoint's result, stored and
# replayed, except the 4xx that ask for the same request again; 5xx release the key.
_RETRY_LATER = frozenset({408, 409, 425, 429})


def _released_status(status: int) -> bool:
    return status >= 500 or status in _RETRY_LATER


# How a record holds an error declared a result (replay_errors): the record format, spelled
# here again so that the oracle reads it without the library's own code.
_ERROR_FORM = "__idempotency_error__"


def _declared_message(record: Record | None) -> str | None:
    """The message of the declared error ``record`` holds as its result (None: it holds
    none — a result, no response, or not completed)."""
    if record is None or record.status is not Status.COMPLETED or not record.response_stored:
        return None
    response = record.response
    if not isinstance(response, dict) or set(response) != {_ERROR_FORM}:
        return None
    body = response[_ERROR_FORM]
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else ""


@dataclass(slots=True)
class _Held:
    """An owner's confirmed claim."""

    call: int
    claim: Claim
    at: float
    lease_end: float
    """Loop time at which the lease ends without its margin (the call's deadline)."""
    cutoff: float
    """Loop time by which the callback must have been cut off: the lease end minus the
    completion reserve."""
    hard_end: float = 0.0
    """Loop time of the call's hard bound (its deadline, or its lease option): a renewed
    lease never outlasts it."""
    reserve: float = 0.0
    sent: float = 0.0
    """When the claim was sent (loop time)."""
    seq: int = 0
    """The claim's place in the store's log."""


class _Checker:
    def __init__(self, trace: Trace, tolerance: float) -> None:
        self.trace = trace
        self.scenario = trace.scenario
        self.tol = tolerance
        self.violations: list[str] = []
        self.outcomes = [outcome for outcome in trace.outcomes if not outcome.skipped]
        self.applications: dict[str, list[tuple[Op, Application]]] = {}
        for op in trace.store.ops:
            for application in op.applications:
                self.applications.setdefault(op.key, []).append((op, application))
        for history in self.applications.values():
            history.sort(key=lambda pair: pair[1].order)
        self.held: dict[str, _Held] = {}
        for op in trace.store.ops:
            if (
                op.name == "claim"
                and op.call is not None
                and isinstance(op.delivered, Verdict)
                and op.delivered.found is Found.CLAIMED
            ):
                claim: Claim = op.arg
                # The lease the plan gives the call — its deadline sources, its options —
                # never the one its claim asked for (a lease that ignores the options is
                # consistent with itself); it counts from when the claim was sent.
                left, hard, kept = self.planned(op.call, op.started)
                end = op.started + left
                held = _Held(op.call, claim, op.ended or op.started, end, end - kept)
                held.hard_end = op.started + hard
                held.reserve = kept
                held.sent = op.started
                held.seq = op.seq
                self.held[claim.owner] = held
        for op in trace.store.ops:
            # A renewal the store confirmed moves the lease end to its length after the
            # moment the extend was sent (the length the plan gives: the short lease, never
            # past the call's hard bound); the cutoff follows, a reserve before it.
            if op.name != "extend" or renewed(op.delivered) is not True:
                continue
            renewing = self.held.get(op.arg.owner)
            if renewing is None:
                continue
            end = min(op.started + self.renew_lease(renewing.call), renewing.hard_end)
            if end > renewing.lease_end:
                renewing.lease_end = end
                renewing.cutoff = end - renewing.reserve
        self.owners: dict[int, set[str]] = {}
        for op in trace.store.ops:
            if op.name == "claim" and op.call is not None:
                self.owners.setdefault(op.call, set()).add(op.arg.owner)
        self.http_hashes: dict[tuple[int, int], str] = {}

    def manager_plan(self, call: int) -> ManagerPlan:
        return self.scenario.managers[self.scenario.calls[call].manager]

    def renew_lease(self, call: int) -> float:
        renew = self.manager_plan(call).renew_lease
        assert renew is not None
        return renew

    def planned(self, call: int, sent: float) -> tuple[float, float, float]:
        """The lease a claim sent at ``sent`` must ask for, from the call's plan: the time
        left to its effective deadline (the earliest of its sources), else the ``lease``
        option, else ``expires_after``; with renewal the short lease (never past that).
        Returns (lease, the call's hard bound, the completion reserve), in seconds."""
        plan = self.manager_plan(call)
        deadline = self.trace.outcomes[call].deadline
        if deadline is None:
            left = plan.lease if plan.lease is not None else plan.expires_after
        else:
            left = deadline - sent
        renew = plan.renew_lease
        if renew is not None and renew < left:
            return renew, left, renewal_reserve(plan)
        return left, left, reserve(left, plan.completion_reserve)

    # -- helpers ----------------------------------------------------------------------

    @property
    def real_time(self) -> bool:
        return self.tol >= 0.01

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def skew(self, call: int, loop_time: float) -> float:
        """How far the clock the store judged ``call`` by was ahead of true time."""
        if self.scenario.server_clock:
            return 0.0
        plan = self.scenario.managers[self.scenario.calls[call].manager]
        return clock_offset(plan, loop_time - self.trace.start)

    @property
    def skewed(self) -> bool:
        """Whether the store judged by clocks that disagree (exception (b) may apply)."""
        if self.scenario.server_clock:
            return False
        plans = self.scenario.managers
        return len({plan.skew for plan in plans}) > 1 or any(plan.jump for plan in plans)

    def wall(self, loop_time: float, call: int) -> float:
        return loop_time - self.trace.start + self.trace.base + self.skew(call, loop_time)

    def max_wall(self, loop_time: float) -> float:
        skew = 0.0
        if not self.scenario.server_clock:
            at = loop_time - self.trace.start
            skew = max(clock_offset(plan, at) for plan in self.scenario.managers)
            if any(plan.jump for plan in self.scenario.managers):
                # A clock that jumped back had run ahead before: count its past lead too.
                skew = max(skew, *(plan.skew for plan in self.scenario.managers))
        return loop_time - self.trace.start + self.trace.base + skew

    def plan_of(self, call: int) -> Any:
        return self.scenario.calls[call]

    def sources(self, call: int) -> set[str]:
        """The call's deadline sources."""
        plan = self.plan_of(call)
        return {plan.deadline, *(mode for mode, _ in plan.also)} - {"none"}

    def ambient(self, call: int) -> bool:
        """The call's deadline includes an ``asyncio.timeout`` around it (a batch's timeout
        or deadline is one)."""
        sources = self.sources(call)
        batch = self.timeout_is_ambient(call) and bool(sources & {"timeout", "deadline"})
        return "ambient" in sources or batch

    def timeout_is_ambient(self, call: int) -> bool:
        """A batch, an MCP tool call and a route take no timeout: theirs is ambient."""
        return self.scenario.calls[call].door in ("batch", "mcp", "route")

    def http(self, call: int) -> bool:
        return bool(self.scenario.calls[call].door == "http")

    def batch(self, call: int) -> bool:
        return bool(self.scenario.calls[call].door == "batch")

    def route(self, call: int) -> bool:
        return bool(self.scenario.calls[call].door == "route")

    def mcp(self, call: int) -> bool:
        return bool(self.scenario.calls[call].door == "mcp")

    def responds(self, call: int) -> bool:
        """An HTTP request or a route: its caller reads a response, not the result."""
        return self.http(call) or self.route(call)

    def failed_records(self, outcome: Outcome) -> list[str] | None:
        """The records a batch reported failed (``None``: not a batch's answer)."""
        value = outcome.value if outcome.returned_value else None
        if not self.batch(outcome.call) or outcome.error is not None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("batchItemFailures"), list):
            return None
        return [item.get("itemIdentifier") for item in value["batchItemFailures"]]

    def operator(self, call: int) -> bool:
        return bool(self.scenario.calls[call].door == "operator")

    def force_released(self, key: str, after: int = -1, before: float = math.inf) -> bool:
        """Whether an operator's force_release of ``key`` applied in that span of store
        applications (its documented hazards are exempt — an operator's only)."""
        return any(
            self.by_operator(op) and after <= application.order < before
            for op, application in self.applications.get(key, ())
        )

    def by_operator(self, op: Op) -> bool:
        return op.name == "force_release" and op.call is not None and self.operator(op.call)

    def key_of(self, call: int) -> str | None:
        return self.trace.call_keys.get(call)

    def record_at(self, key: str, order: int) -> Record | None:
        """The record of ``key`` after the first ``order`` store applications."""
        record = None
        for _, application in self.applications.get(key, ()):
            if application.order >= order:
                break
            if application.done:
                record = application.after
        return record

    def ops_of(self, call: int) -> Iterator[Op]:
        return (op for op in self.trace.store.ops if op.call == call)

    def troubled(
        self, call: int, names: tuple[str, ...] = ("claim", "get", "complete", "release")
    ) -> bool:
        """Whether a store operation of ``call`` failed, was faulted or was interrupted."""
        return any(
            op.name in names
            and (op.fault is not None or _store_failure(op.raised) or op.ended is None)
            for op in self.ops_of(call)
        )

    def cooperative(self, run: Run) -> bool:
        """Whether the callback let itself be cut off in time: it did not swallow the
        cancellation, and neither it nor another callback blocked the loop meanwhile."""
        return not (
            run.swallowed or run.blocked or self.trace.paused_during(run.started, run.ended)
        )

    def max_reserve(self, call: int) -> float:
        plan = self.scenario.managers[self.scenario.calls[call].manager]
        return max(0.5, plan.completion_reserve or 0.0)

    def completed_by(self, owner: str) -> tuple[float, Record] | None:
        """When ``owner``'s completion was last written, and the record it wrote."""
        found = None
        for op in self.trace.store.ops:
            if op.name != "complete" or op.arg.owner != owner:
                continue
            for application in op.applications:
                after = application.after
                if (
                    application.done
                    and after is not None
                    and after.owner == owner
                    and after.status is Status.COMPLETED
                ):
                    found = (application.at, after)
        return found

    # -- G1, G2: at most once, no way back ---------------------------------------------

    def check_runs(self) -> None:
        seen: dict[str, int] = {}
        for run in self.trace.runs:
            key = self.key_of(run.call)
            if key is None:
                continue
            if run.owner is None or run.owner not in self.held:
                self.fail(f"G1: call {run.call}'s callback started without a confirmed claim")
                continue
            if run.owner in seen:
                self.fail(
                    f"G1: calls {seen[run.owner]} and {run.call} ran the callback under "
                    f"one claim ({run.owner})"
                )
            seen[run.owner] = run.call
            held = self.held[run.owner]
            end = run.answered if run.answered is not None else run.ended
            late = end is not None and end > held.cutoff + self.tol + self.lag(held.cutoff, end)
            if late and end is not None and self.writing_step(run, held.cutoff, end):
                # A step's recovery point was in flight from before the cutoff: that write
                # is bounded at the lease end, not at the cutoff (docs/steps.md).
                late = end > held.lease_end + self.tol + self.lag(held.lease_end, end)
            if late and self.cooperative(run):
                where = "started" if run.started > held.cutoff else "was still running"
                self.fail(
                    f"G1: call {run.call}'s callback {where} after its cutoff (lease end "
                    f"t={held.lease_end:.3f} minus the reserve: t={held.cutoff:.3f}; callback "
                    f"t={run.started:.3f}-{run.ended}): a holder must be cut off a reserve "
                    "before its lease ends"
                )
            if run.returned:
                self.check_no_way_back(run)
            elif isinstance(run.error, CallbackDeclined):
                self.check_declared_kept(run)

    def writing_step(self, run: Run, cutoff: float, end: float) -> bool:
        """Whether ``run`` spent the time from before ``cutoff`` to its ``end`` writing a
        step's recovery point (the step's function had returned by the cutoff)."""
        tol = self.tol
        return any(
            step.returned is not None
            and step.returned <= cutoff + tol
            and (step.ended is None or step.ended >= end - tol)
            for step in run.steps
        )

    def check_declared_kept(self, run: Run) -> None:
        """A declared error is a result: the key is completed with it, never released
        (the simulated callback raises it only after its work, never from its cutoff)."""
        for op in self.ops_of(run.call):
            if (
                op.name == "release"
                and op.arg == run.owner
                and run.ended
                and op.started >= run.ended
            ):
                self.fail(
                    f"call {run.call}'s callback raised a declared error (a result), and "
                    f"{op.key} was released instead of completed with it"
                )

    def check_no_way_back(self, run: Run) -> None:
        for op in self.ops_of(run.call):
            ended = run.answered if run.answered is not None else run.ended
            if op.name == "release" and op.arg == run.owner and ended and op.started >= ended:
                self.fail(f"G2: call {run.call} released {op.key} after its callback returned")

    def check_at_most_once(self) -> None:
        by_key: dict[str, list[tuple[float, Record, Run]]] = {}
        for run in self.trace.runs:
            key = self.key_of(run.call)
            # A declared error that completed the record is a side effect that completed.
            declared = isinstance(run.error, CallbackDeclined)
            if key is None or not (run.returned or declared) or run.owner is None:
                continue
            completed = self.completed_by(run.owner)
            if completed is None:
                if run.returned:
                    self.check_unrecorded(run)
            else:
                by_key.setdefault(key, []).append((completed[0], completed[1], run))
                if run.returned:
                    self.check_recorded_told(run)
        for key, runs in by_key.items():
            runs.sort(key=lambda item: item[0])
            for (_, first, one), (_, _, two) in itertools.pairwise(runs):
                held = self.held.get(two.owner or "")
                if held is None:
                    continue
                if not self.expired_before_removal(key, first):
                    self.fail(
                        f"G1: the side effect of key {key} completed twice while its record "
                        f"lived: call {one.call} (completed, expires {first.expiration}) and call "
                        f"{two.call} (claimed at {held.claim.now:.3f})"
                    )

    def expired_before_removal(self, key: str, completed: Record) -> bool:
        """Whether the completed record had expired when it left the store: by the clock
        of the claim that replaced it, or by some manager's clock when it was dropped (a
        clock ahead of the others frees it early: exception (b))."""
        history = self.applications.get(key, [])
        for (_, application), nxt in zip(history, [*history[1:], None], strict=False):
            if shape(application.after) != shape(completed) or nxt is None:
                continue
            next_op, following = nxt
            if self.by_operator(next_op):
                return True  # an operator's documented hazard
            judged = self.judged_at(following)
            if shape(following.before) != shape(completed):
                return completed.expiration < self.max_wall(judged)  # dropped
            if shape(following.after) != shape(completed) and next_op.name == "claim":
                now: float = max(next_op.arg.now, self.max_wall(judged))
                return completed.expiration < now
        return True  # never removed: the second claim met something else (checked above)

    def judged_at(self, application: Application) -> float:
        """The latest loop time the store may have judged ``application`` by: a store with
        a real clock of its own judged it somewhere until its answer came back."""
        if self.trace.own_clock and application.until is not None:
            return application.until
        return application.at

    def check_recorded_told(self, run: Run) -> None:
        outcome = self.trace.outcomes[run.call]
        if outcome.returned_value and outcome.value is run.value:
            return
        error = outcome.error
        if self.told_otherwise(run, outcome):
            return
        if self.batch(run.call) and error is None:
            return  # process_batch reports records, not results
        if isinstance(error, errors.CompletionError) and (
            error.outcome_unknown or self.throttled_after_apply(run.call)
        ):
            return
        if isinstance(error, asyncio.CancelledError) and outcome.cancel_requested is not None:
            return
        if self.ambient_deadline_fired(outcome):
            return  # its own deadline fired while the (applied) write was answered
        if isinstance(error, errors.LeaseLostError) and self.force_released_after(run.call):
            return  # an operator's documented hazard: the resent completion met no record
        self.fail(f"G5: call {run.call}'s result was recorded, but the caller got {error!r}")

    def force_released_after(self, call: int) -> bool:
        """An operator's ``force_release`` of the key applied after the call's completion
        did: a resend of that completion (its first answer lost) meets no record, and the
        caller is told its lease was lost although its result was recorded for a while."""
        for op in self.ops_of(call):
            applied = [
                a.order
                for a in op.applications
                if op.name == "complete" and a.done and a.error is None
            ]
            if not applied:
                continue
            for other, application in self.applications.get(op.key, ()):
                if (
                    other.name == "force_release"
                    and self.by_operator(other)
                    and application.order > min(applied)
                ):
                    return True
        return False

    def throttled_after_apply(self, call: int) -> bool:
        """A completion that applied, then met throttling on the SDK's retry: the contract
        asks an unknown outcome only of claims, so either answer is accepted here."""
        return any(
            op.name == "complete"
            and isinstance(op.raised, errors.StoreThrottledError)
            and any(application.done for application in op.applications)
            for op in self.ops_of(call)
        )

    def told_otherwise(self, run: Run, outcome: Outcome) -> bool:
        """Documented outcomes besides the result: a plain function's ``ConfigError`` (it
        ran, its record completes without a response), and an ``execute_call`` callback's
        own exception or completion error after its point of no return."""
        error = outcome.error
        plan = self.plan_of(run.call)
        if plan.shape == "plain" and isinstance(error, errors.ConfigError):
            return True
        if run.answered is not None:
            if any(other.error is error for other in outcome.runs):
                return True
            if isinstance(error, errors.CompletionError):
                return True
        return False

    def ambient_deadline_fired(self, outcome: Outcome) -> bool:
        """The caller's own ``async with deadline()`` fired: it sees asyncio's TimeoutError."""
        return (
            type(outcome.error) is TimeoutError
            and self.ambient(outcome.call)
            and self.deadline_reached(outcome)
        )

    def check_unrecorded(self, run: Run) -> None:
        """A side effect with no record: must be an exception (a)-(c), and surfaced."""
        outcome = self.trace.outcomes[run.call]
        error = outcome.error
        told = isinstance(error, errors.CompletionError) and error.result is run.value
        told = told or self.told_otherwise(run, outcome)
        # The HTTP gate cannot tell its client: the response went out (the gate logs it).
        told = told or (self.http(run.call) and run.answered is not None)
        # A route's completion error goes out of resolve_async (its result is the stored
        # proxy response, not the Response the route returned).
        told = told or (self.route(run.call) and isinstance(error, errors.CompletionError))
        # A never-stored route completes through its Call (as an execute_call callback):
        # one that ignored its cutoff writes nothing after it, and its caller is told by
        # DeadlineExceededError (docs/manager.md, "Before complete, it is execute").
        told = told or (
            self.route(run.call)
            and self.redaction_of(run.call) == "never_store"
            and not self.cooperative(run)
            and isinstance(error, errors.DeadlineExceededError)
        )
        # process_batch logs a completion that failed and does not redeliver the record.
        told = told or (self.batch(run.call) and error is None)
        # An ambient deadline (asyncio.timeout) that fires with the completion's own bound
        # wins, and the caller sees its TimeoutError: the contract's outcome for that case.
        told = told or self.ambient_deadline_fired(outcome)
        cancelled = isinstance(error, asyncio.CancelledError) and outcome.cancel_requested
        if not (told or cancelled):
            self.fail(
                f"G1: call {run.call}'s callback returned but its result was not recorded, and "
                f"the caller got {outcome.value if error is None else error!r} instead of "
                "LeaseLostError/CompletionError"
            )
            return
        held = self.held[run.owner or ""]
        key_of_run = self.key_of(run.call) or ""
        late = run.ended is not None and run.ended > held.lease_end
        excused = (
            not self.cooperative(run)  # (a)
            or late
            or cancelled
            or type(error) is TimeoutError
            or self.troubled(run.call, ("complete",))  # (c)
            or self.completion_was_late(run.call, held)
            or self.overtaken_by_skew(run, held)  # (b)
            or self.force_released(key_of_run)  # an operator's documented hazard
        )
        if not excused:
            self.fail(
                f"G1: call {run.call}'s side effect was not recorded ({error!r}) though no "
                "documented exception applies: no fault, no skew, a cooperative callback"
            )

    def completion_was_late(self, call: int, held: _Held) -> bool:
        return any(
            op.name == "complete" and (op.ended or 0.0) > held.lease_end for op in self.ops_of(call)
        )

    def overtaken_by_skew(self, run: Run, held: _Held) -> bool:
        """Whether the run's record left the store before its lease ended in true time:
        replaced or dropped by a manager whose clock runs ahead (exception (b))."""
        if not self.skewed:
            return False
        key = self.key_of(run.call) or ""
        history = self.applications.get(key, [])
        for (_, application), nxt in zip(history, [*history[1:], None], strict=False):
            after = application.after
            if after is None or after.owner != run.owner or nxt is None:
                continue
            _, following = nxt
            left = following.before is None or following.before.owner != run.owner
            replaced = following.after is None or following.after.owner != run.owner
            if (left or replaced) and following.at < held.lease_end:
                return True
        return False

    # -- G3: a completed key always replays -----------------------------------------------

    def check_replays(self) -> None:
        for outcome in self.outcomes:
            key = self.key_of(outcome.call)
            if key is None or outcome.exited is None or self.operator(outcome.call):
                continue
            if self.refused_at_the_call(outcome.call):
                continue  # judged by check_refused: ConfigError before any store request
            if self.force_released(key, outcome.entered_at, outcome.exited_at):
                continue
            record = self.record_at(key, outcome.entered_at)
            if record is None or record.status is not Status.COMPLETED:
                continue
            if record.expiration < self.wall(outcome.exited, outcome.call) + 1:
                continue
            if self.sibling_holding(outcome, key) or self.skewed_cache(outcome):
                continue
            if self.released_elsewhere(outcome, key) or self.dropped_early(outcome, key, record):
                continue
            if self.joined_before_release(outcome, key):
                continue
            if not self.replayed(outcome, record) and not self.replayed_attached(outcome, record):
                got = outcome.value if outcome.error is None else outcome.error
                self.fail(
                    f"G3: call {outcome.call} arrived while {key} was COMPLETED (by "
                    f"{record.owner}, response {record.response!r}) and got {got!r}, not the replay"
                )

    def dropped_early(self, outcome: Outcome, key: str, record: Record) -> bool:
        """Whether the record was gone when the call's first request reached the store,
        dropped as expired by a clock ahead of the others (exception (b); the store checks
        judge the drop itself)."""
        for op, application in self.applications.get(key, ()):
            if op.call != outcome.call:
                continue
            return bool(
                shape(application.before) != shape(record)
                and record.expiration < self.max_wall(application.at)
            )
        return False

    def check_evaluated_replays(self) -> None:
        """G3 as stated: a claim the store evaluated against an unexpired COMPLETED record,
        whose verdict reached the manager, ends in that record's replay."""
        for op in self.trace.store.ops:
            if op.name != "claim" or op.call is None or not isinstance(op.delivered, Verdict):
                continue
            for application in op.applications[-1:]:
                record = application.before
                if (
                    record is None
                    or record.status is not Status.COMPLETED
                    or record.expiration < op.arg.now + BOUNDARY
                    or self.trace.own_clock
                ):
                    continue
                outcome = self.trace.outcomes[op.call]
                if outcome.exited is not None and not self.replayed(outcome, record):
                    got = outcome.value if outcome.error is None else outcome.error
                    self.fail(
                        f"G3: the store evaluated call {op.call}'s claim of {op.key} against its "
                        f"COMPLETED record (by {record.owner}), and the call got {got!r}"
                    )

    def released_elsewhere(self, outcome: Outcome, key: str) -> bool:
        """A local cache does not see another process's force release: it may replay the
        released record until its entry expires (a documented hazard of force_release)."""
        manager = self.plan_of(outcome.call).manager
        if not self.scenario.managers[manager].use_local_cache:
            return False
        return any(
            op.name == "force_release"
            and op.call is not None
            and self.plan_of(op.call).manager != manager
            and application.order < outcome.exited_at
            for op, application in self.applications.get(key, ())
        )

    def joined_before_release(self, outcome: Outcome, key: str) -> bool:
        """A call that joined, in its process, a claim still unanswered when it arrived
        gets what that claim met; when another process's force_release applied after the
        claim reached the store, that is the released record (the release is unseen by
        this process, as by a local cache: a documented hazard of force_release).  A claim
        that was granted makes its caller this process's holder, which the release does not
        stop: the joined call is refused in process, or waits for that holder."""
        manager = self.plan_of(outcome.call).manager
        history = self.applications.get(key, ())
        for op, application in history:
            if (
                op.name != "claim"
                or op.call is None
                or op.call == outcome.call
                or self.plan_of(op.call).manager != manager
                or application.order >= outcome.entered_at
                or op.ended is None
                or op.ended < outcome.entered
                or not self.got_what_it_joined(outcome, op, application)
            ):
                continue
            if any(
                other.name == "force_release"
                and other.call is not None
                and self.plan_of(other.call).manager != manager
                and application.order < released.order < outcome.exited_at
                for other, released in history
            ):
                return True
        return False

    def got_what_it_joined(self, outcome: Outcome, claim: Op, met: Application) -> bool:
        """The joined claim's replay, or the refusal its grant makes due in process."""
        granted = met.after is not None and met.after.owner == claim.arg.owner
        if granted:
            return isinstance(outcome.error, errors.AlreadyInProgressError)
        return met.before is not None and self.replayed(outcome, met.before)

    def skewed_cache(self, outcome: Outcome) -> bool:
        """A local cache fed by a store that judged by a skewed client clock keeps an entry
        as long as the store said (exception (b)); a server-clock store has no excuse."""
        manager = self.scenario.managers[self.plan_of(outcome.call).manager]
        return self.skewed and manager.use_local_cache

    def replayed_attached(self, outcome: Outcome, record: Record) -> bool:
        """The record completed without its response got it attached later by its owner
        (``execute_call``): a replay of either is the key's one answer."""
        key = record.key
        return any(
            application.done
            and application.after is not None
            and application.after.owner == record.owner
            and application.after.status is Status.COMPLETED
            and outcome.entered_at <= application.order < outcome.exited_at
            and self.replayed(outcome, application.after)
            for _, application in self.applications.get(key, ())
        )

    def sibling_holding(self, outcome: Outcome, key: str) -> bool:
        """Whether a call of the same manager held the key (its claim confirmed) then."""
        return self.holder_of(outcome, key) is not None

    def holder_of(self, outcome: Outcome, key: str, at: float | None = None) -> _Held | None:
        """A call of the same manager holding the key at ``at`` (default: when the call
        entered): its claim confirmed, and neither ended nor completed through its Call
        (a completed key is the store's to answer, G3)."""
        manager = self.scenario.calls[outcome.call].manager
        when = outcome.entered if at is None else at
        found = None
        for owner, held in self.held.items():
            other = self.trace.outcomes[held.call]
            if at is not None and self.claim_order(held) >= outcome.exited_at:
                continue  # claimed after the call was answered (at the same instant)
            if (
                held.call != outcome.call
                and self.scenario.calls[held.call].manager == manager
                and self.key_of(held.call) == key
                and held.at <= when
                and (other.exited is None or other.exited >= when)
                and self.answered_completion(owner) >= when
                and (found is None or held.seq > found.seq)
            ):
                found = held  # the latest claim: one ending at that instant handed over
        return found

    def claim_order(self, held: _Held) -> float:
        """Where ``held``'s claim applied in the store's order of applications."""
        for op in self.trace.store.ops:
            if op.seq == held.seq:
                return min((application.order for application in op.applications), default=0)
        return 0

    def answered_completion(self, owner: str) -> float:
        """When ``owner``'s first completion was answered (inf: never): from then on the
        key is completed, and in-process duplicates go to the store or the cache."""
        for op in self.trace.store.ops:
            if (
                op.name == "complete"
                and op.arg.owner == owner
                and op.delivered is not None
                and op.ended is not None
            ):
                return op.ended
        return math.inf

    def replayed(self, outcome: Outcome, record: Record) -> bool:
        error = outcome.error
        failed = self.failed_records(outcome)
        declared = _declared_message(record)
        if declared is not None:
            # A stored declared error: the replay is that error raised again (a batch
            # reports the record failed), never a value.
            if failed is not None:
                return bool(failed) or self.validation_of(outcome.call) != record.validation
            if isinstance(error, CallbackDeclined):
                return str(error) == declared and self.validation_matches(outcome.call, record)
            if error is None:
                return False
        if failed is not None:
            if not failed:
                # A batch's answer says only which records failed: a replay is a success.
                # A callback that ran again while the record lived is G1's to judge.
                return True
            return (
                self.validation_of(outcome.call) != record.validation
                or self.troubled(outcome.call)
                or (outcome.deadline is not None and self.deadline_reached(outcome))
            )
        if error is None and self.responds(outcome.call):
            return bool(
                record.response_stored
                and outcome.value == self.http_value(record)
                and self.validation_matches(outcome.call, record)
            )
        if error is None:
            return bool(
                record.response_stored
                and same(outcome.value, record.response)
                and self.validation_matches(outcome.call, record)
            )
        if isinstance(error, errors.ResponseNotStoredError):
            return not record.response_stored and self.validation_matches(outcome.call, record)
        if isinstance(error, errors.PayloadValidationError):
            return self.validation_of(outcome.call) != record.validation
        return self.allowed_anyway(outcome)

    def allowed_anyway(self, outcome: Outcome) -> bool:
        """Outcomes a caller may get whatever the record: its own cancellation, its own
        deadline, or a failure of its own store request."""
        error = outcome.error
        if isinstance(error, asyncio.CancelledError):
            return outcome.cancel_requested is not None
        if isinstance(error, TimeoutError):
            return self.deadline_reached(outcome)
        if isinstance(error, errors.PersistenceError | errors.InconsistentStateError):
            return self.troubled(outcome.call)
        return False

    def validation_matches(self, call: int, record: Record) -> bool:
        """A replay requires the caller's validation hash to match the record's; a record
        that lost its hash matches nothing (every writer here is this library, which
        keeps it)."""
        mine = self.validation_of(call)
        return mine is None or record.validation == mine

    def check_keys(self) -> None:
        """Every claim is for the key the call's plan gives (the key ``key_for`` says, or
        the gate's, or the batch's message): one request, one key, on every delivery."""
        for op in self.trace.store.ops:
            if op.name != "claim" or op.call is None:
                continue
            planned = self.key_of(op.call)
            if planned is not None and op.key != planned:
                self.fail(
                    f"key: call {op.call} claimed {op.key}; its plan's key is {planned} (a "
                    "redelivery or a duplicate would not find its record)"
                )

    def check_validation(self) -> None:
        """Every claim carries the validation hash of its caller's payload (HTTP: one hash
        per request body, another for another body)."""
        seen: dict[tuple[int, int], str] = {}
        for op in self.trace.store.ops:
            if op.name != "claim" or op.call is None or not self.http(op.call):
                continue
            plan = self.plan_of(op.call)
            seen.setdefault((plan.key, plan.amount), op.arg.validation)
        for (key, amount), digest in seen.items():
            for (other_key, other_amount), other in seen.items():
                if key == other_key and amount < other_amount and digest == other:
                    self.fail(
                        f"validation: HTTP requests with bodies {amount} and {other_amount} "
                        f"for Idempotency-Key k{key} carry one fingerprint ({digest!r})"
                    )
        self.http_hashes = seen
        for op in self.trace.store.ops:
            if op.name != "claim" or op.call is None:
                continue
            expected = self.validation_of(op.call)
            if op.arg.validation != expected:
                self.fail(
                    f"validation: call {op.call} claimed {op.key} with validation hash "
                    f"{op.arg.validation!r}; its payload's is {expected!r}"
                )

    def validation_of(self, call: int) -> str | None:
        plan = self.scenario.calls[call]
        if plan.key is None:
            return None
        if self.http(call):
            # The gate always validates, by the request's fingerprint: one hash per body
            # (checked in check_validation), learned from the first claim carrying it.
            return self.http_hashes.get((plan.key, plan.amount))
        if self.mcp(call):
            # A tool validates by its arguments (all of them), whatever the options.
            return validation_hash((("amount", plan.amount), ("id", plan.key)))
        if not self.scenario.validate:
            return None
        return validation_hash(plan.amount)

    def http_value(self, record: Record) -> Any:
        """The response an HTTP record holds, as its client got it from the endpoint run
        that wrote it (never decoded from the stored format: that is the gate's)."""
        for run in self.trace.runs:
            if run.owner == record.owner and run.returned:
                return run.value
        return None

    def deadline_reached(self, outcome: Outcome) -> bool:
        assert outcome.exited is not None
        reserve = self.max_reserve(outcome.call)
        if outcome.deadline is not None and outcome.exited >= outcome.deadline - reserve - self.tol:
            return True
        if self.renewing(outcome.call):
            # Renewed: cut off at the lease as renewed, or when a renewal was refused.
            for op in self.ops_of(outcome.call):
                if op.name == "extend" and renewed(op.delivered) is False:
                    return True
        elif outcome.deadline is not None:
            return False
        for owner in self.owners.get(outcome.call, ()):
            held = self.held.get(owner)
            if held is not None and outcome.exited >= held.lease_end - reserve - self.tol:
                return True
        # A claim the store itself abandoned at the claim's lease end (a TimeoutError: its
        # answer did not come back in time) ran out the lease it asked for.
        return any(
            op.name == "claim"
            and isinstance(op.raised, TimeoutError)
            and op.ended is not None
            and op.ended - op.started >= op.arg.lease - self.tol
            for op in self.ops_of(outcome.call)
        )

    def renewing(self, call: int) -> bool:
        return self.scenario.managers[self.plan_of(call).manager].renew_lease is not None

    # -- G4: nothing stays blocked --------------------------------------------------------

    def check_unblocked(self) -> None:
        for op in self.trace.store.ops:
            verdict = op.delivered
            if (
                op.call is not None
                and isinstance(verdict, Verdict)
                and verdict.found is Found.IN_PROGRESS
                and verdict.record is not None
                and verdict.record.owner in self.owners.get(op.call, ())
                # An in-batch duplicate is another request of the same call.
                and self.plan_of(op.call).copies == 1
            ):
                self.fail(
                    f"G4: call {op.call} was told its own claim ({verdict.record.owner}) "
                    "holds the key: a record carrying a claim's owner token is that claim"
                )
        for outcome in self.outcomes:
            self.check_left_unblocked(outcome)
        for key, verdict in self.trace.probes.items():
            if verdict.found is Found.IN_PROGRESS:
                self.fail(
                    f"G4: {key} is still in progress after every lease ended: {verdict.record}"
                )

    def check_left_unblocked(self, outcome: Outcome) -> None:
        key = self.key_of(outcome.call)
        if key is None or outcome.exited is None or self.operator(outcome.call):
            return
        if self.failed_records(outcome):
            return  # a failed record: its outcome (cutoff, store error...) is not seen
        record = self.record_at(key, outcome.exited_at)
        owners = self.owners.get(outcome.call, set())
        if record is None or record.status is not Status.INPROGRESS or record.owner not in owners:
            return
        error = outcome.error
        if (
            isinstance(error, asyncio.CancelledError | TimeoutError | errors.CompletionError)
            # A claim whose answer was lost gets one owner-fenced release: only a failed
            # release (or completion) explains a key left in progress.
            or self.troubled(outcome.call, ("complete", "release"))
            or any(not self.cooperative(run) for run in outcome.runs)
            or isinstance(error, CallbackExit)  # documented: treated like a crash
        ):
            return
        self.fail(
            f"G4: call {outcome.call} ended ({error!r}) leaving {key} in progress under "
            "its own claim, with no failure to explain it"
        )

    # -- G5, G6: documented outcomes, one answer, no writes after cancellation ---------------

    def check_outcomes(self) -> None:
        for index in self.trace.unfinished:
            self.fail(f"G5: call {index} never finished")
        for outcome in self.outcomes:
            if outcome.stray is not None:
                self.fail(
                    f"G5: call {outcome.call} had returned ({outcome.error or 'a value'!r}) when "
                    f"its caller's own code was interrupted by {outcome.stray!r}: the call left "
                    "something armed behind it"
                )
            if outcome.exited is None or self.operator(outcome.call):
                continue
            self.check_refused(outcome)
            problem = self.outcome_problem(outcome)
            if problem is not None:
                self.fail(f"G5: call {outcome.call}: {problem}")
            self.check_bounded(outcome)
            self.check_cancel_propagated(outcome)

    def check_cancel_propagated(self, outcome: Outcome) -> None:
        """A caller cancelled while its call ran gets ``CancelledError``: its own
        cancellation is never swallowed nor turned into another outcome — not even when
        its deadline or its cutoff fired at the same moment (as ``asyncio.timeout`` does,
        a cancellation from outside wins) — unless its callback swallowed it (a)."""
        cancelled = outcome.cancel_requested
        if cancelled is None or isinstance(outcome.error, asyncio.CancelledError):
            return
        if any(run.swallowed for run in outcome.runs):
            return
        assert outcome.exited is not None
        if self.real_time and outcome.exited - cancelled <= self.tol + self.lag(
            cancelled, outcome.exited
        ):
            # Real time: a cancellation that races the call's own end is not judged within
            # the tolerance (virtual time judges it exactly).
            return
        got = outcome.value if outcome.error is None else outcome.error
        self.fail(
            f"G5: call {outcome.call} was cancelled at t={cancelled:.3f} and got "
            f"{got!r}: a caller's own cancellation propagates"
        )

    def refused_at_the_call(self, call: int) -> bool:
        """Whether the call's deadline is not a finite number (refused before any I/O)."""
        plan = self.plan_of(call)
        return plan.deadline != "none" and not math.isfinite(plan.timeout)

    def check_refused(self, outcome: Outcome) -> None:
        """A deadline that is not a finite number is refused at the call, before any
        store request."""
        plan = self.plan_of(outcome.call)
        if not self.refused_at_the_call(outcome.call):
            return
        if not isinstance(outcome.error, errors.ConfigError):
            got = outcome.value if outcome.error is None else outcome.error
            self.fail(
                f"deadlines: call {outcome.call} with timeout={plan.timeout} got {got!r}, "
                "not ConfigError"
            )
        if any(True for _ in self.ops_of(outcome.call)) or outcome.runs:
            self.fail(
                f"deadlines: call {outcome.call} with timeout={plan.timeout} reached the "
                "store or ran its callback"
            )

    def batch_problem(self, outcome: Outcome) -> str | None:
        failed = self.failed_records(outcome)
        if failed is None:
            return f"process_batch answered {outcome.value!r}, not a batch response"
        first, *duplicates = (f"m{outcome.call}-{copy}" for copy in range(2))
        if (
            first not in failed
            and any(copy in failed for copy in duplicates[: self.plan_of(outcome.call).copies - 1])
            and not self.troubled(outcome.call)  # a store failure may fail a copy's replay
            and not self.force_released(self.key_of(outcome.call) or "")  # operator's hazard
            # the record expired meanwhile, so a copy ran for itself, and failed on its own
            and all(run.returned for run in outcome.runs)
            # exception (a): a callback that ignored its cutoff outlived its lease
            and all(self.cooperative(run) for run in outcome.runs)
            and not self.skewed  # exception (b): another clock took the key over meanwhile
        ):
            return f"an in-batch duplicate failed though the first record succeeded: {failed}"
        return self.acknowledged_unprocessed(outcome, failed)

    def acknowledged_unprocessed(self, outcome: Outcome, failed: list[str]) -> str | None:
        """A record left out of ``batchItemFailures`` is deleted from its queue: it must
        have been processed — its handler ran to its end in this batch (a copy rides on
        its first), or its key held a completed record it could replay.  A record meeting
        a key still in progress elsewhere fails, to be redelivered."""
        plan = self.plan_of(outcome.call)
        # The ids the door gives its SQS records (one per message when keyed by message).
        ids = {f"m{outcome.call}-{copy}" for copy in range(plan.copies)}
        if plan.by_message:
            ids = {f"msg-k{plan.key}-a{plan.amount}"}
        acknowledged = sorted(ids - set(failed))
        key = self.key_of(outcome.call)
        if not acknowledged or key is None or any(run.returned for run in outcome.runs):
            return None
        if any(
            application.done
            and application.after is not None
            and application.after.status is Status.COMPLETED
            and application.order < outcome.exited_at
            for _, application in self.applications.get(key, ())
        ):
            return None
        return (
            f"records {acknowledged} were acknowledged (left out of batchItemFailures) though "
            f"no handler of theirs returned and no completed record of {key} existed: their "
            "messages are lost"
        )

    def outcome_problem(self, outcome: Outcome) -> str | None:
        error = outcome.error
        if self.batch(outcome.call) and error is None:
            return self.batch_problem(outcome)
        returned = [run for run in outcome.runs if run.returned]
        key = self.key_of(outcome.call)
        if error is None:
            if returned:
                return (
                    None
                    if outcome.value is returned[-1].value
                    else "got a value that is not its own result"
                )
            if key is None:
                return "ran without idempotency but returned without running its callback"
            responses = [
                self.http_value(application.after)
                if self.responds(outcome.call)
                else application.after.response
                for _, application in self.applications.get(key, ())
                if application.done
                and application.after is not None
                and application.after.status is Status.COMPLETED
                and application.after.response_stored
                and self.validation_matches(outcome.call, application.after)
            ]
            if any(same(outcome.value, response) for response in responses):
                return None
            return f"got {outcome.value!r}, which no completed record of {key} held (G6)"
        mine = any(run.error is error for run in outcome.runs)
        if isinstance(error, CallbackDeclined) and not mine:
            held = [
                _declared_message(application.after)
                for _, application in self.applications.get(key or "", ())
                if application.done
                and application.after is not None
                and self.validation_matches(outcome.call, application.after)
            ]
            if str(error) in held:
                return None
            return f"got {error!r}, which no completed record of {key} held (G6)"
        if isinstance(error, CallbackDeclined | CallbackFailed | CallbackExit | Released):
            return None if mine else "got a callback exception that is not its own"
        if isinstance(error, errors.StepMismatchError | errors.StepResultNotStoredError):
            # Raised by a step inside its callback (check_steps judges whether it was due).
            return None if mine else f"{error!r} that no step of its callback raised"
        if isinstance(error, asyncio.CancelledError):
            if outcome.cancel_requested is not None or mine:
                return None
            return "CancelledError, not cancelled (and not its callback's own)"
        if isinstance(error, errors.CompletionError):
            if any(error.result is run.value for run in returned):
                return None
            if any(
                error.result is taken.result and taken.effect
                for run in outcome.runs
                for taken in run.steps
            ):
                return None  # a step's recovery point was not recorded (StepNotRecorded...)
            if any(run.answered is not None for run in returned):
                return None  # execute_call: a completion through the handle failed
            return f"{error!r} without a result of its own callback"
        if isinstance(error, errors.ConfigError):
            plan = self.plan_of(outcome.call)
            if plan.shape == "plain" or not math.isfinite(plan.timeout):
                return None
            return f"{error!r}: nothing in the call was misconfigured"
        if isinstance(error, TimeoutError):
            if self.lambda_timed_out(outcome):
                return (
                    f"{error!r}: a batch with a Lambda context raised at its deadline instead "
                    "of answering batchItemFailures (records not done by then are failures)"
                )
            ambient = self.ambient(outcome.call)
            if not isinstance(error, errors.IdempotencyError) and not ambient:
                return f"a TimeoutError that is not DeadlineExceededError: {error!r}"
            if self.deadline_reached(outcome):
                return None
            return f"{error!r} at t={outcome.exited:.3f} before its deadline {outcome.deadline}"
        if isinstance(error, errors.PersistenceError):
            return None if self.troubled(outcome.call) else f"{error!r} with no store failure"
        if isinstance(error, errors.AlreadyInProgressError):
            return self.refusal_problem(outcome, error)
        if isinstance(error, errors.PayloadValidationError):
            amount = self.scenario.calls[outcome.call].amount
            others = {
                other.amount
                for index, other in enumerate(self.scenario.calls)
                if self.key_of(index) == key
            }
            return None if others - {amount} else "PayloadValidationError with no other payload"
        if isinstance(error, errors.ResponseNotStoredError):
            return (
                None
                if key is not None and self.not_stored_existed(key)
                else ("ResponseNotStoredError, but no record went without its response")
            )
        if isinstance(error, errors.InconsistentStateError):
            if self.skewed or self.troubled(outcome.call):
                return None
            return f"{error!r} without clock skew or a store failure"
        return f"an undocumented outcome: {error!r}"

    def not_stored_existed(self, key: str) -> bool:
        return any(
            application.done
            and application.after is not None
            and application.after.status is Status.COMPLETED
            and not application.after.response_stored
            for _, application in self.applications.get(key, ())
        )

    def check_bounded(self, outcome: Outcome) -> None:
        """A call with a deadline ends by it, plus the completion reserve after the last
        store request the manager does not bound (claims and reads)."""
        if outcome.deadline is None or outcome.exited is None:
            return
        if any(not self.cooperative(run) or run.answered is not None for run in outcome.runs):
            return  # blocked, or past its point of no return (the deadline no longer applies)
        if self.trace.paused_during(outcome.entered, outcome.exited):
            return
        self.check_lambda_answered(outcome)
        latest = outcome.deadline
        for op in self.ops_of(outcome.call):
            if op.name in ("claim", "get") and op.ended is not None:
                latest = max(latest, op.ended)
        limit = latest + self.max_reserve(outcome.call) + self.tol
        if outcome.exited > limit + self.lag(latest, outcome.exited):
            self.fail(
                f"deadline: call {outcome.call} ended at t={outcome.exited:.3f}, past its "
                f"deadline t={outcome.deadline:.3f} and every bound after it"
            )

    def check_lambda_answered(self, outcome: Outcome) -> None:
        """A batch with a Lambda context answers before Lambda ends the invocation,
        whatever its store requests do: a record still running then (a claim or a read
        under way, which the manager does not bound) is cut off and fails."""
        assert outcome.exited is not None
        if not self.batch(outcome.call):
            return
        plan = self.plan_of(outcome.call)
        ends = [
            outcome.entered + seconds
            for mode, seconds in ((plan.deadline, plan.timeout), *plan.also)
            if mode == "lambda" and math.isfinite(seconds)
        ]
        if not ends:
            return
        end = min(ends)
        if outcome.exited > end + self.tol + self.lag(end, outcome.exited):
            self.fail(
                f"deadline: batch call {outcome.call} answered at t={outcome.exited:.3f}, after "
                f"Lambda ended its invocation at t={end:.3f}"
            )

    def check_force_released_cache(self) -> None:
        """G6: after its own ``force_release`` returned, a manager never replays the
        record it released (another manager's cache may, until its entry expires)."""
        for op in self.trace.store.ops:
            if op.name != "force_release" or op.call is None or op.ended is None:
                continue
            done = [a for a in op.applications if a.done]
            if not done or done[0].before is None or done[0].before.status is not Status.COMPLETED:
                continue
            released = done[0].before
            manager = self.plan_of(op.call).manager
            later = [
                application.after
                for _, application in self.applications.get(op.key, ())
                if application.order > done[0].order and application.after is not None
            ]
            for outcome in self.outcomes:
                if (
                    self.plan_of(outcome.call).manager != manager
                    or self.key_of(outcome.call) != op.key
                    or self.operator(outcome.call)
                    or outcome.entered < op.ended
                    # same instant (virtual time): it started before the release applied
                    or outcome.entered_at <= done[0].order
                    or outcome.error is not None
                    or outcome.runs
                    or not isinstance(outcome.value, dict)
                ):
                    continue
                if same(outcome.value, released.response) and not any(
                    same(outcome.value, record.response) for record in later
                ):
                    self.fail(
                        f"G6: call {outcome.call} replayed {outcome.value!r} from {op.key}'s "
                        f"record, which its own manager force-released at t={op.ended:.3f}"
                    )

    def check_cancellation(self) -> None:
        for op in self.trace.store.ops:
            if op.call is None:
                self.fail(
                    f"G6: {op.name} of {op.key} was sent by a task that is no call "
                    f"(a detached task): {op.task!r}"
                )
                continue
            outcome = self.trace.outcomes[op.call]
            # A request the cancellation interrupted before it reached the store (a task
            # cancelled while ready to run gets CancelledError at its next await) was not
            # issued.
            reached = bool(op.applications)
            if outcome.cancel_seq is not None and op.seq >= outcome.cancel_seq and reached:
                if any(run.swallowed for run in outcome.runs):
                    continue  # the callback swallowed the cancellation: exception (a)
                racing = (
                    self.real_time
                    and outcome.cancel_requested is not None
                    and op.started - outcome.cancel_requested
                    <= self.tol + self.lag(outcome.cancel_requested, op.started)
                )
                if racing:
                    # Real time: a cancellation that races the call's own wait timer is not
                    # judged within the tolerance (virtual time judges it exactly).
                    continue
                if (
                    self.batch(op.call)
                    and outcome.cancel_requested is not None
                    and op.started <= outcome.cancel_requested
                ):
                    # A batch's records run in tasks of their own, cancelled by the batch's
                    # task group when it next runs: a record woken in the same loop turn as
                    # the cancellation may send one request first.
                    continue
                self.fail(f"G6: call {op.call} sent {op.name} of {op.key} after it was cancelled")
        for task in self.trace.leftover_tasks:
            self.fail(f"G6: a task of the library outlived the scenario: {task}")
        for outcome in self.outcomes:
            for seq in outcome.in_flight:
                op = self.trace.store.ops[seq]
                self.fail(
                    f"G6: call {outcome.call} returned at t={outcome.exited:.3f} with its "
                    f"{op.name} of {op.key} (sent at t={op.started:.3f}) still awaited: a call "
                    "leaves no request of its own behind (a detached task)"
                )

    # -- the plan: leases, renewals, writes after the callback, options, refusals ----------

    def lag(self, start: float, end: float) -> float:
        return self.trace.lag_during(start, end)

    def lease_end_at(self, held: _Held, when: float) -> float:
        """The holder's lease end (loop time) as renewed by the extends confirmed by
        ``when``: the claim's, moved by each renewal answered since."""
        plan = self.manager_plan(held.call)
        end = held.sent + self.planned(held.call, held.sent)[0]
        for op in self.trace.store.ops:
            if (
                op.name == "extend"
                and op.arg.owner == held.claim.owner
                and renewed(op.delivered) is True
                and op.ended is not None
                and op.ended < when - self.tol  # (one answered at that very instant may not
                # have been read yet)
                and plan.renew_lease is not None
            ):
                end = max(end, min(op.started + plan.renew_lease, held.hard_end))
        return end

    def check_leases(self) -> None:
        """Every claim asks for the lease its call's plan gives (the earliest deadline
        source, else the ``lease`` option or ``expires_after``; renewal: the short lease),
        and every extend for the short lease, never past the call's hard bound."""
        for op in self.trace.store.ops:
            if op.call is None or op.name not in ("claim", "extend"):
                continue
            if self.refused_at_the_call(op.call):
                continue
            plan = self.manager_plan(op.call)
            if op.name == "claim":
                expected, _, _ = self.planned(op.call, op.started)
            else:
                held = self.held.get(op.arg.owner)
                if held is None:
                    continue
                expected = min(self.renew_lease(op.call), held.hard_end - op.started)
            expected += plan.lease_margin
            # A Lambda context says its remaining time in whole milliseconds.
            slack = self.tol + self.lag(op.started - 1.0, op.started)
            slack += 0.0015 if "lambda" in self.sources(op.call) else 1e-6
            if abs(op.arg.lease - expected) > slack:
                self.fail(
                    f"lease: call {op.call}'s {op.name} of {op.key} at t={op.started:.3f} asked "
                    f"for a lease of {op.arg.lease:.3f} s; its plan gives {expected:.3f} s "
                    f"(deadline sources {self.described_sources(op.call)}, lease={plan.lease}, "
                    f"renew_lease={plan.renew_lease}, lease_margin={plan.lease_margin})"
                )

    def described_sources(self, call: int) -> str:
        plan = self.plan_of(call)
        return ", ".join(
            f"{mode} {seconds}" for mode, seconds in ((plan.deadline, plan.timeout), *plan.also)
        )

    def check_write_bounds(self) -> None:
        """A completion (or a release) is bounded at the lease end as renewed — or a
        reserve after it was sent, when sent later — never at the reserve before it: one
        abandoned earlier leaves the record in progress with no documented excuse."""
        for op in self.trace.store.ops:
            if op.call is None or op.name not in ("complete", "release"):
                continue
            if not isinstance(op.raised, asyncio.CancelledError) or op.ended is None:
                continue
            outcome = self.trace.outcomes[op.call]
            if outcome.cancel_requested is not None:
                continue  # its caller's cancellation
            if self.batch(op.call) and outcome.error is not None:
                continue  # a batch whose task group was cancelled by a crash
            owner = op.arg.owner if op.name == "complete" else op.arg
            held = self.held.get(owner)
            if held is None:
                continue  # a release after a claim whose outcome was unknown
            if self.ambient_fired_by(op.call, op.ended):
                continue  # the caller's own asyncio.timeout cancelled it
            if self.batch_answer_cut(op.call, op.ended):
                continue  # the batch cut it off to answer Lambda in time (documented)
            bound = max(held.lease_end, op.started + held.reserve)
            if op.ended < bound - self.tol - self.lag(op.started, op.ended):
                self.fail(
                    f"G1(c): call {op.call}'s {op.name} of {op.key} was abandoned at "
                    f"t={op.ended:.3f}, before its lease ended at t={held.lease_end:.3f} (as "
                    "renewed): the writes after the callback are bounded at the lease end, "
                    "never at the reserve"
                )

    def ambient_fired_by(self, call: int, when: float) -> bool:
        """Whether an ambient deadline of the call had passed at ``when``."""
        outcome = self.trace.outcomes[call]
        plan = self.plan_of(call)
        for mode, seconds in ((plan.deadline, plan.timeout), *plan.also):
            ambient = mode == "ambient" or (
                self.timeout_is_ambient(call) and mode in ("timeout", "deadline")
            )
            if ambient and outcome.entered + seconds <= when + self.tol:
                return True
        return False

    def batch_answer_cut(self, call: int, when: float) -> bool:
        """Whether a batch with a Lambda context had cut its records' store requests off at
        ``when``: halfway through the time it keeps back to answer, min(0.25 s, 10 %) of
        the time left when it started (docs/lambda.md, "Deadline")."""
        if not self.batch(call):
            return False
        started = self.trace.outcomes[call].entered
        plan = self.plan_of(call)
        for mode, seconds in ((plan.deadline, plan.timeout), *plan.also):
            if mode == "lambda" and not math.isnan(seconds):
                kept = min(0.25, 0.1 * seconds)
                if started + seconds - kept / 2 <= when + self.tol:
                    return True
        return False

    def check_renewal_schedule(self) -> None:
        """While a renewing callback runs, an extend goes out every ``renew_every`` — the
        first that long after the claim was sent (not answered), each later one that long
        after the previous one was sent, answered or not (one left unanswered is abandoned
        at the next interval) — until the lease reaches the call's hard bound."""
        for owner, held in self.held.items():
            plan = self.manager_plan(held.call)
            renew = plan.renew_lease
            if renew is None or held.hard_end - held.sent <= renew:
                continue
            runs = [run for run in self.trace.runs if run.owner == owner]
            if not runs or not self.cooperative(runs[0]):
                continue
            run, outcome = runs[0], self.trace.outcomes[held.call]
            ends = [run.ended, run.answered, outcome.exited, outcome.cancel_requested]
            end = min([moment for moment in ends if moment is not None] + [held.cutoff])
            extends = [
                op for op in self.trace.store.ops if op.name == "extend" and op.arg.owner == owner
            ]
            for op in extends:
                if renewed(op.delivered) is False and op.ended is not None:
                    end = min(end, op.ended)  # refused: the callback is cut off
            every = plan.renew_every if plan.renew_every is not None else renew / 3
            stop = held.hard_end - renew
            due = max(held.sent + every, held.at)
            for sent in [op.started for op in extends] + [math.inf]:
                if due >= end - self.tol or due >= stop:
                    break
                late = sent - due - self.tol - self.lag(due, min(sent, end))
                if late > 1e-6:
                    self.fail(
                        f"renewal: call {held.call} holding {held.claim.key} sent no extend "
                        f"between t={due - every:.3f} and t={min(sent, end):.3f} though one was "
                        f"due at t={due:.3f} (renew_every={every:.3f}): an unanswered extend is "
                        "abandoned at the next interval, and the first counts from the claim's "
                        "send"
                    )
                    break
                due = sent + every

    def check_options(self) -> None:
        """Renewal settings that cannot keep a lease are refused at construction (and
        only those)."""
        for index, plan in enumerate(self.scenario.managers):
            if plan.renew_lease is None:
                continue
            refused = self.trace.refused.get(index)
            every = plan.renew_every if plan.renew_every is not None else plan.renew_lease / 3
            settings = (
                f"renew_lease={plan.renew_lease}, renew_every={every:.3f}, completion "
                f"reserve {renewal_reserve(plan):.3f}"
            )
            if refused is None and not can_renew(plan):
                self.fail(
                    f"options: manager {index} accepted {settings}: no renewal can be "
                    "confirmed before the first cutoff, or one lost renewal cannot be "
                    "survived — ConfigError at construction"
                )
            elif refused is not None and can_renew(plan):
                self.fail(
                    f"options: manager {index} refused {settings}, which can renew: {refused}"
                )

    def refusal_problem(self, outcome: Outcome, error: errors.AlreadyInProgressError) -> str | None:
        """An ``AlreadyInProgressError`` is due only for a holder with the same payload:
        refused by the store's verdict on a record that validated, or in process by a
        call holding the key then (not one that completed it), with the time its lease
        has left."""
        key = self.key_of(outcome.call)
        if key is None or self.batch(outcome.call) or outcome.exited is None:
            return None
        verdicts = [
            op.delivered
            for op in self.ops_of(outcome.call)
            if op.name in ("claim", "get") and isinstance(op.delivered, Verdict)
        ]
        if verdicts:
            # Refused by the store: after an in-progress verdict, the last one it got (a
            # poll that read the record completed must replay it, G3).
            last = verdicts[-1]
            if last.found is not Found.IN_PROGRESS:
                return (
                    f"AlreadyInProgressError after the store last answered {last.found} "
                    "(a completed record replays; a free key is claimed)"
                )
            record = last.record
            if record is not None and not self.validation_matches(outcome.call, record):
                return (
                    "AlreadyInProgressError for a record whose payload differs: validation "
                    "comes before refusal (PayloadValidationError)"
                )
            return None
        held = self.holder_of(outcome, key, at=outcome.exited)
        if held is None:
            return (
                "AlreadyInProgressError in process with no holder of its key then (a "
                "completed key replays, G3; a free one is claimed)"
            )
        mine, theirs = self.validation_of(outcome.call), self.validation_of(held.call)
        if mine is not None and theirs is not None and mine != theirs:
            return (
                f"AlreadyInProgressError though its payload differs from the holder's (call "
                f"{held.call}): validation comes before refusal, in process too"
            )
        plan = self.manager_plan(outcome.call)
        jumped = (
            plan.jump_at is not None
            and plan.jump
            and held.sent <= self.trace.start + (plan.jump_at)
        )
        # An operator's force_release meanwhile hands the key to a newer claim the caller's
        # process may not know of (its in-process holder is the older one): documented.
        released = self.force_released(key, outcome.entered_at, outcome.exited_at)
        if (
            error.retry_after is not None
            and not self.http(outcome.call)
            and not jumped
            and not released
        ):
            left = self.lease_end_at(held, outcome.exited) - outcome.exited
            if error.retry_after < left - self.tol - 1e-3:
                return (
                    f"AlreadyInProgressError.retry_after={error.retry_after:.3f} s, but its "
                    f"holder (call {held.call}) holds the key {left:.3f} s more (its lease as "
                    "renewed)"
                )
        return None

    def lambda_timed_out(self, outcome: Outcome) -> bool:
        """A batch with a Lambda context ended in a TimeoutError its context's deadline
        caused (an earlier ambient deadline of the caller's own excepted)."""
        if not self.batch(outcome.call) or "lambda" not in self.sources(outcome.call):
            return False
        plan = self.plan_of(outcome.call)
        deadlines = {mode: seconds for mode, seconds in ((plan.deadline, plan.timeout), *plan.also)}
        ambient = [s for m, s in deadlines.items() if m != "lambda"]
        if ambient and self.trace.paused_during(outcome.entered, outcome.exited):
            # A callback blocked the loop past both deadlines (G1(a)): whichever timer
            # fired first once it ran again, the caller's own timeout is a documented end.
            return False
        # The batch answers within half the time it keeps back (min(0.25 s, 10 %)).  In
        # real time a window no wider than the timing tolerance plus the loop's lag near
        # the end is the machine's, not the batch's: judged in virtual time only, then.
        end = outcome.entered + deadlines["lambda"]
        kept = min(0.25, 0.1 * deadlines["lambda"])
        if kept / 2 <= self.tol + self.lag(end - kept, end):
            return False
        return not ambient or min(ambient) > deadlines["lambda"]

    def check_http(self) -> None:
        """The status policy (HTTP endpoints and routes).  A status it releases — a 5xx;
        408, 409, 425, 429 — counts as the endpoint raising: its record is never completed
        (so the next request runs the endpoint again), and its own client gets it as it was
        answered, not marked replayed; a replay never carries one.  A status it stores (the
        other 2xx-4xx) is a result: G2 checks that its key is never released, G3 that
        every duplicate gets it replayed, status and body."""
        for run in self.trace.runs:
            error = run.error
            if not self.responds(run.call) or not isinstance(error, Released):
                continue
            label = "5xx" if error.status >= 500 else str(error.status)
            if run.owner is not None and self.completed_by(run.owner) is not None:
                self.fail(
                    f"G2: call {run.call}'s endpoint answered {label} ({error.status}), yet its "
                    "record completed: a status the policy does not store counts as raising, "
                    "and the key is released"
                )
            outcome = self.trace.outcomes[run.call]
            answer = outcome.http
            if answer is None or outcome.error is not error:
                continue
            replayed = answer.header("idempotent-replayed") == "true"
            if replayed or answer.decoded() != (error.status, error.body):
                self.fail(
                    f"HTTP: call {run.call}'s endpoint answered {error.status} {error.body!r}; "
                    f"its client got {answer.status} {answer.decoded()[1]!r}"
                    f"{' marked replayed' if replayed else ''}"
                )
        for outcome in self.outcomes:
            answer = outcome.http
            if (
                answer is not None
                and outcome.error is None
                and self.responds(outcome.call)
                and answer.header("idempotent-replayed") == "true"
                and _released_status(answer.status)
            ):
                self.fail(
                    f"HTTP: call {outcome.call} got a stored {answer.status} replayed: the "
                    "policy never stores it"
                )

    def check_tool_errors(self) -> None:
        """An MCP tool call's duplicate answers reach the model as tool errors that say
        what to do next: retry the same call (in whole seconds, at least 1) while it is in
        progress; use a new key for other arguments; do not retry a result not stored.
        An in-progress or mismatch answer never reaches it as a bare error or a result."""
        answered = (
            errors.AlreadyInProgressError,
            errors.PayloadValidationError,
            errors.ResponseNotStoredError,
        )
        advice = {
            errors.AlreadyInProgressError: ("retry this same call", "seconds"),
            errors.PayloadValidationError: ("use a new key",),
            errors.ResponseNotStoredError: ("Do not retry",),
        }
        for outcome in self.outcomes:
            answer = outcome.answer
            if answer is None or not self.mcp(outcome.call):
                continue
            text = "".join(getattr(block, "text", "") for block in answer.result.content)
            cause = None if answer.raised is None else answer.raised.__cause__
            error = outcome.error
            if isinstance(cause, answered) and not isinstance(error, answered):
                self.fail(
                    f"MCP: call {outcome.call}'s {type(cause).__name__} reached the model as "
                    f"{text!r}, without the advice of its tool error"
                )
            if isinstance(error, answered):
                wanted = advice[type(error)]
                if not answer.result.is_error or not all(part in text for part in wanted):
                    self.fail(
                        f"MCP: call {outcome.call}'s {type(error).__name__} answer {text!r} "
                        f"does not say {' ... '.join(wanted)!r}"
                    )
                retry = getattr(error, "retry_after", None)
                if isinstance(error, errors.AlreadyInProgressError) and (
                    retry is None or retry < 1
                ):
                    self.fail(f"MCP: call {outcome.call} was told to retry in {retry} seconds")

    def check_routes(self) -> None:
        """A route's duplicate answers are responses, never exceptions out of
        ``resolve_async``: in progress is a 409 with a ``Retry-After`` of whole seconds (at
        least 1), other payload a 422.  A caller tells a replay by its
        ``Idempotent-Replayed: true`` header, and its own response by its absence (the
        status policy is :meth:`check_http`'s)."""
        answered = (
            errors.AlreadyInProgressError,
            errors.PayloadValidationError,
            errors.ResponseNotStoredError,
            errors.PayloadError,
        )
        for outcome in self.outcomes:
            if not self.route(outcome.call) or outcome.exited is None:
                continue
            answer, error = outcome.http, outcome.error
            if answer is None:
                if isinstance(error, answered):
                    self.fail(
                        f"routes: call {outcome.call}'s {error!r} went out of resolve_async "
                        "as an exception, not as its response (409/422)"
                    )
                continue
            if isinstance(error, errors.AlreadyInProgressError):
                after = answer.header("retry-after")
                if after is None or not after.isdigit() or int(after) < 1:
                    self.fail(
                        f"routes: call {outcome.call}'s 409 (in progress) has Retry-After "
                        f"{after!r}, not whole seconds >= 1"
                    )
            if error is not None:
                continue
            replayed = answer.header("idempotent-replayed") == "true"
            own = any(run.returned and outcome.value is run.value for run in outcome.runs)
            if own and replayed:
                self.fail(f"routes: call {outcome.call}'s own response is marked replayed")
            if not own and not replayed:
                self.fail(
                    f"routes: call {outcome.call} got {answer.status} from a record without "
                    "the Idempotent-Replayed header"
                )

    def check_one_answer(self) -> None:
        """G6: a record completed with its response is final — a later completion by its
        owner (a Call completed twice) never changes the response."""
        for key, history in self.applications.items():
            final: dict[str, Record] = {}
            for op, application in history:
                after = application.after
                if (
                    op.name != "complete"
                    or not application.done
                    or after is None
                    or after.status is not Status.COMPLETED
                    or after.owner is None
                ):
                    continue
                first = final.get(after.owner)
                if first is None:
                    if after.response_stored:
                        final[after.owner] = after
                    continue
                if not after.response_stored or not same(after.response, first.response):
                    self.fail(
                        f"G6: {key} was completed with {first.response!r}, then again with "
                        f"{after.response!r} by the same owner: one key, one answer"
                    )

    def check_cache_life(self) -> None:
        """G6: a local cache answers only what the store held during the record's life: a
        replay served in process (no store request of its own) comes from a record that
        had not expired then — by the clock the store judged it by."""
        for outcome in self.outcomes:
            key = self.key_of(outcome.call)
            if (
                key is None
                or outcome.error is not None
                or not outcome.returned_value
                or outcome.runs
                or outcome.exited is None
                or self.batch(outcome.call)
                or self.responds(outcome.call)
                or any(True for _ in self.ops_of(outcome.call))
            ):
                continue
            plan = self.manager_plan(outcome.call)
            if not plan.use_local_cache or plan.jump or self.joined(outcome, key):
                continue
            now = outcome.exited - self.trace.start + self.trace.base
            if not self.scenario.server_clock:
                now += plan.skew
            held = [
                application.after
                for _, application in self.applications.get(key, ())
                if application.done
                and application.after is not None
                and application.after.status is Status.COMPLETED
                and application.after.response_stored
                and same(outcome.value, application.after.response)
            ]
            if held and all(record.expiration < now - self.tol for record in held):
                self.fail(
                    f"G6: call {outcome.call} replayed {outcome.value!r} from its process at "
                    f"t={outcome.exited:.3f}, after every record that held it had expired "
                    f"(the last at {max(r.expiration for r in held)}, the clock read {now:.3f})"
                )

    def joined(self, outcome: Outcome, key: str) -> bool:
        """Whether the call got its value by joining a call of its process that asked the
        store (both end at once: single flight), not from the cache."""
        manager = self.plan_of(outcome.call).manager
        return any(
            other.call != outcome.call
            and self.plan_of(other.call).manager == manager
            and self.key_of(other.call) == key
            and other.exited is not None
            and outcome.exited is not None
            and abs(other.exited - outcome.exited) <= self.tol
            and any(True for _ in self.ops_of(other.call))
            for other in self.outcomes
        )

    def check_operators(self) -> None:
        """Only an operator force-releases (its documented hazards are its own)."""
        for op in self.trace.store.ops:
            if op.name == "force_release" and not self.by_operator(op):
                self.fail(
                    f"G1: a force_release of {op.key} was sent by call {op.call}, which is no "
                    "operator's: only an operator's release is exempt from the guarantee"
                )

    # ------------------------------------------------------------------ steps

    def check_steps(self) -> None:
        """Recovery points (steps), judged from the ledger of step effects and the store's
        history:

        - a step whose recovery point is on the record never runs again while the record
          lives: not in a call whose claim resumed it (it replays its result, or raises
          ``StepResultNotStoredError`` for one not stored), and not after — unless the
          record expired, was completed, or an operator force-released it;
        - a step interrupted between its effect and its recovery point runs again only
          once its holder's lease ended (as the whole callback, G1): at most once per lease;
        - a retry whose step differs from the record's at that position gets
          ``StepMismatchError`` and runs nothing — and only then."""
        resumed: dict[str, list[list[Any]]] = {}
        for op in self.trace.store.ops:
            verdict = op.delivered
            if (
                op.name == "claim"
                and isinstance(verdict, Verdict)
                and verdict.found is Found.CLAIMED
                and verdict.record is not None
            ):
                resumed[op.arg.owner] = _entries(verdict.record)
        for taken in self.trace.steps:
            if taken.key is not None and taken.owner is not None:
                self.check_step_taken(taken, resumed.get(taken.owner, []))
        by_key: dict[str, list[StepRun]] = {}
        for taken in self.trace.steps:
            if taken.key is not None and taken.ran:
                by_key.setdefault(taken.key, []).append(taken)
        for key, taken_steps in by_key.items():
            self.check_steps_once(key, taken_steps)
            self.check_interrupted_steps(key, taken_steps)
        self.check_recorded_after_effect()

    def check_recorded_after_effect(self) -> None:
        """A recovery point is written only once its step's function returned (its effect
        happened first), and holds what it returned (or no result, when that is not
        JSON)."""
        taken_by = {(taken.owner, taken.position): taken for taken in self.trace.steps}
        for op in self.trace.store.ops:
            if op.name != "record_step" or op.call is None:
                continue
            write = op.arg
            entries = json.loads(write.steps) if write.steps else []
            if len(entries) != write.position + 1:
                self.fail(
                    f"steps: call {op.call} wrote {len(entries)} recovery point(s) at position "
                    f"{write.position + 1} of {op.key}: each write adds one step"
                )
                continue
            entry = entries[-1]
            taken = taken_by.get((write.owner, write.position))
            if taken is None or taken.returned is None or taken.returned > op.started:
                self.fail(
                    f"steps: call {op.call} wrote the recovery point of step {entry[0]!r} of "
                    f"{op.key} at t={op.started:.3f} before its function returned (its effect "
                    "must come first)"
                )
            elif entry[0] != taken.name or (len(entry) == 2 and not same(entry[1], taken.result)):
                self.fail(
                    f"steps: call {op.call}'s recovery point {entry!r} of {op.key} is not what "
                    f"its step {taken.name!r} returned ({taken.result!r})"
                )

    def check_step_taken(self, taken: StepRun, entries: list[list[Any]]) -> None:
        where = f"call {taken.call}'s step {taken.name!r} (position {taken.position + 1})"
        error = taken.error
        if taken.position >= len(entries):
            if isinstance(error, errors.StepMismatchError):
                self.fail(
                    f"steps: {where} raised StepMismatchError, but its claim resumed "
                    f"{len(entries)} step(s): nothing recorded there to mismatch"
                )
            return
        entry = entries[taken.position]
        if taken.ran:
            self.fail(
                f"steps: {where} ran, though its claim resumed the record's recovery point "
                f"there ({entry[0]!r}): a recorded step never runs again while the record lives"
            )
        elif entry[0] != taken.name:
            if not isinstance(error, errors.StepMismatchError):
                got = error if error is not None else taken.value
                self.fail(
                    f"steps: {where} met the record's step {entry[0]!r} there and got "
                    f"{got!r}, not StepMismatchError"
                )
        elif len(entry) == 3:
            if not isinstance(error, errors.StepResultNotStoredError):
                got = error if error is not None else taken.value
                self.fail(
                    f"steps: {where} was recorded without its result ({entry[2]!r}) and got "
                    f"{got!r} on resume, not StepResultNotStoredError"
                )
        elif error is None and not same(taken.value, entry[1]):
            self.fail(f"steps: {where} replayed {taken.value!r}; the record holds {entry[1]!r}")

    def check_steps_once(self, key: str, taken_steps: list[StepRun]) -> None:
        """No step runs while its recovery point lives on the record: from the write that
        recorded it until the record expires, is completed or force-released by an
        operator (a store that loses it otherwise does not lift the protection)."""
        claims: dict[str, list[StepRun]] = {}
        for taken in taken_steps:
            claims.setdefault(taken.owner or "", []).append(taken)
        protected: dict[str, int] = {}  # step name -> the call that recorded it
        previous: Application | None = None
        for op, application in self.applications.get(key, ()):
            gone = None if previous is None or not previous.done else previous.after
            if (
                gone is not None
                and application.before is None
                and gone.expiration < self.max_wall(application.at)
            ):
                protected.clear()  # the record expired and was dropped
            previous = application
            if not application.done:
                continue
            before, after = application.before, application.after
            if self.by_operator(op) or (
                op.name == "complete" and after is not None and after.status is Status.COMPLETED
            ):
                protected.clear()
            elif (
                op.name == "claim"
                and before is not None
                and before.expiration < max(op.arg.now, self.max_wall(self.judged_at(application)))
            ):
                protected.clear()  # an expired record (a claim took it over)
            for name in step_names(after):
                protected.setdefault(name, op.call if op.call is not None else -1)
            if (
                op.name != "claim"
                or application is not op.applications[0]
                or not isinstance(op.delivered, Verdict)
                or op.delivered.found is not Found.CLAIMED
            ):
                continue  # the claims the steps ran under (an owner may claim again)
            for taken in claims.get(op.arg.owner, ()):
                if taken.name in protected:
                    self.fail(
                        f"steps: call {taken.call} ran step {taken.name!r} of {key} (claimed "
                        f"at t={op.started:.3f}) while its recovery point lived on the record "
                        f"(recorded by call {protected[taken.name]}; not removed by expiry, "
                        "completion or an operator's force_release)"
                    )

    def check_interrupted_steps(self, key: str, taken_steps: list[StepRun]) -> None:
        """A step whose effect happened without its recovery point runs again only after
        its holder's lease ended (as renewed): once per lease."""
        recorded: set[tuple[str, str]] = set()  # (owner, step name)
        for op, application in self.applications.get(key, ()):
            if op.name == "record_step" and application.done:
                for name in step_names(application.after):
                    recorded.add((op.arg.owner, name))
        runs = {id(taken): run for run in self.trace.runs for taken in run.steps}
        last: dict[str, StepRun] = {}
        for taken in sorted(taken_steps, key=lambda step: step.started):
            if not taken.effect:
                continue
            first = last.get(taken.name)
            last[taken.name] = taken
            if first is None or (first.owner or "", taken.name) in recorded:
                continue
            if first.owner == taken.owner:
                self.fail(
                    f"steps: step {taken.name!r} of {key} ran twice under one claim "
                    f"({taken.owner}: calls {first.call} and {taken.call})"
                )
                continue
            held = self.held.get(first.owner or "")
            run = runs.get(id(first))
            if held is None or run is None or not self.cooperative(run) or self.skewed:
                continue  # exceptions (a) and (b)
            if self.force_released(key):
                continue  # an operator's documented hazard
            end = held.lease_end
            if taken.started < end - self.tol - self.lag(taken.started, end):
                self.fail(
                    f"steps: step {taken.name!r} of {key} ran in call {first.call} (its "
                    f"recovery point never recorded) and again in call {taken.call} at "
                    f"t={taken.started:.3f}, before the first holder's lease ended at "
                    f"t={end:.3f}: an interrupted step runs again only after its lease"
                )

    # ------------------------------------------------------------------ redaction

    def redaction_of(self, call: int) -> str:
        """The ``redaction`` of the call's manager as the call used it (the HTTP door's
        middleware redacts nothing of the manager's)."""
        if self.http(call):
            return "off"
        return str(self.scenario.managers[self.plan_of(call).manager].redaction)

    def check_redaction(self) -> None:
        """What reached the store holds no declared field (``never_store``: no response),
        no duplicate sees one, and the caller whose callback ran gets its result whole.

        Every object a simulated callback returns names its call in ``REDACTED_FIELD``: a
        call that gets an object naming a call whose manager redacts it got that call's
        result unredacted, through the store, the cache or an in-process wait."""
        for op in self.trace.store.ops:
            if op.name != "complete" or op.call is None or self.batch(op.call):
                continue
            redaction, completion = self.redaction_of(op.call), op.arg
            if _is_error_form(completion.response):
                continue  # a declared error is stored as its error form: redaction is of results
            if redaction == "never_store" and completion.encoded is not None:
                self.fail(
                    f"redaction: call {op.call}'s manager stores no response, but its "
                    f"completion of {op.key} carries {completion.response!r}"
                )
            elif redaction == "fields" and _holds_field(completion.response):
                self.fail(
                    f"redaction: call {op.call}'s completion of {op.key} stores the redacted "
                    f"field {REDACTED_FIELD!r}: {completion.response!r}"
                )
        for outcome in self.outcomes:
            if outcome.error is not None or self.http(outcome.call) or self.batch(outcome.call):
                continue
            if self.operator(outcome.call):
                continue
            value = outcome.value
            own = [run for run in outcome.runs if run.returned]
            for run in own:
                if value is run.value and _lost_field(value):
                    self.fail(
                        f"redaction: call {outcome.call} got its own result with "
                        f"{REDACTED_FIELD!r} removed ({value!r}): redacted in place"
                    )
            if any(value is run.value for run in own):
                continue  # its own result, whole
            for run in own:
                if _holds_field(run.value) and value == _without_field(run.value):
                    self.fail(
                        f"redaction: call {outcome.call}'s callback returned {run.value!r}, "
                        f"but the call got the redacted {value!r}"
                    )
            writer = value.get(REDACTED_FIELD) if isinstance(value, dict) else None
            if (
                isinstance(writer, int)
                and 0 <= writer < len(self.scenario.calls)
                and self.redaction_of(writer) != "off"
            ):
                self.fail(
                    f"redaction: call {outcome.call} got {value!r}, the unredacted result of "
                    f"call {writer}, whose manager keeps {REDACTED_FIELD!r} out of the store"
                )


def _entries(record: Record | None) -> list[list[Any]]:
    """The step list of ``record`` read here (``[name, result]`` or ``[name, null,
    reason]`` entries); unreadable or none: empty."""
    text = None if record is None else record.steps
    if not text:
        return []
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, list) and entry]


def _is_error_form(value: Any) -> bool:
    return isinstance(value, dict) and _ERROR_FORM in value


def _holds_field(value: Any) -> bool:
    return isinstance(value, dict) and REDACTED_FIELD in value


def _lost_field(value: Any) -> bool:
    """Every object a simulated callback returns names its call (the odd ``{"wide": n}``
    aside): one without it lost the field after the callback returned it."""
    return isinstance(value, dict) and not {REDACTED_FIELD, "wide"} & value.keys()


def _without_field(value: dict[str, Any]) -> dict[str, Any]:
    return {name: item for name, item in value.items() if name != REDACTED_FIELD}


def _store_failure(error: BaseException | None) -> bool:
    """An error a store may raise for a request it could not carry out.  Anything else
    from a store (an encoder's ``UnicodeEncodeError``...) is a defect, never an excuse."""
    return isinstance(
        error,
        errors.PersistenceError
        | errors.InconsistentStateError
        | asyncio.CancelledError
        | TimeoutError,
    )


def reserve(left: float, option: float | None) -> float:
    """The completion reserve from the contract: min(0.5 s, 20 % of the time left at the
    claim), or the ``completion_reserve`` option (never more than the time left)."""
    if option is not None:
        return min(option, left)
    return min(0.5, 0.2 * left)


@functools.lru_cache(maxsize=64)
def validation_hash(value: Any) -> str:
    """The validation hash of the simulator's tiny payload parts (ints, short strings):
    Base64 of the MD5 of their canonical JSON, built here, not by the library."""
    if isinstance(value, tuple):
        value = dict(value)  # an object's members, as (name, value) pairs
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return base64.b64encode(hashlib.md5(text.encode()).digest()).decode("ascii")


def check(trace: Trace, *, tolerance: float = 1e-6) -> list[str]:
    """Every violation of the guarantee in ``trace`` (empty when the scenario passed)."""
    checker = _Checker(trace, tolerance)
    store_clock = None
    if trace.own_clock:

        def store_clock(application: Application) -> float:
            return trace.base + application.at - trace.start

    boundary = BOUNDARY if store_clock is None else max(BOUNDARY, tolerance)
    StoreChecks(checker.applications, checker.max_wall, checker.fail, store_clock, boundary).check()
    checker.check_keys()
    checker.check_validation()
    checker.check_runs()
    checker.check_at_most_once()
    checker.check_replays()
    checker.check_evaluated_replays()
    checker.check_unblocked()
    checker.check_outcomes()
    checker.check_cancellation()
    checker.check_force_released_cache()
    checker.check_leases()
    checker.check_write_bounds()
    checker.check_renewal_schedule()
    checker.check_options()
    checker.check_http()
    checker.check_tool_errors()
    checker.check_routes()
    checker.check_operators()
    checker.check_one_answer()
    checker.check_cache_life()
    checker.check_redaction()
    checker.check_steps()
    return checker.violations
