"""What the mutant scores share: apply a patch to a copy of the project, run the fault
simulator on the store the patch mutates, and (for a mutant the simulator missed) the
project's own tests of the code it mutates.  Used by ``blind/score.py`` and
``blind2/score.py``; not a test.

A simulator run is a *target*: the virtual-time run on ``MemoryStore`` (``python -m
idempotency_async.testing``), or one of the real-time runs of the project's test suite
(DynamoDB on moto through either transport, Redis by the client's and the server's clock,
Postgres, the transactional simulator), run with pytest and its ``SIM_*_SEEDS`` variable.
A target *catches* a mutant when a scenario broke the guarantee (the seed is reported);
any other failure is an error, reported as such and not counted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from _open_defects import EXCLUDE  # noqa: E402

_SEED = re.compile(r"(?:transactional )?seed (\d+) broke the guarantee")
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    """One simulator run: the memory run (``tests`` empty) or pytest node ids, with the
    environment variable that sets their seed count."""

    name: str
    tests: tuple[str, ...] = ()
    seeds_var: str = ""
    seeds: int = 0


def memory(seeds: int) -> Target:
    return Target(f"memory ({seeds} seeds)", seeds=seeds)


@dataclass
class Verdict:
    """What one target said about one copy of the package."""

    target: str
    outcome: str  # "caught", "missed", "error"
    seed: int | None = None
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Score:
    mutant: str
    simulator: list[Verdict] = field(default_factory=list)
    tests: str = ""  # "", "caught", "missed" (sim+tests: run only when the simulator missed)
    failing_tests: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return any(v.outcome == "caught" for v in self.simulator)

    @property
    def first_seed(self) -> str:
        caught = [v for v in self.simulator if v.outcome == "caught"]
        return ", ".join(f"{v.target.split(' (')[0]} seed {v.seed}" for v in caught)


LIVE_EXCLUDE: list[str] = []
"""Generator features the copy's real-time runs leave out besides the open defects' (set
by the caller: a feature that fails the unpatched package in real time on this machine)."""


def copy_project(tmp: Path) -> None:
    """The package, the tests and the project's configuration, so pytest runs the copy."""
    shutil.copytree(ROOT / "idempotency_async", tmp / "idempotency_async")
    shutil.copytree(
        ROOT / "tests",
        tmp / "tests",
        ignore=shutil.ignore_patterns("__pycache__", ".hypothesis", "mutants"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    if LIVE_EXCLUDE:
        # The copy's own list, which every real-time run of its tests leaves out.
        with (tmp / "tests" / "_open_defects.py").open("a") as defects:
            defects.write(f"\nEXCLUDE = tuple(sorted({{*EXCLUDE, *{LIVE_EXCLUDE!r}}}))\n")


def _env(tmp: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(tmp), CI="true", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _pytest(
    tmp: Path, tests: Sequence[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests],
        cwd=tmp,
        env=_env(tmp, env),
        capture_output=True,
        text=True,
    )


def run_target(tmp: Path, target: Target) -> Verdict:
    started = time.monotonic()
    if not target.tests:
        command = [sys.executable, "-m", "idempotency_async.testing", "--no-shrink"]
        command += ["--seeds", str(target.seeds), "--exclude", ",".join(EXCLUDE)]
        run = subprocess.run(command, cwd=tmp, env=_env(tmp, {}), capture_output=True, text=True)
    else:
        run = _pytest(tmp, target.tests, {target.seeds_var: str(target.seeds)})
    seconds = round(time.monotonic() - started, 1)
    text = run.stdout + run.stderr
    found = _SEED.search(text)
    if run.returncode == 0:
        return Verdict(target.name, "missed", seconds=seconds)
    if found is not None:
        violation = text[found.end() :].lstrip(":").strip().splitlines()
        detail = violation[0].strip(" -") if violation else ""
        return Verdict(target.name, "caught", int(found.group(1)), seconds, detail[:300])
    return Verdict(target.name, "error", seconds=seconds, detail=text.strip()[-600:])


def failing_tests(tmp: Path, tests: Sequence[str]) -> set[str]:
    """The test ids that fail (or error) in ``tests`` on this copy."""
    run = _pytest(tmp, tests, {})
    if run.returncode not in (0, 1):
        return {f"<pytest exited {run.returncode}: {run.stdout.strip()[-300:]}>"}
    return set(_FAILED.findall(run.stdout))


def patched(patch: Path, tmp: Path) -> bool:
    copy_project(tmp)
    applied = subprocess.run(
        ["patch", "-p1", "--quiet", "-i", str(patch)], cwd=tmp, capture_output=True
    )
    return applied.returncode == 0


def score(
    patches: Sequence[Path],
    targets_for: Callable[[Path], Sequence[Target]],
    tests_for: Callable[[Path], Sequence[str]],
    *,
    jobs: int = 1,
    report: Path | None = None,
) -> int:
    """Score the simulator on ``patches``: each mutant against its targets, then (if they
    all missed it) against the test files ``tests_for`` names.  The unpatched package runs
    every target (and test file) used first: if it fails, no score is given."""
    targets = {t for patch in patches for t in targets_for(patch)}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        copy_project(tmp)
        for target in sorted(targets, key=lambda t: t.name):
            base = run_target(tmp, target)
            print(f"unpatched, {target.name}: {base.outcome} ({base.seconds} s)", flush=True)
            if base.outcome != "missed":
                print(f"the unpatched package fails {target.name} (seed {base.seed}): no score")
                print(base.detail)
                return 1
        baseline: dict[tuple[str, ...], set[str]] = {}

        def base_failures(tests: tuple[str, ...]) -> set[str]:
            if tests not in baseline:
                baseline[tests] = failing_tests(tmp, tests)
            return baseline[tests]

        def one(patch: Path) -> Score:
            result = Score(patch.stem)
            with tempfile.TemporaryDirectory() as inner:
                copy = Path(inner)
                if not patched(patch, copy):
                    result.simulator.append(Verdict("patch", "error", detail="does not apply"))
                    return result
                for target in targets_for(patch):
                    result.simulator.append(run_target(copy, target))
                    if result.caught:
                        break
                tests = tuple(tests_for(patch))
                if not result.caught and tests:
                    new = sorted(failing_tests(copy, tests) - base_failures(tests))
                    result.tests = "caught" if new else "missed"
                    result.failing_tests = new
            _print(result)
            return result

        with ThreadPoolExecutor(jobs) as pool:
            scores = list(pool.map(one, patches))
    caught = sum(s.caught for s in scores)
    both = sum(s.caught or s.tests == "caught" for s in scores)
    print(f"\nthe simulator alone caught {caught} of {len(scores)}; sim+tests {both}")
    if report is not None:
        rows = [dict(asdict(s), caught=s.caught) for s in scores]
        report.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _print(result: Score) -> None:
    if result.caught:
        verdict = f"CAUGHT ({result.first_seed})"
    elif any(v.outcome == "error" for v in result.simulator):
        errors = [v.detail[-200:] for v in result.simulator if v.outcome == "error"]
        verdict = f"MISSED, with errors: {errors}"
    else:
        verdict = "MISSED"
    if result.tests:
        verdict += f"; tests: {result.tests.upper()} {' '.join(result.failing_tests[:3])}"
    print(f"{result.mutant}: {verdict}", flush=True)
