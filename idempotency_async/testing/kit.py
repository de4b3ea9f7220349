"""Prove your handler: run your own idempotent code through duplicates, crashes and expiry.

.. code-block:: python

    from idempotency_async.testing.kit import check_handler, function_handler

    def build(store):                      # your handler, on the store the kit gives
        manager = Manager(store, Options(event_key_jmespath="id"))
        return idempotent_function(manager, payload="order", timeout=5)(charge)

    def test_charge_is_idempotent():
        check_handler(function_handler(build), payloads=[{"id": "o-1", "amount": 5}],
                      effects=lambda: len(PAYMENTS))

:func:`check_handler` runs, for each payload, duplicates in sequence and at once (in one
process and in two sharing the store), the first call cancelled at every await it makes
until its record completes, store faults and lost answers on its requests, a retry after
the lease, and the key reused with a payload differing in one field — and judges each run
against the guarantee of lease mode with the effect counter you give: at most one effect
per lease, and one effect when nothing crashed (one effect per key with
``downstream=True``, exactly once for transactional calls).  A handler that takes steps
(recovery points) is judged per step, and crashed before and after each step's recovery
point: a recorded step never runs again, an interrupted one at most once per lease, code
between steps makes no effect while a resumed call replays them, and a retry takes the
same steps in the same order.  Doors:
:func:`function_handler`, :func:`lambda_handler`, :func:`sqs_batch_handler`,
:func:`asgi_route`, :func:`aiohttp_route`.  A failure is shrunk to a smallest
scenario and raised as :class:`HandlerCheckFailed`, whose message ends with a reproducer
to paste into a test (:func:`replay` reruns it).  See ``docs/testing-your-handler.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import textwrap
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from idempotency_async.stores.base import Store
from idempotency_async.testing._kit_aiohttp import AiohttpRoute
from idempotency_async.testing._kit_batch import BatchItemFailed, SqsBatchHandler
from idempotency_async.testing._kit_engine import Engine, Failure
from idempotency_async.testing._kit_oracle import judge, kind_of
from idempotency_async.testing._kit_scenario import Call, Fault, Scenario, scenarios_for
from idempotency_async.testing._kit_targets import (
    AsgiRoute,
    FunctionHandler,
    HttpAnswer,
    LambdaHandler,
    Target,
)
from idempotency_async.testing._kit_variants import variants_of

__all__ = [
    "BatchItemFailed",
    "Call",
    "Fault",
    "HandlerCheckFailed",
    "HttpAnswer",
    "KitReport",
    "Scenario",
    "Target",
    "aiohttp_route",
    "asgi_route",
    "check_handler",
    "function_handler",
    "lambda_handler",
    "replay",
    "sqs_batch_handler",
]

Effects = Callable[[], int]


def function_handler(build: Callable[[Store], Callable[[Any], Awaitable[Any]]]) -> Target:
    """Your async function of one payload: ``build(store)`` returns it running on ``store``
    (e.g. ``idempotent_function(Manager(store, options), payload=...)(your_function)``).
    The kit builds it once per simulated process."""
    return FunctionHandler(build)


def lambda_handler(
    build: Callable[[Store], Callable[[Any, Any], Awaitable[Any]]], *, timeout: float = 30.0
) -> Target:
    """Your AWS Lambda ``async def handler(event, context)`` (decorated with
    ``idempotent_handler``): ``build(store)`` returns it running on ``store``.  Each payload
    is an event, invoked with a context that gives it ``timeout`` seconds (its lease)."""
    return LambdaHandler(build, timeout)


def asgi_route(
    build: Callable[[Store], Any],
    path: str,
    *,
    method: str = "POST",
    headers: Sequence[tuple[str, str]] = (),
    key_header: str = "Idempotency-Key",
) -> Target:
    """A route of your ASGI app (Starlette, FastAPI...): ``build(store)`` returns the app
    with its idempotency middleware on ``store``.  Each payload is sent as the JSON body of
    a ``method`` request to ``path`` carrying ``key_header``; ``headers`` are added (an API
    key your ``caller_scope`` reads, for example).  The app is called in process."""
    return AsgiRoute(build, path, method, tuple(headers), key_header)


def sqs_batch_handler(
    build: Callable[[Store], Callable[[Any, Any], Awaitable[Any]]],
    *,
    timeout: float = 30.0,
    copies: int = 1,
) -> Target:
    """Your AWS Lambda handler of SQS batches (``process_batch`` with partial batch
    responses): ``build(store)`` returns it running on ``store``.  Each payload is a
    message body, delivered in a batch of its own; each call redelivers the same message
    (its ``messageId`` kept).  A message the response names in ``batchItemFailures`` is
    :class:`BatchItemFailed` for the caller.  The task ``process_batch`` runs the record
    in is cancelled at each of its awaits in turn (a crash there).  ``copies``: the
    message is delivered that many times in each batch (a standard queue may do so)."""
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an integer >= 1, got {copies!r}")
    return SqsBatchHandler(build, timeout, copies)


def aiohttp_route(
    build: Callable[[Store], Any],
    path: str,
    *,
    method: str = "POST",
    headers: Sequence[tuple[str, str]] = (),
    key_header: str = "Idempotency-Key",
) -> Target:
    """A route of your aiohttp ``web.Application``: ``build(store)`` returns the app with
    its ``idempotency_middleware`` on ``store``.  Each payload is sent as the JSON body of
    a ``method`` request to ``path`` carrying ``key_header``, through aiohttp's own server
    protocol in process (no socket), so it runs on the kit's virtual clock."""
    return AiohttpRoute(build, path, method, tuple(headers), key_header)


@dataclass(frozen=True, slots=True)
class KitReport:
    """What a :func:`check_handler` run did."""

    payloads: int
    scenarios: int
    """Runs of a scenario (the checks' own runs included)."""
    seconds: float
    mode: str
    """The mode the runs used: ``lease``, or ``lease + renewal`` when a lease was renewed."""


class HandlerCheckFailed(AssertionError):
    """The handler broke the guarantee in ``scenario``; the message ends with a reproducer."""

    def __init__(self, message: str, scenario: Scenario, violations: list[str]) -> None:
        super().__init__(message)
        self.scenario = scenario
        self.violations = violations


def check_handler(
    target: Target,
    *,
    payloads: Any,
    effects: Effects,
    store: Callable[[], Store] | None = None,
    examples: int = 5,
    seed: int = 0,
    crash_points: int = 24,
    downstream: bool = False,
) -> KitReport:
    """Run the kit's scenarios on ``target`` for each payload; raise
    :class:`HandlerCheckFailed` (shrunk, with a reproducer) at the first violation.

    ``payloads``: a list of payloads, or a hypothesis strategy (``examples`` payloads are
    drawn from it, deterministically from ``seed``).  ``effects``: returns how many times
    the side effect has happened so far (rows written, charges sent): the kit reads it
    between steps.  ``store``: a factory of the store to test on (default: a
    ``MemoryStore`` per scenario, on virtual time; another store runs in real time, so
    give the handler a short timeout).  ``crash_points``: at most this many awaits of the
    first call are crash points.  ``downstream``: the handler sends its effect to a
    provider that deduplicates by key, with ``downstream_key``, and ``effects`` counts what
    the provider applied: the kit then judges one effect per key, whatever crashed.
    """
    engine = Engine(target, effects, store, downstream)
    report: KitReport = _outside_loop(
        lambda: _check(engine, payloads, examples, seed, crash_points)
    )
    return report


def replay(
    target: Target,
    scenario: Scenario,
    *,
    effects: Effects,
    store: Callable[[], Store] | None = None,
    downstream: bool = False,
) -> None:
    """Rerun one scenario (a reproducer); raise :class:`HandlerCheckFailed` if it fails."""
    engine = Engine(target, effects, store, downstream)
    engine.steps = True  # one scenario: its replayed steps are marked, if it takes steps

    def run() -> None:
        violations = engine.violations(scenario)
        if violations:
            raise HandlerCheckFailed(
                _message(Failure(scenario, violations), engine), scenario, violations
            )

    _outside_loop(run)


def _outside_loop(run: Callable[[], Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # Called from a coroutine (an async test): the kit's loops run in a thread of their own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _check(engine: Engine, payloads: Any, examples: int, seed: int, crash_points: int) -> KitReport:
    started = time.perf_counter()
    target = engine.target
    drawn = _draw(payloads, examples, seed)
    answered = 0
    for payload in drawn:
        failure, answer = _check_payload(engine, target, payload, crash_points)
        answered += answer
        if failure is not None:
            failure = engine.shrink(failure)
            failure = engine.simplest_payload(failure, drawn)
            raise HandlerCheckFailed(
                _message(failure, engine), failure.scenario, failure.violations
            )
    if not answered:
        scenario = Scenario(drawn[0], (Call(),))
        violations = [
            "no call answered: the handler raised for every payload on its first call, so "
            "the kit proved nothing (give it payloads it accepts)"
        ]
        failure = Failure(scenario, violations, "one call")
        raise HandlerCheckFailed(_message(failure, engine), scenario, violations)
    mode = " and ".join(sorted(engine.modes)) or "none (no call claimed a key)"
    return KitReport(len(drawn), engine.runs, time.perf_counter() - started, mode)


def _check_payload(
    engine: Engine, target: Target, payload: Any, crash_points: int
) -> tuple[Failure | None, bool]:
    """The first failure of ``payload``'s scenarios, and whether its first call answered."""
    baseline = Scenario(payload, (Call(),), name="one call")
    trace = engine.run(baseline)
    violations = judge(trace)
    answered = kind_of(trace.outcomes[0]) == "answer"
    if not violations and answered and trace.marks[-1].count == trace.marks[0].count:
        violations = [
            "effect counter never moved: one call answered but the counter you gave "
            "stayed the same, so the kit cannot see the effect (count what the handler does)"
        ]
    if violations:
        return Failure(baseline, violations, baseline.name), answered
    # Every await until the completion was answered: a crash with it in flight included.
    ended = ("complete done", "complete failed")
    completion = [m.steps for m in trace.marks if m.call == 0 and m.what in ended]
    steps = completion[0] if completion else trace.outcomes[0].steps
    # A handler taking steps: each recovery point its first call wrote is crashed at.
    recovery_points = {m.detail[0] for m in trace.marks if m.what == "record_step sent"}
    engine.steps = engine.steps or bool(recovery_points)
    variants = _same_key(engine, target, payload)
    for scenario in scenarios_for(payload, variants, steps, crash_points, len(recovery_points)):
        violations = engine.violations(scenario)
        if violations:
            return Failure(scenario, violations, scenario.name), answered
    return None, answered


def _same_key(engine: Engine, target: Target, payload: Any) -> list[Any]:
    """Variants of ``payload`` with one field changed that keep its key."""
    found: list[Any] = []

    async def keys() -> None:
        from idempotency_async.stores.memory import MemoryStore

        sender = target.build(MemoryStore())
        key = target.key_of(sender, payload, "kit-variants")
        if key is None:
            return
        for _, variant in variants_of(payload):
            if target.key_of(sender, variant, "kit-variants") == key:
                found.append(variant)

    asyncio.run(keys())
    return found[:4]


def _draw(payloads: Any, examples: int, seed: int) -> list[Any]:
    if type(payloads).__module__.startswith("hypothesis"):
        return _from_strategy(payloads, examples, seed)
    if isinstance(payloads, Sequence) and not isinstance(payloads, str | bytes):
        if not payloads:
            raise ValueError("check_handler needs at least one payload")
        return list(payloads)
    raise TypeError(f"payloads must be a list of payloads or a hypothesis strategy: {payloads!r}")


def _from_strategy(strategy: Any, examples: int, seed: int) -> list[Any]:
    # Only here: hypothesis is needed only by users who pass a strategy.
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    drawn: dict[str, Any] = {}

    @seeded(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(payload: Any) -> None:
        drawn.setdefault(repr(payload), payload)

    collect()
    return list(drawn.values())[:examples]


def _expression(obj: object, placeholder: str) -> tuple[str, str | None]:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return placeholder, None
    return f"{module}.{qualname}", module


def _message(failure: Failure, engine: Engine) -> str:
    target, effects, store = engine.target, engine.effects, engine.make_store
    effects_text, effects_module = _expression(effects, "<your effect counter>")
    build = getattr(target, "build_handler", None) or getattr(target, "build_app", None)
    _, build_module = _expression(build, "")
    imports = sorted({m for m in (build_module, effects_module) if m})
    store_text = ""
    if store is not None:
        store_text, _ = _expression(store, "<your store factory>")
        store_text = f"    store={store_text},\n"
    if engine.downstream:
        store_text += "    downstream=True,\n"
    door = target.expression().split("(", 1)[0]
    lines = [
        f"from idempotency_async.testing.kit import Call, Fault, Scenario, {door}, replay",
        *(f"import {module}" for module in imports),
        "",
        "replay(",
        f"    {target.expression()},",
        f"    {failure.scenario!r},",
        f"    effects={effects_text},",
        f"{store_text})",
    ]
    found = "\n".join(f"  - {violation}" for violation in failure.violations)
    guarantee = (
        "the recovery-point guarantee (a recorded step never runs again; an interrupted "
        "step runs again at most once per lease; a retry takes the same steps in the same "
        "order)"
        if failure.violations[0].startswith(
            (
                "step order differs",
                "effect outside a step",
                "recorded step",
                "step repeated",
                "step ran again",
            )
        )
        else "the transactional guarantee (the database effect exactly once)"
        if failure.violations[0].startswith(
            ("effect committed", "effect never committed", "transaction not run")
        )
        else "the downstream-key guarantee (a provider that honours the key sees one effect "
        "per key)"
        if failure.violations[0].startswith("effect repeated downstream")
        else "the lease-mode guarantee (at most one effect per lease; one effect when nothing "
        "crashed)"
    )
    return (
        f"the handler broke {guarantee}\n"
        f"{found}\n"
        f"first seen in: {failure.tried or 'the given scenario'}; shrunk reproducer:\n\n"
        + textwrap.indent("\n".join(lines), "    ")
    )
