"""What a scenario's run leaves for the oracle: the callbacks' runs, the callers' outcomes,
and the trace holding them with the store's log."""

from __future__ import annotations

import contextlib
import gzip
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.manager import Manager
from idempotency_async.testing._faults import FaultyStore
from idempotency_async.testing._plans import Scenario

__all__ = [
    "BASE_TIME",
    "CallbackDeclined",
    "CallbackExit",
    "CallbackFailed",
    "HttpAnswer",
    "Outcome",
    "Released",
    "RetryLater",
    "Run",
    "ServerError",
    "StepRun",
    "Trace",
    "Unstorable",
]

BASE_TIME = 1_700_000_000.0
"""Unix time at loop time 0 (each manager's clock adds its skew)."""

MISSING: Any = object()


class CallbackFailed(Exception):
    """What a simulated callback raises (its own exception, to be re-raised to the caller)."""


class CallbackDeclined(Exception):
    """What a simulated callback raises for a deterministic failure: its managers declare
    it a result (``replay_errors``), so it completes the record and every duplicate gets it
    raised again (rebuilt from the record)."""


class CallbackExit(BaseException):
    """What a simulated callback raises for a ``BaseException`` that is no ``Exception``
    (as ``sys.exit`` or a test framework's ``fail()`` would)."""


class Released(Exception):
    """An HTTP endpoint (or a route) that answered a status the policy does not store: to
    the gate, as if it had raised (its run's error; never raised).  ``status`` and ``body``
    are what it answered, and what its own client must get."""

    def __init__(self, message: str, status: int, body: bytes) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ServerError(Released):
    """An HTTP endpoint that answered 5xx."""


class RetryLater(Released):
    """An HTTP endpoint that answered a 4xx asking for the same request again (408, 425,
    429): released like a 5xx, so the retry runs the endpoint again."""


class Unstorable:
    """A callback result that is not JSON: its record completes without a response."""

    def __init__(self, call: int) -> None:
        self.call = call

    def __repr__(self) -> str:
        return f"Unstorable({self.call})"


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A response as its client received it: status, headers (lower-cased names), body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def decoded(self) -> tuple[int, bytes]:
        """What the response means to its client: its status and its body as decoded by
        its own headers (a gzip body labelled so is read unzipped)."""
        body = self.body
        if self.header("content-encoding") == "gzip":
            with contextlib.suppress(OSError):
                body = gzip.decompress(body)
        return self.status, body


@dataclass(slots=True)
class StepRun:
    """One ``step()`` a callback took: whether its function ran (the ledger counts the
    effect of each step, per key and step name), what it returned or raised."""

    call: int
    owner: str | None
    key: str | None
    name: str
    position: int
    started: float
    ran: bool = False
    """The step's function was called."""
    effect: bool = False
    """The step's effect happened (its function got past its work)."""
    result: Any = None
    """What the function returned (when it did)."""
    returned: float | None = None
    """When the function returned (loop time): its recovery point may be sent after."""
    value: Any = MISSING
    """What ``step()`` returned to the callback (its result, or the recorded one)."""
    error: BaseException | None = None
    """What ``step()`` raised."""
    ended: float | None = None


@dataclass(slots=True)
class Run:
    """One start of a callback, and how it ended."""

    call: int
    owner: str | None
    started: float
    ended: float | None = None
    returned: bool = False
    value: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    swallowed: bool = False
    blocked: bool = False
    answered: float | None = None
    """``execute_call`` (and the HTTP gate): when the callback completed the record through
    its ``Call`` — its point of no return (HTTP: its response head went to the gate)."""
    steps: list[StepRun] = field(default_factory=list)
    """The steps it took, in order."""


@dataclass(slots=True)
class Outcome:
    """What one caller got."""

    call: int
    entered: float
    deadline: float | None
    entered_at: int = 0
    """How many store applications had happened when the call started."""
    exited: float | None = None
    exited_at: int = 0
    value: Any = MISSING
    error: BaseException | None = None
    cancel_requested: float | None = None
    cancel_seq: int | None = None
    runs: list[Run] = field(default_factory=list)
    stray: BaseException | None = None
    """What interrupted the caller's own code after the call had returned (a cutoff left
    armed cancels unrelated code)."""
    http: HttpAnswer | None = None
    """The HTTP door: the response the client received (its meaning is in ``value`` or
    ``error``, as the other doors'd have it)."""
    skipped: bool = False
    """The call's manager refused its options: the call never ran."""
    in_flight: tuple[int, ...] = ()
    """The store requests of the call (their ``seq``) still awaited when it returned: work
    the call left behind (G6: no detached tasks)."""
    answer: Any = None
    """The MCP door: what the client received (``_mcp_door.McpAnswer``).  The route door
    keeps its proxy response, as a client reads it, in ``http``."""

    @property
    def returned_value(self) -> bool:
        return self.value is not MISSING


@dataclass(slots=True)
class Trace:
    """Everything a scenario did: the store's log, the callbacks, the callers' outcomes."""

    scenario: Scenario
    store: FaultyStore
    managers: list[Manager | None]
    keys: dict[int, str]
    start: float
    outcomes: list[Outcome]
    runs: list[Run]
    unfinished: list[int] = field(default_factory=list)
    leftover_tasks: list[str] = field(default_factory=list)
    probes: dict[str, Any] = field(default_factory=dict)
    probed_at: float = 0.0
    base: float = BASE_TIME
    """Unix time at the scenario's start, in true time."""
    own_clock: bool = False
    """The store judged by a real clock of its own (true time: the machine's clock)."""
    pauses: list[tuple[float, float]] = field(default_factory=list)
    """Loop-time intervals during which a callback blocked the loop (every manager shares
    it, so each one paused)."""
    call_keys: dict[int, str] = field(default_factory=dict)
    """The store key of each call that has one (an HTTP request's differs from a plain
    call's of the same key index: the gate keys by method, route and Idempotency-Key)."""
    refused: dict[int, BaseException] = field(default_factory=dict)
    """Managers whose options were refused at construction, with the error."""
    message_managers: dict[int, Manager] = field(default_factory=dict)
    """Batches keyed by message id: each process's manager without a key selection."""
    http_rules: dict[int, Any] = field(default_factory=dict)
    """The HTTP door: each process's gate (one derived manager, as one middleware has)."""
    peers: dict[tuple[str, int], Any] = field(default_factory=dict)
    """The MCP and route doors: each process's server or resolver, by door and process."""
    lags: list[tuple[float, float]] = field(default_factory=list)
    """Real time: (loop time, lag) — how late the loop woke a timer, sampled all along."""
    steps: list[StepRun] = field(default_factory=list)
    """The ledger of steps: every step any callback took, in the order they started."""
    records_steps: bool = True
    """The store records steps (``RecordsSteps``): the callbacks take their planned steps
    (a store without the capability: none)."""

    def paused_during(self, start: float, end: float | None) -> bool:
        return any(start <= until and (end is None or end >= since) for since, until in self.pauses)

    def lag_during(self, start: float, end: float) -> float:
        """The longest the loop was late in ``[start, end]`` (0 in virtual time)."""
        worst = 0.0
        for at, lag in self.lags:
            # A sample taken at ``at`` covers the wait that ended there.
            if start - lag <= at and at - lag <= end:
                worst = max(worst, lag)
        return worst
