"""The plan of a scenario — managers (processes), calls, faults — as plain values: what a
run is measured against (the generator in ``_scenario`` makes them from a seed).

Times are whole milliseconds times ``scale`` (virtual time runs at scale 1; a real store
at a smaller scale keeps a real-time run short).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = [
    "CALL_BEHAVIOURS",
    "ERRORS",
    "OPS",
    "Behaviour",
    "CallPlan",
    "DeadlineMode",
    "Door",
    "ErrorKind",
    "Fault",
    "FaultKind",
    "ManagerPlan",
    "REDACTED_FIELD",
    "RETRY_LATER_STATUSES",
    "STORED_4XX_STATUSES",
    "Scenario",
    "Shape",
    "STEP_FAULTS",
    "StepFault",
    "RENEWAL_ROOM",
    "can_renew",
    "ms",
    "renewal_reserve",
    "status_of",
    "valid_renewal",
]

FaultKind = Literal[
    "error", "lose", "resend", "delay", "stall", "nonsense", "late", "slow_answer", "adrift"
]
ErrorKind = Literal["unavailable", "throttled", "denied", "validation", "inconsistent"]
Behaviour = Literal[
    "return",
    "raise",
    "hang",
    "swallow",
    "block",
    "unstorable",
    "falsy",
    "wide_int",
    "surrogate",
    "nan",
    "base_exception",
    "cancel_self",
    "complete_then_run",
    "complete_then_raise",
    "complete_without_response",
    "attach_later",
    "complete_odd",
    "complete_twice",
    "without_response_then_raise",
    "stream",
    "server_error",
    "client_error",
    "retry_later",
    "complete_when_cut_off",
    "declared",
]
DeadlineMode = Literal["timeout", "deadline", "ambient", "lambda", "none"]
Door = Literal["execute", "execute_call", "decorated", "operator", "batch", "http", "mcp", "route"]
Shape = Literal["coroutine", "lambda", "plain"]
StepFault = Literal["none", "raise_in", "raise_after", "crash_in", "mismatch", "not_stored"]
"""Where a callback's steps fail (``CallPlan.step_fault``, at step ``step_at``):
``raise_in`` — the step's function raises (before its effect); ``raise_after`` — the
callback raises once the step returned; ``crash_in`` — the step's function does its effect
and the process crashes (a ``BaseException``) before its recovery point is written;
``mismatch`` — the step at that position has another name than its retries' (the record,
once it holds the others', refuses it: ``StepMismatchError``); ``not_stored`` — the step
returns a value that is not JSON (``StepResultNotStoredError``, now and on every retry)."""

OPS = ("claim", "get", "complete", "release")
ERRORS: tuple[ErrorKind, ...] = ("unavailable", "throttled", "denied", "validation", "inconsistent")
STEP_FAULTS: tuple[StepFault, ...] = (
    "none",
    "raise_in",
    "raise_after",
    "crash_in",
    "mismatch",
    "not_stored",
)
CALL_BEHAVIOURS: tuple[Behaviour, ...] = (
    "attach_later",
    "complete_then_raise",
    "complete_then_run",
    "complete_without_response",
)


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault on the ``nth`` (0-based) ``op`` that one call sends to the store (``op``
    ``record_step``: a step's recovery point).

    ``error``: raise before applying.  ``lose``: apply, then lose the answer.  ``resend``:
    apply, lose the answer, send it again (an SDK retry).  ``delay``/``stall``: wait
    ``seconds`` before applying (a request abandoned meanwhile never lands).  ``nonsense``:
    apply, then answer something that is not a store answer.  ``slow_answer``: apply at
    once, answer ``seconds`` later.  ``adrift``: the request is on its way for ``seconds``
    and lands then even if its sender abandoned it (a request cannot be unsent).
    """

    op: str
    nth: int
    kind: FaultKind
    seconds: float = 0.0
    error: ErrorKind = "unavailable"
    """The error ``error``/``lose`` raise (``late``: the answer lost, the write applied
    ``seconds`` later, after other operations)."""


@dataclass(frozen=True, slots=True)
class ManagerPlan:
    """One process: its clock skew and the options of its manager.

    Flat, as scenarios are stored and reproduced as JSON: ``wait``/``wait_timeout`` become
    ``Options(wait=Wait(timeout=...))``, ``use_local_cache`` ``LocalCache()``, and
    ``renew_lease``/``renew_every`` ``Renewal(lease=..., every=...)`` (``_managers._options``).
    """

    skew: float
    wait: bool
    wait_timeout: float
    lease: float | None
    lease_margin: float
    expires_after: float
    use_local_cache: bool
    completion_reserve: float | None
    jump_at: float | None = None
    """Loop time at which this process's wall clock jumps by ``jump`` seconds."""
    jump: float = 0.0
    renew_lease: float | None = None
    """``Renewal(lease=...)``: a short lease renewed while the callback runs."""
    renew_every: float | None = None
    redaction: str = "off"
    """``Options(redaction=...)``: ``"fields"`` removes :data:`REDACTED_FIELD` from stored
    results, ``"never_store"`` stores none (HTTP calls: the middleware's own, not this)."""


REDACTED_FIELD = "call"
"""The member a ``redaction="fields"`` manager keeps out of the store: every simulated
result that is an object names the call that produced it there, so a duplicate that sees
it saw another call's unredacted result."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One ``execute`` call: who sends it, when, for which key, and what its callback does."""

    manager: int
    key: int | None
    """Index of the key; ``None`` sends a payload without a key (run without idempotency)."""
    amount: int
    """The validated part of the payload: calls of one key with another amount are misuse."""
    at: float
    deadline: DeadlineMode
    timeout: float
    behaviour: Behaviour
    duration: float
    cancel_after: float | None
    faults: tuple[Fault, ...] = ()
    door: Door = "execute"
    """``operator``: a ``force_release`` of the key instead of a call; ``batch``: an SQS
    event through ``process_batch`` holding the payload ``copies`` times; ``mcp``: a call of
    an ``idempotent_tool`` MCP tool; ``route``: an API Gateway event through a Powertools
    Event Handler route with ``idempotent_route``."""
    shape: Shape = "coroutine"
    copies: int = 1
    also: tuple[tuple[DeadlineMode, float], ...] = ()
    """Further deadline sources of the call, each with its seconds: the earliest of all
    wins (``lambda``: the Lambda context of a batch, its remaining time in ms)."""
    middleware: bool = False
    """``http``: a middleware compressing the app's responses sits inside the gate."""
    latency: float = 0.0
    """Every store request of the call takes this long to reach the store (a slow store)."""
    by_message: bool = False
    """``batch``: records keyed by their SQS ``messageId`` (the manager selects no key);
    another call of the same key and payload is the same message redelivered — its id
    kept, its receipt handle new."""
    fifo: bool = False
    """``batch``: the records come from an SQS FIFO queue (one message group: in order)."""
    content_length: bool = False
    """``http``: the endpoint's stream declares its ``Content-Length``."""
    http_limit: int | None = None
    """``http``: the gate's ``max_response_bytes`` for this request (None: what fits in
    the store)."""
    steps: int = 0
    """How many steps (recovery points, ``step("s<n>", fn)``) the callback takes before
    it behaves as planned; 0: none (the callback of every scenario recorded before steps).
    A store that does not record steps takes none (its scenarios are generated without)."""
    step_fault: StepFault = "none"
    """How the steps fail, at step ``step_at`` (see :data:`StepFault`)."""
    step_at: int = 0


STORED_4XX_STATUSES = (402, 410)
"""What a ``client_error`` endpoint answers: a 4xx the status policy stores and replays.
Neither is an answer of the library's own (400, 409, 413, 422), so a client (and the
oracle) can tell the endpoint's from the library's."""

RETRY_LATER_STATUSES = (408, 425, 429)
"""What a ``retry_later`` endpoint answers: a 4xx that asks for the same request again,
which the policy releases like a 5xx.  409 is one too, but it is also the library's own
in-progress answer: an endpoint's 409 could not be told from it by its status."""


def status_of(plan: CallPlan) -> int:
    """The status an HTTP endpoint or a route answers for ``plan`` (the 4xx drawn from the
    plan itself, so a scenario's JSON reproduces it)."""
    behaviour = plan.behaviour
    choices: tuple[int, ...]
    if behaviour == "server_error":
        return 500
    if behaviour == "client_error":
        choices = STORED_4XX_STATUSES
    elif behaviour == "retry_later":
        choices = RETRY_LATER_STATUSES
    else:
        return 200
    return choices[round(plan.at * 1000) % len(choices)]


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int
    validate: bool
    managers: tuple[ManagerPlan, ...]
    calls: tuple[CallPlan, ...]
    scale: float = 1.0
    server_clock: bool = False
    """The store judges by its own clock (the loop's, unskewed), not the managers'."""
    capacity: int | None = None
    """``max_records`` of a MemoryStore (the simulator's own store only)."""
    live: bool = False
    """Generated for a real-time run (no callback blocks the loop, every manager has a
    ``lease``); informational: the scenario runs as it is, in either time."""

    def describe(self) -> str:
        """The scenario as readable text (printed with every failure)."""
        lines = [
            f"scenario seed={self.seed} scale={self.scale} validate={self.validate} "
            f"server_clock={self.server_clock} capacity={self.capacity} live={self.live}"
        ]
        for index, plan in enumerate(self.managers):
            lines.append(f"  manager {index}: {plan}")
        for index, call in enumerate(self.calls):
            lines.append(f"  call {index}: {call}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The scenario as JSON text: ``python -m idempotency_async.testing --scenario``
        runs it again."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data: dict[str, Any] = json.loads(text)
        managers = tuple(ManagerPlan(**plan) for plan in data.pop("managers"))
        calls = tuple(
            CallPlan(
                **{
                    **plan,
                    "faults": tuple(Fault(**fault) for fault in plan["faults"]),
                    "also": tuple((mode, seconds) for mode, seconds in plan.get("also", ())),
                }
            )
            for plan in data.pop("calls")
        )
        return cls(managers=managers, calls=calls, **data)


def ms(rng: random.Random, low: float, high: float, scale: float) -> float:
    """A duration in whole (scaled) milliseconds: unquantized timers can livelock a
    virtual clock on float rounding."""
    return round(rng.uniform(low, high) * scale, 3)


def renewal_reserve(plan: ManagerPlan) -> float:
    """The completion reserve of a short lease, from the contract: min(0.5 s, 20 % of the
    short lease), or the ``completion_reserve`` option (never more than the lease)."""
    renew = plan.renew_lease
    assert renew is not None
    if plan.completion_reserve is not None:
        return min(plan.completion_reserve, renew)
    return min(0.5, 0.2 * renew)


RENEWAL_ROOM = 0.1
"""The share of ``Renewal.lease`` kept for a renewal's round trip (docs/manager.md)."""


def can_renew(plan: ManagerPlan) -> bool:
    """Whether a manager's renewal settings can keep a lease, as the documentation states
    the rule: after one lost renewal the next goes out two intervals after the claim, and
    both intervals, the completion reserve and a round trip (``RENEWAL_ROOM`` of the short
    lease) fit in it — ``2 x every + reserve <= 90 % of the renewal's lease``.  Settings that
    do not must be refused with ConfigError at construction, and only those."""
    renew = plan.renew_lease
    if renew is None:
        return True
    every = plan.renew_every if plan.renew_every is not None else renew / 3
    return 2 * every + renewal_reserve(plan) <= (1 - RENEWAL_ROOM) * renew + 1e-6


def valid_renewal(plan: ManagerPlan) -> ManagerPlan:
    """``plan`` with renewal settings that can renew (the interval shortened, the reserve
    option dropped if it alone leaves no room)."""
    renew = plan.renew_lease
    if renew is None or can_renew(plan):
        return plan
    if plan.completion_reserve is not None and plan.completion_reserve >= 0.3 * renew:
        plan = replace(plan, completion_reserve=None)
    every = round((renew - renewal_reserve(plan)) / 2.5, 3)
    return replace(plan, renew_every=every)
