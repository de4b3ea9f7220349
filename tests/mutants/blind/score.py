"""Score the fault simulator on the blind mutants: python tests/mutants/blind/score.py [SEEDS]

Applies each patch of this folder to a copy of the package and runs the simulator alone
(``python -m idempotency_async.testing --seeds SEEDS --no-shrink``, leaving out the
generator features of defects still open, ``tests/_open_defects.py``); prints CAUGHT
(with the first failing seed) or MISSED per mutant, then the score.  The unpatched package
runs first: if it breaks the guarantee itself, the score would mean nothing, and none is
given.  Not a test: some are missed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from _open_defects import EXCLUDE  # noqa: E402


def _simulate(tmp: str, seeds: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "idempotency_async.testing",
            "--seeds",
            seeds,
            "--no-shrink",
            "--exclude",
            ",".join(EXCLUDE),
        ],
        cwd=tmp,
        env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def main() -> int:
    seeds = sys.argv[1] if len(sys.argv) > 1 else "2000"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "idempotency_async", Path(tmp) / "idempotency_async")
        base = _simulate(tmp, seeds)
        if base.returncode != 0:
            print(f"the unpatched package fails the simulator: no score\n{base.stderr[-2000:]}")
            return 1
    caught = 0
    patches = sorted(HERE.glob("*.patch"))
    for patch in patches:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(ROOT / "idempotency_async", Path(tmp) / "idempotency_async")
            applied = subprocess.run(
                ["patch", "-p1", "--quiet", "-i", str(patch)], cwd=tmp, capture_output=True
            )
            if applied.returncode != 0:
                print(f"{patch.stem}: DOES NOT APPLY (re-express it on the current code)")
                continue
            run = _simulate(tmp, seeds)
            if run.returncode == 1 and "broke the guarantee" in run.stderr:
                caught += 1
                first = run.stderr.split(" broke the guarantee", 1)[0].rsplit("\n", 1)[-1]
                print(f"{patch.stem}: CAUGHT ({first})")
            elif run.returncode == 0:
                print(f"{patch.stem}: MISSED")
            else:
                print(f"{patch.stem}: ERROR {run.stderr.strip()[-200:]}")
    print(f"the simulator alone caught {caught} of {len(patches)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
