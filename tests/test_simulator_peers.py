"""The simulator's peer doors: MCP tool calls through ``idempotent_tool`` on the SDK's
``MCPServer``, and API Gateway events through a Powertools route with ``idempotent_route``.

They are doors of the fault simulator like the others (their pairs are crossed in
``test_simulator.py``'s run); here, that their callers meet what the oracle must judge, and
that the oracle catches a defect planted in each door.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from idempotency_async import MemoryStore, errors
from idempotency_async.integrations import mcp, powertools
from idempotency_async.testing import SimulationFailure, generate, simulate
from idempotency_async.testing import _mcp_door as mcp_door
from idempotency_async.testing._axes import covering_rows
from idempotency_async.testing._run import run_scenario
from idempotency_async.testing._trace import ServerError
from idempotency_async.testing._vloop import VirtualClockLoop

SEEDS = range(400)


def _outcomes(door: str, seeds: range) -> Counter[str]:
    """What the callers of ``door`` got over ``seeds``: their own value, a replay, or an
    error by type."""
    seen: Counter[str] = Counter()
    for seed in seeds:
        scenario = generate(seed)
        if not any(call.door == door for call in scenario.calls):
            continue
        loop = VirtualClockLoop()
        try:
            trace = loop.run_until_complete(run_scenario(scenario, MemoryStore()))
        finally:
            loop.close()
        for outcome in trace.outcomes:
            if scenario.calls[outcome.call].door != door or outcome.skipped:
                continue
            if outcome.error is not None:
                seen[type(outcome.error).__name__] += 1
            elif any(run.returned and run.value is outcome.value for run in outcome.runs):
                seen["own"] += 1
            else:
                seen["replay"] += 1
    return seen


@pytest.mark.parametrize("door", ["mcp", "route"])
def test_a_peer_door_meets_duplicates_in_progress_mismatches_and_replays(door: str) -> None:
    assert any(row.get("door") == door for row in covering_rows())
    seen = _outcomes(door, SEEDS)
    for wanted in ("own", "replay", "AlreadyInProgressError", "PayloadValidationError"):
        assert seen[wanted] > 0, (wanted, seen)
    assert seen["CallbackFailed"] > 0 or seen["CancelledError"] > 0, seen
    if door == "route":
        assert seen[ServerError.__name__] > 0, seen  # a 500: the key released


def _caught(seeds: range = SEEDS) -> list[str]:
    with pytest.raises(SimulationFailure) as caught:
        simulate(MemoryStore, seeds, shrink=False)
    return caught.value.violations


def test_a_tool_answering_in_progress_with_a_result_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted: the decorator treats an identical call in progress as a success (an empty
    # result), so the model goes on as if the operation were done.
    real = mcp.idempotent_tool

    def planted(manager: Any, **options: Any) -> Callable[[Any], Any]:
        decorate = real(manager, **options)

        def wrap(func: Any) -> Any:
            tool = decorate(func)

            @functools.wraps(tool)
            async def answered(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await tool(*args, **kwargs)
                except mcp.ToolError as exc:
                    if isinstance(exc.__cause__, errors.AlreadyInProgressError):
                        return None
                    raise

            return answered

        return wrap

    monkeypatch.setattr(mcp_door, "idempotent_tool", planted)
    assert any("which no completed record" in v for v in _caught())


def test_a_tool_error_without_retry_advice_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted: the in-progress tool error no longer tells the model to retry, nor when.
    monkeypatch.setattr(mcp, "_advice", lambda exc: mcp_door.ADVICE["in_progress"])
    assert any(v.startswith("MCP:") and "retry this same call" in v for v in _caught())


def test_a_route_storing_a_500_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted: a 5xx is stored (and replayed) instead of releasing the key.
    monkeypatch.setattr(powertools, "_storable", lambda status: status not in (408, 409, 425, 429))
    assert any(v.startswith("G2:") and "answered 5xx" in v for v in _caught())


def test_a_route_replay_without_its_header_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted: a replay looks like the route's own response.
    real = powertools._replay

    def unmarked(stored: Any, replayed: str) -> Any:
        response = real(stored, replayed)
        response.headers.pop(replayed, None)
        return response

    monkeypatch.setattr(powertools, "_replay", unmarked)
    assert any("without the Idempotent-Replayed header" in v for v in _caught())


def test_a_route_raising_in_progress_instead_of_409_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted: in progress goes out of resolve_async as an exception (API Gateway: a 502).
    real = powertools._answer

    def raising(error: Exception, replayed: str) -> Any:
        if isinstance(error, errors.AlreadyInProgressError):
            raise error
        return real(error, replayed)

    monkeypatch.setattr(powertools, "_answer", raising)
    assert any("went out of resolve_async" in v for v in _caught())


def test_the_simulator_runs_without_the_peer_doors_dependencies() -> None:
    # A user's conformance run has neither the MCP SDK nor Powertools installed: the
    # simulator leaves their doors out instead of failing to import.
    import subprocess
    import sys

    program = (
        "import sys\n"
        "sys.modules['mcp'] = None\n"
        "sys.modules['aws_lambda_powertools'] = None\n"
        "from idempotency_async import MemoryStore\n"
        "from idempotency_async.testing import generate, simulate\n"
        "doors = {call.door for seed in range(300) for call in generate(seed).calls}\n"
        "assert not doors & {'mcp', 'route'}, doors\n"
        "report = simulate(MemoryStore, range(60))\n"
        "assert report.scenarios == 60, report.scenarios\n"
        "assert not {'mcp', 'aws_lambda_powertools'} & {\n"
        "    name for name, module in sys.modules.items() if module is not None\n"
        "}\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120)
