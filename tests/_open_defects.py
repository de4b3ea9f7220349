"""Generator features of the fault simulator that still break the guarantee on this
branch, each with the defect it finds (``tests/test_simulator_regressions.py`` holds a
seed for each).  The simulator's CI run leaves them out; remove a feature here when the
fix of its defect merges (its regression case then passes, and its xfail marker goes)."""

from __future__ import annotations

OPEN_DEFECTS: dict[str, str] = {
    "plain_callbacks": "defect 1: a plain function as the callback (branch core)",
    "base_exceptions": "defect 2: a BaseException leaves the cutoff armed (branch core)",
    "error_types": "defect 4: a lost claim answer, then throttling, is never released (core)",
    "nonsense_claims": "defect 4: an unparseable claim answer is never released (branch core)",
    "server_clock": "defect 5: the local cache judges a server-clock record by the wall clock",
    "force_release": "defect 7: force_release discards the cache entry too early (core)",
    "bad_timeouts": "defect 8: timeout=inf / nan (branch core)",
    "get_nonsense": "finding A: a nonsense answer to get ends in AttributeError (core)",
    "call_handle_cutoff": "finding B: execute_call, a callback that ignores its cutoff (core)",
    "batch_duplicates": "finding C: an in-batch duplicate fails instead of joining (ops)",
}

EXCLUDE = tuple(sorted(OPEN_DEFECTS))

DYNAMODB_OPEN: tuple[str, ...] = ("unrepresentable",)
"""Defect 3 (branch stores): a result DynamoDB cannot encode leaves the record in
progress.  Only the live DynamoDB run leaves these out."""
