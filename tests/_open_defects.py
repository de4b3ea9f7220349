"""Generator features of the fault simulator that still break the guarantee on this
branch, each with the defect it finds (``tests/test_simulator_regressions.py`` holds a
seed for each).  The simulator's CI run leaves them out; remove a feature here when the
fix of its defect merges (its regression case then passes, and its xfail marker goes)."""

from __future__ import annotations

OPEN_DEFECTS: dict[str, str] = {}

EXCLUDE = tuple(sorted(OPEN_DEFECTS))

DYNAMODB_OPEN: tuple[str, ...] = ()
"""Features only the live DynamoDB run leaves out (none open: defect 3, a result DynamoDB
cannot encode, is fixed)."""

ADDED_BY_ISSUE_32 = (
    "cross",
    "gate_late_completion",
    "deadline_sources",
    "http",
    "http_middleware",
    "lambda_context",
    "late_extends",
    "redelivery",
    "renew_settings",
    "slow_answers",
    "slow_batch",
)
"""The features "Where features meet" added: seeds recorded before it leave them out, so
they replay the scenario that was recorded (each draws from a stream of its own)."""
