"""The simulator's store checks hold ``extend`` to the protocol: owner-fenced, and never
moving a lease end back (``StoreChecks.check_extend``, fed applications by hand)."""

from __future__ import annotations

import pytest

from idempotency_async.record import Claim, Record, Status
from idempotency_async.stores.base import Extended
from idempotency_async.testing._faults import Application, Op
from idempotency_async.testing._store_checks import StoreChecks

NOW = 1_700_000_000.0


def _record(owner: str, lease_end: float) -> Record:
    return Record("k#1", Status.INPROGRESS, int(lease_end) + 60, lease_end, "v", owner)


def _judge(before: Record | None, after: Record | None, answer: object, *, at: float) -> list[str]:
    claim = Claim("k#1", "owner-a", at, 10.0, 60.0, "v")
    op = Op(0, 0, None, "extend", "k#1", claim, 0.0)
    application = Application(0, 0.0, before, after, answer, None, True)
    failures: list[str] = []
    StoreChecks({"k#1": [(op, application)]}, lambda _: NOW, failures.append).check()
    return failures


def test_a_renewal_that_moves_the_lease_later_passes() -> None:
    before, after = _record("owner-a", NOW + 5), _record("owner-a", NOW + 12)
    assert _judge(before, after, Extended.RENEWED, at=NOW + 2) == []


def test_an_older_renewal_that_leaves_a_later_lease_passes() -> None:
    before = _record("owner-a", NOW + 12)
    assert _judge(before, before, Extended.ALREADY_LATER, at=NOW + 1) == []


@pytest.mark.parametrize("answer", [Extended.RENEWED, Extended.ALREADY_LATER])
def test_an_older_renewal_that_moves_the_lease_back_fails(answer: Extended) -> None:
    before, after = _record("owner-a", NOW + 12), _record("owner-a", NOW + 11)
    assert _judge(before, after, answer, at=NOW + 1)


@pytest.mark.parametrize("answer", [Extended.RENEWED, Extended.LOST, True])
def test_an_older_renewal_must_answer_already_later(answer: object) -> None:
    before = _record("owner-a", NOW + 12)
    assert _judge(before, before, answer, at=NOW + 1)


@pytest.mark.parametrize("answer", [Extended.ALREADY_LATER, Extended.LOST, True])
def test_a_renewal_of_an_earlier_lease_must_renew(answer: object) -> None:
    before = _record("owner-a", NOW + 5)
    after = before if answer is not True else _record("owner-a", NOW + 12)
    assert _judge(before, after, answer, at=NOW + 2)


@pytest.mark.parametrize("answer", [Extended.RENEWED, Extended.ALREADY_LATER, False])
def test_a_renewal_of_another_owners_record_must_be_lost(answer: object) -> None:
    before = _record("owner-b", NOW + 12)
    assert _judge(before, before, answer, at=NOW + 2)
