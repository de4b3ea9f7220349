"""A record's recovery points (``Record.steps``) as the CLI shows them.

The step list is JSON text the manager wrote — ``[["name", result], ["name", null,
"reason not stored"], ...]`` — read here as any other field another writer may have put in
the store: shown, never trusted; a list that cannot be read is said to be unreadable.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from idempotency_async.record import Record, Status

__all__ = ["Step", "progress_of", "released", "steps_json", "steps_lines"]


class Step(NamedTuple):
    """One recorded step: its name, and its result or why it was not stored."""

    name: str
    size: int
    """Bytes of its result as compact JSON (0 when not stored)."""
    result: Any = None
    reason: str | None = None
    """Why the result was not stored; ``None`` when it was."""


def progress_of(record: Record) -> list[Step] | str | None:
    """The record's steps; ``None`` when it holds none; a str saying why they cannot be
    read."""
    if record.steps is None:
        return None
    try:
        entries = json.loads(record.steps)
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({str(exc)[:80]})"
    if not isinstance(entries, list):
        return "not a list of steps"
    steps: list[Step] = []
    for entry in entries:
        if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
            return f"step {len(steps) + 1} is not [name, result]"
        if len(entry) == 3 and entry[1] is None and isinstance(entry[2], str):
            steps.append(Step(entry[0], 0, None, entry[2]))
        elif len(entry) == 2:
            steps.append(Step(entry[0], _size(entry[1]), entry[1]))
        else:
            return f"step {len(steps) + 1} is not [name, result] or [name, null, reason]"
    return steps


def released(record: Record, now: float) -> bool:
    """Whether ``record`` is released with its progress kept: in progress, its lease
    ended, no owner, steps recorded — the state a failed call with steps leaves."""
    return (
        record.status is Status.INPROGRESS
        and record.owner is None
        and record.steps is not None
        and record.lease_lapsed(now)
    )


def steps_lines(record: Record, *, show_results: bool) -> list[tuple[str, str]]:
    """``(label, value)`` rows for ``get``: the count and names, then (with
    ``show_results``) one row per step with its result."""
    progress = progress_of(record)
    if progress is None:
        return []
    if isinstance(progress, str):
        return [
            (
                "steps",
                f"unreadable: {progress}. A retry fails with InconsistentStateError; "
                "`idempotency-async release` removes the record",
            )
        ]
    listed = ", ".join(_summary(step) for step in progress)
    rows = [("steps", f"{len(progress)} recorded: {listed}")]
    if record.status is Status.INPROGRESS:
        rows.append(
            ("resumes", f"a retry with the same payload resumes at step {len(progress) + 1}")
        )
    if show_results:
        for number, step in enumerate(progress, 1):
            value = (
                f"not stored: {step.reason}"
                if step.reason is not None
                else json.dumps(step.result, ensure_ascii=False)
            )
            rows.append((f"step {number}", f"{step.name} = {value}"))
    return rows


def steps_json(record: Record, *, show_results: bool) -> dict[str, Any]:
    """``step_count`` and ``steps`` for ``--json`` (``None`` both when there are none;
    ``steps_unreadable`` says why a list could not be read)."""
    progress = progress_of(record)
    if progress is None:
        return {"step_count": None, "steps": None}
    if isinstance(progress, str):
        return {"step_count": None, "steps": None, "steps_unreadable": progress}
    steps = []
    for step in progress:
        item: dict[str, Any] = {
            "name": step.name,
            "stored": step.reason is None,
            "bytes": step.size,
        }
        if step.reason is not None:
            item["not_stored"] = step.reason
        elif show_results:
            item["result"] = step.result
        steps.append(item)
    return {"step_count": len(steps), "steps": steps}


def _summary(step: Step) -> str:
    if step.reason is not None:
        return f"{step.name} (result not stored)"
    return f"{step.name} ({step.size} B)"


def _size(result: Any) -> int:
    try:
        text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return 0
    return len(text.encode("utf-8", "surrogatepass"))
