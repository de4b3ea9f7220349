"""The simulator's axes: the features a scenario crosses, which of their values can meet in
one call, the named triples, and a covering array of the pairs.

A call of a scenario has one value on each axis (an operator's ``force_release`` none on
``shape``, ``outcome``, ``deadline`` and ``steps``: it runs no callback); every fault that fired on
one of its store requests gives it a ``fault`` and a ``place`` value, paired with its other
values (a call with two faults pairs each fault with its own request only).  The features
cross where every *pair* of values of two axes meets in some call — every pair that can
meet at all: :func:`conflict` says which cannot, and why.

:func:`covering_rows` is a small set of full assignments covering every such pair (and
each named triple); the generator's ``cross`` feature makes one call of seed ``s`` realize
row ``s mod len(rows)``, so a few hundred seeds cross every pair, not thousands by chance.
Nothing here depends on the library: it is the plan a run is measured against.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Iterator, Mapping

__all__ = [
    "AXES",
    "SLOW",
    "TRIPLES",
    "Pair",
    "Row",
    "conflict",
    "covering_rows",
    "feasible_pairs",
    "pair",
    "pairs_of",
    "triples_of",
]

AXES: dict[str, tuple[str, ...]] = {
    "door": (
        "execute",
        "call_complete",  # execute_call completing early (then running on, or raising)
        "call_attach",  # execute_call completing without a response, then attaching one
        "call_never",  # execute_call whose callback never completes through its handle
        "decorated",
        "batch",
        "http",
        "operator",
        "mcp",  # a tool call through idempotent_tool, as the MCP SDK's server makes it
        "route",  # an API Gateway event through a Powertools route with idempotent_route
    ),
    "renewal": ("off", "on"),
    "cache": ("off", "on"),
    "clock": ("client", "server"),
    "skew": ("none", "skewed"),
    "fault": (
        "none",
        "error",
        "lose",
        "resend",
        "late",
        "delay",
        "slow_answer",
        "adrift",
        "stall",
        "nonsense",
    ),
    "place": (
        "none",
        "claim",
        "get",
        "complete",
        "release",
        "extend",
        "force_release",
        "record_step",  # a step's recovery point (stores that record steps)
    ),
    "shape": ("coroutine", "lambda", "plain"),
    "outcome": (
        "return",
        "raise",
        "hang",
        "ignore_cutoff",
        "crash",
        "cancel_self",
        "odd_result",
        "stream",
        "server_error",
        "declared",  # raises an error its manager declared a result (replay_errors)
        "client_error",  # an endpoint's 4xx the status policy stores and replays (402, 410)
        "retry_later",  # an endpoint's 4xx the policy releases like a 5xx (408, 425, 429)
    ),
    "deadline": ("none", "timeout", "deadline", "ambient", "lambda", "several"),
    # The manager's Redaction: off, a declared field removed, or no response stored.
    "redaction": ("off", "fields", "never_store"),
    # The callback's steps (recovery points): none, taken, or failing at one of them
    # (the plan's ``step_fault``; see ``_plans.StepFault``).
    "steps": ("none", "run", "raise_in", "raise_after", "crash_in", "mismatch", "not_stored"),
}
"""Every axis and its values, in a fixed order (the covering array depends on it)."""

SLOW = frozenset({"delay", "slow_answer", "adrift", "stall"})
"""Fault kinds that make an answer slow."""

STEP_RAISES = ("raise_in", "raise_after", "mismatch", "not_stored")
"""Step values whose callback raises at its step (its outcome is ``raise``)."""
STEP_ENDS = (*STEP_RAISES, "crash_in")
"""Step values whose callback ends at its step (``crash_in``: its outcome is ``crash``)."""
_WRITES = frozenset({"run", "raise_in", "raise_after", "crash_in", "not_stored"})
"""Step values whose callback writes a recovery point (a ``mismatch`` call raises before
its own)."""

_CALLBACK_AXES = ("shape", "outcome", "deadline", "steps")
_CALL_DOORS = frozenset({"call_complete", "call_attach"})

TRIPLES: dict[str, dict[str, frozenset[str]]] = {
    "renewal x execute_call x slow completion": {
        "renewal": frozenset({"on"}),
        "door": frozenset({"call_complete", "call_attach", "call_never"}),
        "fault": SLOW,
        "place": frozenset({"complete"}),
    },
    "renewal x HTTP gate x slow completion": {
        "renewal": frozenset({"on"}),
        "door": frozenset({"http"}),
        "fault": SLOW,
        "place": frozenset({"complete"}),
    },
    "renewal x lost extend x client clock": {
        "renewal": frozenset({"on"}),
        "fault": frozenset({"lose"}),
        "place": frozenset({"extend"}),
        "clock": frozenset({"client"}),
    },
    "cache x server clock x skew": {
        "cache": frozenset({"on"}),
        "clock": frozenset({"server"}),
        "skew": frozenset({"skewed"}),
    },
    "renewal x late extend x takeover": {
        "renewal": frozenset({"on"}),
        "fault": frozenset({"late", "adrift"}),
        "place": frozenset({"extend"}),
        "event": frozenset({"extend_after_takeover"}),
    },
    "Lambda batch x slow store x close deadline": {
        "door": frozenset({"batch"}),
        "deadline": frozenset({"lambda"}),
        "event": frozenset({"slow_store"}),
    },
    "HTTP gate x middleware x replay": {
        "door": frozenset({"http"}),
        "event": frozenset({"middleware", "replayed"}),
    },
    "local cache x expired record x later call": {
        "cache": frozenset({"on"}),
        "event": frozenset({"after_expiry"}),
    },
}
"""Named situations where three features (or more) meet: each must be covered too.  An
``event`` condition holds when the call's trace shows every event named (see
``_coverage``)."""

TRIPLE_FEATURES: dict[str, frozenset[str]] = {
    "renewal x execute_call x slow completion": frozenset({"renewal", "call_handle"}),
    "renewal x HTTP gate x slow completion": frozenset({"renewal", "http"}),
    "renewal x lost extend x client clock": frozenset({"renewal"}),
    "cache x server clock x skew": frozenset({"server_clock"}),
    "renewal x late extend x takeover": frozenset({"renewal", "late_extends"}),
    "Lambda batch x slow store x close deadline": frozenset({"lambda_context", "slow_batch"}),
    "HTTP gate x middleware x replay": frozenset({"http", "http_middleware"}),
    "local cache x expired record x later call": frozenset(),
}
"""The generator features each named triple needs (left out, it cannot be required)."""

VALUE_FEATURES: dict[tuple[str, str], str] = {
    ("door", "call_complete"): "call_handle",
    ("door", "call_attach"): "call_handle",
    ("door", "call_never"): "call_handle",
    ("door", "batch"): "batches",
    ("door", "http"): "http",
    ("door", "operator"): "force_release",
    ("door", "mcp"): "mcp",
    ("door", "route"): "routes",
    ("renewal", "on"): "renewal",
    ("clock", "server"): "server_clock",
    ("fault", "late"): "late_resends",
    ("fault", "slow_answer"): "slow_answers",
    ("fault", "adrift"): "slow_answers",
    ("place", "extend"): "renewal",
    ("place", "force_release"): "force_release",
    ("shape", "plain"): "plain_callbacks",
    ("outcome", "crash"): "base_exceptions",
    ("outcome", "cancel_self"): "own_cancel",
    ("outcome", "stream"): "http",
    ("outcome", "server_error"): "http",
    ("outcome", "declared"): "declared_errors",
    ("outcome", "client_error"): "statuses",
    ("outcome", "retry_later"): "statuses",
    ("deadline", "lambda"): "lambda_context",
    ("deadline", "several"): "deadline_sources",
    ("redaction", "fields"): "redaction",
    ("redaction", "never_store"): "redaction",
    ("place", "record_step"): "steps",
    **{("steps", value): "steps" for value in ("run", *STEP_ENDS)},
}
"""The generator feature a value needs: with the feature left out, no pair of it is due."""

Row = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]

PAIR_FEATURES: dict[Pair, str] = {
    (("door", "batch"), ("deadline", "several")): "lambda_context",
    (("door", "route"), ("deadline", "several")): "lambda_context",
}
"""Pairs that need a feature neither value needs alone (a batch's second deadline source
is its Lambda context)."""


def conflict(values: Mapping[str, str]) -> str | None:
    """Why these values (some axes of one call) cannot meet, or None when they can."""
    get = values.get
    door, fault, place = get("door"), get("fault"), get("place")
    shape, outcome, deadline = get("shape"), get("outcome"), get("deadline")
    if fault is not None and place is not None and (fault == "none") != (place == "none"):
        return "a fault has a place, and a place a fault"
    if door == "operator":
        if place not in (None, "none", "force_release"):
            return "an operator sends only force_release"
        if any(axis in values for axis in _CALLBACK_AXES):
            return "an operator runs no callback"
    if place == "force_release" and door not in (None, "operator"):
        return "only an operator force-releases"
    steps = get("steps")
    if steps not in (None, "none"):
        problem = _steps_conflict(values, steps)
        if problem is not None:
            return problem
    elif steps == "none" and place == "record_step":
        return "no recovery point without a step"
    if place == "extend":
        if get("renewal") == "off":
            return "no extend without renewal"
        if shape == "plain":
            return "a plain function runs without awaiting: nothing renews meanwhile"
    if place == "complete":
        if outcome in ("hang", "crash", "cancel_self", "server_error", "retry_later"):
            return "that callback never completes the record"
        if outcome == "raise" and door not in (None, *_CALL_DOORS):
            return "a callback that raises completes only through its Call first"
    if shape in ("lambda", "plain") and door in ("batch", "http", "decorated", *_PEERS):
        return "that door takes an async def (or runs the app's own)"
    if shape == "plain":
        if door in _CALL_DOORS:
            return "a plain function cannot await its Call"
        if outcome not in (None, "return", "raise", "odd_result"):
            return "a plain function returns or raises"
    if outcome == "declared" and door in ("batch", "http", "call_complete", "call_attach"):
        return "a declared error is judged at execute's doors (a batch or an endpoint answers it)"
    if outcome == "stream" and door not in (None, "http"):
        return "only an HTTP endpoint streams"
    if outcome in _STATUSES and door not in (None, "http", "route"):
        return "only an HTTP endpoint or a route answers with a status"
    if outcome == "odd_result" and door in ("http", "call_attach"):
        return "an HTTP response is bytes; an attached response is the callback's own"
    if door in _CALL_DOORS and outcome in ("hang", "ignore_cutoff", "crash", "cancel_self"):
        return "a Call completed early is past its cutoff"
    if door in _PEERS:
        return _peer_conflict(values)
    if deadline == "lambda" and door not in (None, "batch"):
        return "a Lambda context comes with a batch"
    if door == "batch" and deadline in ("timeout", "deadline"):
        return "a batch's deadline is its context's or an ambient one"
    if door == "http" and deadline in ("none", "deadline", "lambda", "ambient"):
        return "an HTTP request always has its request_timeout (with an ambient: several)"
    if door == "decorated" and deadline in ("deadline", "lambda"):
        return "a decorated function takes a timeout"
    if door == "http" and get("redaction") not in (None, "off"):
        return "the HTTP middleware redacts its own envelope (a manager that redacts is refused)"
    return None


_PEERS = ("mcp", "route")
_STATUSES = ("server_error", "client_error", "retry_later")


def _steps_conflict(values: Mapping[str, str], steps: str) -> str | None:
    """What a callback taking steps cannot be (``steps`` is not ``none``)."""
    door, outcome, place = values.get("door"), values.get("outcome"), values.get("place")
    if door == "operator":
        return "an operator runs no callback"
    if values.get("shape") == "plain":
        return "a plain function cannot await a step"
    if place == "record_step" and steps not in _WRITES:
        return "a mismatched step raises before writing"
    if place == "extend" and steps == "mismatch":
        return "a mismatched retry raises at its step, before a renewal is due"
    if steps in STEP_ENDS:
        own = "crash" if steps == "crash_in" else "raise"
        if outcome not in (None, own):
            return f"a callback whose step fails ends there ({own})"
        if door in _CALL_DOORS:
            return "a callback whose step fails never completes through its Call"
        if place == "complete":
            return "a callback whose step fails never completes the record"
    return None


def _peer_conflict(values: Mapping[str, str]) -> str | None:
    """What an MCP tool call or a Powertools route cannot be (the rules above apply too)."""
    door, outcome, deadline = values.get("door"), values.get("outcome"), values.get("deadline")
    if outcome == "odd_result":
        return "the SDK turns a tool's result into content, a route's into a proxy response"
    if deadline in ("timeout", "deadline", "several", "lambda") and door == "mcp":
        return "an MCP tool call's deadline is its server's (ambient): timeout= is fixed per tool"
    if deadline in ("timeout", "deadline") and door == "route":
        return "a route's deadline is the invocation's (its Lambda context) or ambient"
    return None


def pair(axis: str, value: str, other: str, other_value: str) -> Pair:
    """The pair of two values, in axis order."""
    order = _ORDER
    if order[axis] > order[other]:
        axis, value, other, other_value = other, other_value, axis, value
    return ((axis, value), (other, other_value))


_ORDER = {axis: index for index, axis in enumerate(AXES)}


def pairs_of(values: Mapping[str, str]) -> Iterator[Pair]:
    """Every pair among the values of one call (axes in order)."""
    present = [(axis, values[axis]) for axis in AXES if axis in values]
    yield from itertools.combinations(present, 2)


def triples_of(values: Mapping[str, str], events: Collection[str]) -> Iterator[str]:
    """The named triples one call's values (and its trace's events) meet."""
    for name, condition in TRIPLES.items():
        if all(
            wanted <= set(events) if axis == "event" else values.get(axis) in wanted
            for axis, wanted in condition.items()
        ):
            yield name


def _available(axis: str, value: str, excluded: Collection[str]) -> bool:
    feature = VALUE_FEATURES.get((axis, value))
    return feature is None or feature not in excluded


@functools.lru_cache(maxsize=8)
def feasible_pairs(excluded: frozenset[str] = frozenset()) -> frozenset[Pair]:
    """Every pair of values that can meet in one call, given the features left out."""
    found = set()
    for axis, other in itertools.combinations(AXES, 2):
        for value in AXES[axis]:
            if not _available(axis, value, excluded):
                continue
            for other_value in AXES[other]:
                candidate = ((axis, value), (other, other_value))
                needs = PAIR_FEATURES.get(candidate)
                if (
                    _available(other, other_value, excluded)
                    and (needs is None or needs not in excluded)
                    and _extendable({axis: value, other: other_value})
                ):
                    found.add(candidate)
    return frozenset(found)


# The axes the rules constrain; the others (cache, clock, skew) take any value.
_RULED = ("door", "place", "fault", "outcome", "shape", "deadline", "renewal", "redaction")
# Constrained too, by the values of door, place, outcome and shape only: each whole call
# of the ruled axes is kept with the steps values it allows (not multiplied by them).
_STEPPED = ("steps",)
_MASKED = frozenset((*_RULED, *_STEPPED))


@functools.lru_cache(maxsize=1)
def _calls() -> tuple[dict[tuple[str, str], int], int]:
    """Every whole call the rules allow (on the ruled axes), as bit sets: the calls holding
    each value, and all of them."""
    found: list[Row] = []

    def extend(values: Row, depth: int) -> None:
        if conflict(values) is not None:
            return
        if depth == len(_RULED):
            found.append(values)
            return
        axis = _RULED[depth]
        if values.get("door") == "operator" and axis in _CALLBACK_AXES:
            extend(values, depth + 1)
            return
        for value in AXES[axis]:
            extend({**values, axis: value}, depth + 1)

    extend({}, 0)
    # The steps values each call allows (they depend on its door, place, outcome and
    # shape only); a call that allows none cannot be (a recovery point with no step).
    allowed: dict[tuple[str | None, ...], tuple[str, ...]] = {}
    kept: list[tuple[Row, tuple[str, ...]]] = []
    for call in found:
        if call.get("door") == "operator":
            kept.append((call, ()))
            continue
        facts = tuple(call.get(axis) for axis in ("door", "place", "outcome", "shape"))
        steps = allowed.get(facts)
        if steps is None:
            steps = allowed[facts] = tuple(
                value for value in AXES["steps"] if conflict({**call, "steps": value}) is None
            )
        if steps:
            kept.append((call, steps))
    holding: dict[tuple[str, str], list[int]] = {}
    for number, (call, steps) in enumerate(kept):
        for item in call.items():
            holding.setdefault(item, []).append(number)
        for value in steps:
            holding.setdefault(("steps", value), []).append(number)
    size = len(kept) // 8 + 1
    index = {}
    for item, numbers in holding.items():
        mask = bytearray(size)  # one per value (not one per call and value: 12 kB each)
        for number in numbers:
            mask[number >> 3] |= 1 << (number & 7)
        index[item] = int.from_bytes(mask, "little")
    return index, (1 << len(kept)) - 1


def _matching(values: Mapping[str, str]) -> int:
    index, every = _calls()
    matching = every
    for axis, value in values.items():
        if axis in _MASKED:
            matching &= index.get((axis, value), 0)
    return matching


def _extendable(values: Mapping[str, str]) -> bool:
    """Whether these values fit in some whole call."""
    return bool(_matching(values))


@functools.lru_cache(maxsize=1)
def covering_rows() -> tuple[Row, ...]:
    """Full assignments covering every feasible pair, then one row per named triple.

    Greedy (each row starts from the first pair still uncovered and picks, axis by axis,
    the feasible value that covers the most pairs still uncovered) and deterministic.
    """
    uncovered = set(feasible_pairs())
    rows: list[Row] = []
    while uncovered:
        (axis, value), (other, other_value) = min(uncovered)
        row = _complete({axis: value, other: other_value}, uncovered)
        rows.append(row)
        uncovered -= set(pairs_of(row))
    for condition in TRIPLES.values():
        start = {axis: sorted(wanted)[0] for axis, wanted in condition.items() if axis != "event"}
        row = _complete(start, set())
        if "event" in condition:
            row["event"] = ",".join(sorted(condition["event"]))
        rows.append(row)
    return tuple(rows)


def _complete(start: Row, uncovered: set[Pair]) -> Row:
    row = dict(start)
    operator = row.get("door") == "operator"
    index, _ = _calls()
    matching = _matching(row)
    for axis in AXES:
        if axis in row or (operator and axis in _CALLBACK_AXES):
            continue
        best: str | None = None
        best_gain = -1
        for value in AXES[axis]:
            if axis in _MASKED and not matching & index.get((axis, value), 0):
                continue
            gain = sum(
                1
                for other, other_value in row.items()
                if pair(axis, value, other, other_value) in uncovered
            )
            if gain > best_gain:
                best, best_gain = value, gain
        if best is None:
            raise AssertionError(f"no value of {axis} fits {row}")  # the rules contradict
        row[axis] = best
        if axis in _MASKED:
            matching = matching & index[(axis, best)]
        if axis == "door" and best == "operator":
            operator = True
            for dropped in _CALLBACK_AXES:
                row.pop(dropped, None)
    return row
