"""The runnable examples stay runnable, and show what they claim to show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import checkout_env

ROOT = Path(__file__).parents[1]


def test_quickstart_charges_each_order_once_and_recovers_after_the_lease() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=checkout_env(),
    )
    out = completed.stdout
    # ord-1 once (replayed, then rejected), ord-2 once for five callers, ord-3 once after the lease.
    assert out.count("payment API called") == 3
    assert "PayloadValidationError" in out
    assert "5 results, all equal: True" in out
    assert "AlreadyInProgressError" in out
    assert "'order': 'ord-3'" in out


def test_dynamodb_example_runs_against_its_own_moto_server() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dynamodb_local.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=checkout_env(),
    )
    out = completed.stdout
    assert out.count("payment API called") == 1
    assert "changed amount: PayloadValidationError" in out
    assert out.count("'charged': 42") == 3
    assert completed.stderr == ""
