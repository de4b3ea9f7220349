"""Mutation check: each patch in ``tests/mutants/`` brings back one lifecycle defect that
was fixed, and the fault simulator must catch it within 2,000 seeds.

Each mutant runs in a copy of the package (the worktree is never patched).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _open_defects import EXCLUDE

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = sorted((ROOT / "tests" / "mutants").glob("*.patch"))
SEEDS = 2000


def test_every_defect_class_has_a_mutant() -> None:
    assert {path.stem for path in MUTANTS} == {
        "lease_without_deadline",
        "cutoff_during_release",
        "retried_claim_meets_itself",
        "single_flight_before_the_answer",
        "timeout_without_key",
        "completion_outliving_the_lease",
        # Recovery points (steps): a recovery point written before its step ran; a key
        # released after a step whose recovery point may be missing.
        "step_recorded_before_running",
        "release_after_unsettled_step",
    }


@pytest.mark.parametrize("patch", MUTANTS, ids=[path.stem for path in MUTANTS])
def test_the_simulator_catches_the_mutant(patch: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "idempotency_async", tmp_path / "idempotency_async")
    applied = subprocess.run(
        ["patch", "-p1", "--quiet", "-i", str(patch)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert applied.returncode == 0, f"{patch.name} no longer applies:\n{applied.stdout}"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        # Open defects' generator features are left out: the mutant alone must be caught.
        [
            sys.executable,
            "-m",
            "idempotency_async.testing",
            "--seeds",
            str(SEEDS),
            "--exclude",
            ",".join(EXCLUDE),
            "--no-shrink",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, f"the simulator missed {patch.stem}:\n{run.stdout}{run.stderr}"
    assert "broke the guarantee" in run.stderr
    assert "rerun: python -m idempotency_async.testing --seed" in run.stderr
