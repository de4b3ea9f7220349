"""The simulator's oracle judges with a judgement of its own: it may import the library's
data types and errors, never the code that decides what a store or the manager does
(verdicts, expiry, lease and cutoff arithmetic, key and validation derivation)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTING = Path(__file__).resolve().parent.parent / "idempotency_async" / "testing"
ORACLE = [TESTING / "_oracle.py", TESTING / "_store_checks.py", TESTING / "_tx_oracle.py"]

ALLOWED_NAMES = {
    "idempotency_async.record": {"Claim", "Completion", "Record", "Status"},
    # Answer types, and a step write (recovery points): data, not judgement.
    "idempotency_async.stores.base": {
        "Extended",
        "Found",
        "Stepped",
        "StepWrite",
        "Verdict",
        "Written",
    },
    # The simulated processes' clocks (the simulator's own arithmetic, not the library's).
    "idempotency_async.testing._managers": {"clock_offset"},
}
ALLOWED_MODULES = {
    "idempotency_async": {"errors"},
    "idempotency_async.errors": None,  # exception types only
    "idempotency_async.testing._faults": None,  # the simulator's own trace types
    "idempotency_async.testing._plans": None,
    "idempotency_async.testing._scenario": None,
    "idempotency_async.testing._trace": None,
    "idempotency_async.testing._store_checks": None,
    "idempotency_async.testing._tx_run": None,
    "idempotency_async.testing._tx_scenario": None,  # the transactional scenario types
}
# Attributes that reach into the library's judgement through an object in the trace.
FORBIDDEN_ATTRIBUTES = {
    "_keys",
    "derive",
    "judge",
    "is_claimable",
    "is_expired",
    "lease_lapsed",
    "expiration_for",
    "reserve_for",
    "to_record",
    "key_for",
}


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("idempotency_async"):
                    found.append(f"{path.name}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if not module.startswith("idempotency_async"):
                continue
            names = {alias.name for alias in node.names}
            if module in ALLOWED_NAMES:
                extra = names - ALLOWED_NAMES[module]
            elif module in ALLOWED_MODULES:
                allowed = ALLOWED_MODULES[module]
                extra = set() if allowed is None else names - allowed
            else:
                extra = names
            found.extend(f"{path.name}: from {module} import {name}" for name in sorted(extra))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", ORACLE, ids=[path.name for path in ORACLE])
def test_the_oracle_imports_no_judgement_of_the_library(path: Path) -> None:
    assert _violations(path) == []


def test_the_import_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from idempotency_async.stores.base import Found, judge\n"
        "from idempotency_async.record import expiration_for\n"
        "import idempotency_async.deadlines\n"
        "x = manager._keys.derive({})\n"
    )
    assert _violations(bad) == [
        "bad.py: from idempotency_async.stores.base import judge",
        "bad.py: from idempotency_async.record import expiration_for",
        "bad.py: import idempotency_async.deadlines",
        "bad.py:4: .derive",
        "bad.py:4: ._keys",
    ]


def test_the_oracle_s_validation_hash_is_the_contract_s() -> None:
    # The hash the oracle computes on its own equals the library's for the simulator's
    # payloads, so a replay across a validation mismatch is seen.
    from idempotency_async.canonical import canonical_json, digest
    from idempotency_async.testing._oracle import validation_hash

    for amount in (1, 2, -7, 0, "x"):
        assert validation_hash(amount) == digest(canonical_json(amount))
