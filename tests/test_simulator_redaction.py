"""Redaction as a simulator axis: the covering array crosses it with every other axis, and
the oracle catches a library that leaks a redacted field to a duplicate, stores it, stores
a never-stored response, or hands the first caller the redacted form."""

from __future__ import annotations

from typing import Any

import pytest
from _open_defects import EXCLUDE

from idempotency_async import MemoryStore, Redaction
from idempotency_async._responses import Responses
from idempotency_async._stored_redaction import remove
from idempotency_async.testing import SimulationFailure, simulate
from idempotency_async.testing._axes import AXES, conflict, covering_rows, feasible_pairs

SEEDS = range(2 * len(covering_rows()) + 40)


def test_redaction_is_an_axis_that_meets_every_door_but_http() -> None:
    assert AXES["redaction"] == ("off", "fields", "never_store")
    pairs = feasible_pairs()
    for redaction in ("fields", "never_store"):
        for door in AXES["door"]:
            assert ((("door", door), ("redaction", redaction)) in pairs) == (door != "http")
        # Only an HTTP endpoint streams: no stream meets a manager's redaction.
        assert (("outcome", "stream"), ("redaction", redaction)) not in pairs
        assert (("cache", "on"), ("redaction", redaction)) in pairs
        assert (("renewal", "on"), ("redaction", redaction)) in pairs
    assert conflict({"door": "http", "redaction": "never_store"}) is not None


def test_the_simulator_crosses_every_redaction_pair_and_keeps_the_guarantee() -> None:
    report = simulate(MemoryStore, SEEDS, workers=1, exclude=EXCLUDE)
    # Two passes over the covering array cross every redaction pair (every pair of every
    # axis is CI's 7,000-seed run's to require: a row of another pair realized twice in a
    # full store, say, may not fire its fault here).
    missing = report.coverage.missing_pairs(EXCLUDE)
    assert [pair for pair in missing if any(axis == "redaction" for axis, _ in pair)] == []
    crossed = [pair for pair in report.coverage.pairs if ("redaction", "fields") in pair]
    assert len(crossed) > 30


def _fails(monkeypatch: pytest.MonkeyPatch, target: type, name: str, replacement: Any) -> str:
    monkeypatch.setattr(target, name, replacement)
    with pytest.raises(SimulationFailure) as caught:
        simulate(MemoryStore, SEEDS, workers=1, exclude=EXCLUDE, shrink=False)
    return str(caught.value)


def test_a_redaction_that_removes_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def keep_all(self: Redaction, value: Any) -> tuple[Any, tuple[str, ...]]:
        return value, ()

    text = _fails(monkeypatch, Redaction, "apply", keep_all)
    assert "redaction:" in text


def test_a_redaction_that_edits_the_callers_result_in_place_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def in_place(self: Redaction, value: Any) -> tuple[Any, tuple[str, ...]]:
        for path in self.paths:
            if isinstance(value, dict) and remove(value, path.steps)[1]:
                value.pop(path.steps[0])  # the caller's own object
        return value, ()

    text = _fails(monkeypatch, Redaction, "apply", in_place)
    assert "redacted in place" in text


def test_a_never_store_that_stores_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Responses.encode

    def storing(self: Responses, result: Any, limit: int, key: str) -> Any:
        kept = self._redaction
        self._redaction = None
        try:
            return original(self, result, limit, key)
        finally:
            self._redaction = kept

    text = _fails(monkeypatch, Responses, "encode", storing)
    assert "redaction:" in text
