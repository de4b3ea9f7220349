"""Seeds the widened fault simulator found, one per defect of issue 21 (and three more it
found on the way), each on the code as it was before its fix.

Each case runs its seed with every other open defect's generator feature left out, so
it fails for its own defect alone.  The xfail markers go when the fixes merge (strict:
a fixed defect makes its case pass, and the marker must then be removed, together with
its feature in ``_open_defects.py``).  ``python -m idempotency_async.testing --seed N
--exclude ...`` reruns a case and prints the scenario shrunk to its minimum.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _moto import fresh_table
from _open_defects import ADDED_BY_ISSUE_32, DYNAMODB_OPEN, OPEN_DEFECTS

from idempotency_async import MemoryStore
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.testing import Scenario, SimulationFailure, run_one, simulate, simulate_live

DATA = Path(__file__).resolve().parent / "data" / "simulator"

ADDED_AFTER_BLIND2 = (
    "cancel_at_cutoff",
    "cleanup_completion",
    "fifo_batches",
    "http_limits",
    "release_races",
)
"""The features added after the second blind mutation set (tests/mutants/blind2): seeds
recorded before them leave them out, so they replay the scenario that was recorded."""
ADDED_WITH_PEER_DOORS = ("mcp", "routes")
"""The peer doors (MCP tool calls, Powertools routes), each from a stream of its own: seeds
recorded before them leave them out (a seed found by ``cross`` still meets another row: a
new door value changes the covering array; its shrunk scenario replays exactly)."""
ADDED_WITH_STEPS = ("steps",)
"""Recovery points (steps), from streams of their own: seeds recorded before them leave
them out (a new axis changes the covering array: a seed found by ``cross`` meets another
row; its shrunk scenario replays exactly — its plans default to no steps)."""
LATER = (*ADDED_BY_ISSUE_32, *ADDED_AFTER_BLIND2, *ADDED_WITH_PEER_DOORS, *ADDED_WITH_STEPS)


def _case(feature: str, seed: int, defect: str, branch: str) -> Any:
    """A seed that broke the guarantee before its fix; still open while its feature is in
    ``_open_defects.py`` (then it must fail, strictly: the marker goes with the fix)."""
    marks = ()
    if feature in OPEN_DEFECTS:
        marks = (
            pytest.mark.xfail(
                strict=True, raises=SimulationFailure, reason=f"{defect}: open ({branch})"
            ),
        )
    return pytest.param(feature, seed, id=f"{defect}-{feature}-seed{seed}", marks=marks)


# (feature, seed): what the seed's scenario does, and what breaks.
CASES = [
    # A plain function as the callback: it runs, the await fails with TypeError, the key
    # is released (G2) and a retry runs it again.
    _case("plain_callbacks", 1, "defect 1", "core"),
    # A callback raising a BaseException that is not an Exception: the caller's own code
    # is cancelled later by the cutoff left armed (G5).
    _case("base_exceptions", 33, "defect 2", "core"),
    # A claim that applied, whose answer was lost, then throttled on the retry: never
    # released, the key stays in progress for its whole lease (G4).
    _case("error_types", 72, "defect 4", "core"),
    # The same with an unparseable answer to the claim.
    _case("nonsense_claims", 13, "defect 4", "core"),
    # A server-clock store, a worker whose clock is behind, its local cache on: it replays
    # a record the store already let expire and replaced (G3/G6).
    _case("server_clock", 1195, "defect 5", "core"),
    # An operator's force_release while the same manager replays: the cache entry is put
    # back, and the manager keeps replaying the deleted record (G6).
    _case("force_release", 352, "defect 7", "core"),
    # timeout=inf: a timer at infinity (a call that never ends); timeout=nan: a lease that
    # never lapses.  Both must be ConfigError at the call.
    _case("bad_timeouts", 11, "defect 8", "core"),
    # Not in issue 21: a nonsense answer to the get the manager polls with ends in an
    # AttributeError (an undocumented outcome, G5) instead of StoreUnavailableError.
    _case("get_nonsense", 14, "finding A", "core (not yet assigned)"),
    # Not in issue 21: an execute_call callback that ignores its cutoff and returns ends
    # in a bare CancelledError though nobody cancelled the caller (G5), the key left in
    # progress.
    _case("call_handle_cutoff", 321, "finding B", "core (not yet assigned)"),
    # Not in issue 21: two copies of one SQS message in a batch, the first runs long and
    # the manager has no `wait`: the copy fails (is redelivered) instead of joining the
    # first record's call, as the contract asks of in-batch duplicates.
    _case("batch_duplicates", 50, "finding C", "ops (not yet assigned)"),
]


# The generator features that were open when the seeds were recorded: each case leaves out
# all of them but its own, so it replays exactly the scenario that was recorded.
RECORDED_WITHOUT = (
    "plain_callbacks",
    "base_exceptions",
    "error_types",
    "nonsense_claims",
    "server_clock",
    "force_release",
    "bad_timeouts",
    "get_nonsense",
    "call_handle_cutoff",
    "batch_duplicates",
)


@pytest.mark.parametrize(("feature", "seed"), CASES)
def test_the_simulator_s_seed_keeps_the_guarantee(feature: str, seed: int) -> None:
    others = tuple(sorted((set(RECORDED_WITHOUT) - {feature}) | set(LATER)))
    simulate(MemoryStore, [seed], exclude=others, shrink=False)


def test_every_open_feature_has_its_case() -> None:
    assert set(OPEN_DEFECTS) <= {case.values[0] for case in CASES} | set(ISSUE_32_FEATURES)


DYNAMODB_SEED = 10


@pytest.mark.dynamodb
async def test_dynamodb_records_results_it_cannot_encode(dynamodb_client: Any) -> None:
    # Defect 3: a result the manager accepts but DynamoDB cannot encode (an int wider than
    # 64 bits with a lone surrogate beside it) leaves the record in progress; after the
    # lease the side effect runs again.  Seed 10's call 1 returns such a result; the
    # completion fails with UnicodeEncodeError and the key stays in progress (G1, G2).
    table = await fresh_table(dynamodb_client)
    await simulate_live(
        lambda: DynamoDBStore(dynamodb_client, table_name=table),
        [DYNAMODB_SEED],
        scale=0.05,
        concurrency=1,
        tolerance=1.0,
        exclude=tuple(sorted(set(OPEN_DEFECTS) | set(LATER))),
    )
    assert DYNAMODB_OPEN == ()


def test_a_batch_whose_handler_cancels_itself_reports_the_record() -> None:
    # Found past the 20,000 seeds CI then ran (seed 38325 of a 60,000-seed run, before lease
    # renewal was generated): a batch handler raising CancelledError on its own made
    # process_batch raise it, and its key stayed in progress (G3/G5).  Fixed by running a
    # batch's records in a task group that reports such a record as failed, and by treating
    # a callback's own CancelledError as its own exception (the key is released).
    simulate(
        MemoryStore,
        [38325],
        exclude=("call_handle_cutoff", "get_nonsense", "renewal", *LATER),
        shrink=False,
    )


# "Where features meet" (issue 32): the crossing simulator's finds on the code before the
# fixes (branch renew), and two of issue 41 (branch doors).  Each case keeps the seed that
# found it (with the features left out then) and the scenario it shrank to, which replays
# exactly whatever the generator becomes (tests/data/simulator/where_features_meet.json).
_FEATURES_MEET = json.loads((DATA / "where_features_meet.json").read_text())
ISSUE_32_FEATURES = sorted({case["feature"] for case in _FEATURES_MEET})


def _meet(case: dict[str, Any]) -> Any:
    marks = ()
    if case["feature"] in OPEN_DEFECTS:
        marks = (
            pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{case['defect']}: open"),
        )
    return pytest.param(case, id=f"{case['name']}-seed{case['seed']}", marks=marks)


@pytest.mark.parametrize("case", [_meet(case) for case in _FEATURES_MEET])
def test_where_features_meet_the_seed_keeps_the_guarantee(case: dict[str, Any]) -> None:
    # The seed, as it was found (the generator's streams keep it).
    exclude = [*case["exclude"], *ADDED_AFTER_BLIND2, *ADDED_WITH_PEER_DOORS, *ADDED_WITH_STEPS]
    simulate(MemoryStore, [case["seed"]], exclude=exclude, shrink=False)


@pytest.mark.parametrize("case", [_meet(case) for case in _FEATURES_MEET])
def test_where_features_meet_the_shrunk_scenario_keeps_the_guarantee(
    case: dict[str, Any],
) -> None:
    scenario = Scenario.from_json(json.dumps(case["scenario"]))
    assert run_one(scenario) == []


# Found by the release races added after the second blind mutation set (seed 262 of a
# 2,500-seed run, while the racing process still ran other calls): a call of the process
# that force-released a key, started after the release returned, joins that process's
# claim sent before it (in flight, its answer slow) and replays the released record —
# "after its own force_release, a manager never replays the released record" (G6).  The
# cache is guarded (a fill for a request sent before a release ended is dropped); the
# in-flight table is not.  Open: the fix is the lifecycle's (single flight).
_JOINED_RELEASED = {
    "seed": 262,
    "validate": False,
    "managers": [
        {
            "skew": 0.0,
            "wait": False,
            "wait_timeout": 6.991,
            "lease": None,
            "lease_margin": 0.0,
            "expires_after": 3600.0,
            "use_local_cache": False,
            "completion_reserve": None,
        }
    ],
    "calls": [
        # completes the key at t=0
        {"at": 0.0, "behaviour": "return", "faults": []},
        # replays it: its claim reaches the record at t=0.6, the answer comes at t=0.9
        {"at": 0.6, "behaviour": "return", "faults": [["claim", 0, "slow_answer", 0.3]]},
        # the operator's force_release, at t=0.6 (once the claim above applied)
        {"at": 0.0, "behaviour": "return", "faults": [], "door": "operator", "timeout": 2.364},
        # starts after the release returned: must run, not replay the released record
        {"at": 0.826, "behaviour": "return", "faults": []},
    ],
}


def test_a_call_after_its_own_force_release_joins_a_replay_sent_before_it() -> None:
    base = {"manager": 0, "key": 1, "amount": 1, "deadline": "timeout", "timeout": 3.0}
    calls = [
        {
            **base,
            "duration": 0.0,
            "cancel_after": None,
            **call,
            "faults": [
                dict(zip(("op", "nth", "kind", "seconds"), f, strict=True)) for f in call["faults"]
            ],
        }
        for call in _JOINED_RELEASED["calls"]
    ]
    scenario = Scenario.from_json(json.dumps({**_JOINED_RELEASED, "calls": calls}))
    assert run_one(scenario) == []


# Found by a 10,000-seed run at the start of the spine's last stop (seed 22496, shrunk):
# a duplicate joins, in its process, a call whose claim met another worker's record; its
# wait ends as that call holds the key, and it was refused (AlreadyInProgressError) without
# its payload compared with the holder's — "validation comes before refusal, in process
# too" (G5).  Manager 0's clock is 1.3 s behind; call 3 carries another payload.
_REFUSED_UNVALIDATED = {
    "seed": 22496,
    "validate": True,
    "managers": [
        {"skew": -1.306, "wait": True, "wait_timeout": 2.528},
        {"skew": 0.0, "wait": False, "wait_timeout": 3.96},
        {"skew": 0.0, "wait": False, "wait_timeout": 3.623},
    ],
    "calls": [
        # another worker holds the key for 4.2 s (cut off at its deadline)
        {"manager": 1, "amount": 1, "at": 0.0, "timeout": 4.114, "duration": 4.207},
        {"manager": 2, "amount": 1, "at": 3.81, "timeout": 6.233, "cancel_after": 2.314},
        # waits on that record, then claims the key
        {"manager": 0, "amount": 1, "at": 0.0, "timeout": 7.155, "duration": 2.612},
        # joins the call above in process, with another payload
        {"manager": 0, "amount": 2, "at": 0.0, "timeout": 2.688, "steps": 2, "step_at": 1},
    ],
}


def _completed_plan(plan: dict[str, Any]) -> Scenario:
    """A compact scenario plan with every other manager and call field at its default."""
    manager = {
        "lease": None,
        "lease_margin": 0.0,
        "expires_after": 3600.0,
        "use_local_cache": False,
        "completion_reserve": None,
    }
    call = {"key": 0, "amount": 1, "deadline": "timeout", "behaviour": "return"}
    call |= {"duration": 0.0, "cancel_after": None, "faults": []}
    scenario = {
        **plan,
        "managers": [{**manager, **each} for each in plan["managers"]],
        "calls": [{**call, **each} for each in plan["calls"]],
    }
    return Scenario.from_json(json.dumps(scenario))


def test_a_joined_duplicate_refused_as_the_holder_claims_is_validated_first() -> None:
    assert run_one(_completed_plan(_REFUSED_UNVALIDATED)) == []


# Judged, not fixed (a 20,000-seed run of the same stop, seed 53566, shrunk): process B
# sends a claim (its answer slow), process A's operator force-releases the key and A runs
# it again; a duplicate in B, arriving meanwhile, joins B's claim and replays what that
# claim met — the released record.  B cannot see A's release: the documented hazard of
# force_release (docs/manager.md, "Operators"), as with a local cache; the oracle exempts it.
_JOINED_BEFORE_ANOTHER_RELEASE = {
    "seed": 53566,
    "validate": False,
    "managers": [
        {"skew": 0.0, "wait": False, "wait_timeout": 1.838},
        {"skew": 0.0, "wait": False, "wait_timeout": 5.334},
    ],
    "calls": [
        {"manager": 0, "at": 0.0, "timeout": 4.484},
        # B's claim reaches the completed record at t=10.98; its answer comes 2.3 s later
        {
            "manager": 1,
            "at": 10.98,
            "timeout": 4.012,
            "faults": [
                {"op": "claim", "nth": 0, "kind": "slow_answer", "seconds": 2.322},
            ],
        },
        # A's operator releases the key, and A runs it again
        {"manager": 0, "at": 0.0, "timeout": 2.646, "door": "operator"},
        {"manager": 0, "at": 0.0, "timeout": 3.0},
        # joins B's claim at t=11.864
        {"manager": 1, "at": 11.864, "timeout": 7.749},
    ],
}


def test_a_duplicate_joining_a_claim_sent_before_another_process_s_release() -> None:
    assert run_one(_completed_plan(_JOINED_BEFORE_ANOTHER_RELEASE)) == []


# Found by a 10,000-seed run of the spine's next stop (seed 70984, shrunk): a renewed
# execute_call completes early (Call.complete_without_response at t=0.975) while the renewal
# sent at t=0.836 is on its way; it is confirmed at t=1.123, moving the lease end from 2.508
# to 3.344.  The completion (4.7 s slow) was abandoned at 2.508, the lease end known when it
# was sent: "writes after the callback are bounded at the lease end as renewed" (G1(c)).
_RENEWED_UNDER_A_CALL_COMPLETION = {
    "seed": 70984,
    "validate": False,
    "managers": [{"skew": 0.0, "wait": False, "wait_timeout": 4.353, "renew_lease": 2.508}],
    "calls": [
        {
            "manager": 0,
            "at": 0.0,
            "timeout": 4.064,
            "behaviour": "complete_without_response",
            "duration": 1.95,
            "door": "execute_call",
            "faults": [
                {"op": "complete", "nth": 0, "kind": "delay", "seconds": 4.711},
                {"op": "extend", "nth": 0, "kind": "delay", "seconds": 0.287},
            ],
        }
    ],
}


def test_a_renewal_confirmed_under_a_call_s_completion_moves_its_bound() -> None:
    assert run_one(_completed_plan(_RENEWED_UNDER_A_CALL_COMPLETION)) == []


# Judged, not fixed (a 10,000-seed run of this stop, seed 113937, shrunk): the grant
# counterpart of seed 53566.  Process A sends a claim (its answer slow) that the store
# grants; an operator force-releases the key and process B claims and completes it; a
# duplicate in A, arriving before A's answer, joins A's claim and, once it is granted, is
# refused in process: A holds the key as far as A can tell.  The documented hazard of
# force_release (its call still running), which the oracle exempts as it does 53566.
_JOINED_A_GRANT_BEFORE_ANOTHER_RELEASE = {
    "seed": 113937,
    "validate": False,
    "managers": [
        {"skew": 0.0, "wait": False, "wait_timeout": 1.403},
        {"skew": 0.0, "wait": False, "wait_timeout": 6.677},
    ],
    "calls": [
        # A's claim is granted at t=6.413; its answer comes 2.9 s later
        {
            "manager": 0,
            "at": 6.413,
            "timeout": 5.71,
            "duration": 2.847,
            "faults": [{"op": "claim", "nth": 0, "kind": "slow_answer", "seconds": 2.944}],
        },
        # B's operator releases the key, and B runs it again (completed)
        {"manager": 1, "at": 0.0, "timeout": 3.545, "door": "operator"},
        {"manager": 1, "at": 0.0, "timeout": 3.0},
        # joins A's claim at t=8.934
        {"manager": 0, "at": 8.934, "timeout": 4.642},
    ],
}


def test_a_duplicate_joining_a_grant_made_before_another_process_s_release() -> None:
    assert run_one(_completed_plan(_JOINED_A_GRANT_BEFORE_ANOTHER_RELEASE)) == []
