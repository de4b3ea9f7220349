"""Score the fault simulator on the blind mutants: python tests/mutants/blind/score.py [SEEDS]

Applies each patch of this folder to a copy of the package and runs the simulator alone
(``python -m idempotency_async.testing --seeds SEEDS --no-shrink``, leaving out the
generator features of defects still open, ``tests/_open_defects.py``); prints CAUGHT
(with the first failing seed) or MISSED per mutant, then the score.  The unpatched package
runs first: if it breaks the guarantee itself, the score would mean nothing, and none is
given.  Not a test: some are missed.  (The second set, ``../blind2/score.py``, also runs
the real stores and the tests of each miss.)
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _scoring import memory, score  # noqa: E402


def main() -> int:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    targets = (memory(seeds),)
    return score(sorted(HERE.glob("*.patch")), lambda patch: targets, lambda patch: ())


if __name__ == "__main__":
    sys.exit(main())
