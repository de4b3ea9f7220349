"""downstream_key: one stable key per name and idempotency key, at every door, only while a
callback runs."""

from __future__ import annotations

import asyncio
import base64
import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_async import (
    Call,
    Manager,
    MemoryStore,
    Options,
    downstream_key,
    errors,
    idempotent_function,
)
from idempotency_async.downstream import downstream_key_or_none
from idempotency_async.integrations.aws_lambda import idempotent_handler, process_batch

URLSAFE = set(string.ascii_letters + string.digits + "-_")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def manager(clock: Clock | None = None, **options: Any) -> Manager:
    return Manager(
        MemoryStore(),
        Options(event_key_jmespath="id", clock=clock or Clock(), expires_after=60, **options),
    )


async def keys_in_run(manager: Manager, payload: Any, *names: str) -> list[str]:
    """The downstream keys of ``names`` as an ``execute`` callback sees them."""
    seen: list[str] = []

    async def work() -> str:
        seen.extend(downstream_key(name) for name in names)
        return "done"

    assert await manager.execute(payload, work, timeout=5) == "done"
    return seen


async def test_every_run_of_one_key_derives_the_same_keys_even_after_expiry() -> None:
    clock = Clock()
    runs = manager(clock)
    first = await keys_in_run(runs, {"id": 1}, "charge", "email")
    clock.now += 3600  # the record expired: the next call runs the callback again
    second = await keys_in_run(runs, {"id": 1}, "charge", "email")
    # A new manager on a new store (another process, the record long gone) too.
    third = await keys_in_run(manager(), {"id": 1}, "charge", "email")
    assert first == second == third
    assert first[0] != first[1]  # one key per name


async def test_a_run_after_a_failed_run_derives_the_same_key() -> None:
    runs = manager()
    seen: list[str] = []

    async def fails_once() -> str:
        seen.append(downstream_key("charge"))
        if len(seen) == 1:
            raise RuntimeError("the charge timed out")
        return "charged"

    with pytest.raises(RuntimeError):
        await runs.execute({"id": 7}, fails_once, timeout=5)
    assert await runs.execute({"id": 7}, fails_once, timeout=5) == "charged"
    assert len(seen) == 2
    assert seen[0] == seen[1]


async def test_keys_differ_per_idempotency_key_and_hide_the_record_key() -> None:
    runs = manager()
    (one,) = await keys_in_run(runs, {"id": 1}, "charge")
    (two,) = await keys_in_run(runs, {"id": 2}, "charge")
    assert one != two
    record_key = runs.key_for({"id": 1})
    assert record_key is not None
    digest = record_key.split("#", 1)[1]
    assert digest not in one and record_key not in one
    # Short enough for every provider's limit (Square: 45), and header-safe.
    assert len(one) == 43
    assert set(one) <= URLSAFE
    assert len(base64.urlsafe_b64decode(one + "=")) == 32


async def test_different_prefixes_give_different_keys() -> None:
    (charge,) = await keys_in_run(manager(key_prefix="charge"), {"id": 1}, "call")
    (refund,) = await keys_in_run(manager(key_prefix="refund"), {"id": 1}, "call")
    assert charge != refund


async def test_execute_call_and_execute_see_the_same_key_for_one_record_key() -> None:
    clock = Clock()
    runs = manager(clock)
    (from_execute,) = await keys_in_run(runs, {"id": 3}, "charge")
    clock.now += 3600
    seen: list[str] = []

    async def work(call: Call) -> str:
        seen.append(downstream_key("charge"))
        await call.complete("done")
        # Still the callback's run after its point of no return.
        seen.append(downstream_key("charge"))
        return "done"

    assert await runs.execute_call({"id": 3}, work, timeout=5) == "done"
    assert seen == [from_execute, from_execute]


async def test_decorated_functions_and_lambda_handlers_see_their_keys() -> None:
    runs = manager()
    seen: list[str] = []

    @idempotent_function(runs, payload="order", timeout=5)
    async def charge(order: dict[str, int]) -> str:
        seen.append(downstream_key("charge"))
        return "charged"

    @idempotent_handler(runs)
    async def handler(event: dict[str, int], context: object) -> str:
        seen.append(downstream_key("charge"))
        return "handled"

    assert await charge({"id": 1}) == "charged"
    assert await handler({"id": 1}, None) == "handled"
    assert len(seen) == 2
    # Two functions, two prefixes: two operations, two keys.
    assert seen[0] != seen[1]
    # The key is the one execute derives under the same record key elsewhere.
    elsewhere = manager(key_prefix=charge.manager.key_prefix)
    assert elsewhere.key_for({"id": 1}) == charge.manager.key_for({"id": 1})
    assert await keys_in_run(elsewhere, {"id": 1}, "charge") == [seen[0]]


async def test_batch_records_see_their_own_keys_and_keep_them_when_redelivered() -> None:
    runs = Manager(MemoryStore(), Options(key_prefix="ship", event_key_jmespath="body.order_id"))
    seen: dict[str, list[str]] = {}

    async def ship(record: dict[str, Any]) -> str:
        order = record["body"]
        await asyncio.sleep(0)  # records run concurrently: each keeps its own key
        seen.setdefault(order["order_id"], []).append(downstream_key("ship"))
        if order["quantity"] <= 0:
            raise ValueError("nothing to ship")
        return "shipped"

    event = json.loads((Path(__file__).parent / "events" / "sqs.json").read_text())
    await process_batch(runs, event, ship)
    await process_batch(runs, event, ship)  # the failed record is redelivered and runs again
    assert sorted(seen) == ["ord-1001", "ord-1002", "ord-1003"]
    assert [len(keys) for _, keys in sorted(seen.items())] == [1, 2, 1]
    assert seen["ord-1002"][0] == seen["ord-1002"][1]
    assert len({keys[0] for keys in seen.values()}) == 3


async def test_outside_a_callback_downstream_key_raises_and_the_variant_returns_none() -> None:
    with pytest.raises(errors.NoDownstreamKeyError, match="outside a running idempotent") as raised:
        downstream_key("charge")
    assert raised.value.name == "charge"
    assert isinstance(raised.value, LookupError)
    assert downstream_key_or_none("charge") is None


async def test_a_call_without_a_key_has_no_downstream_key() -> None:
    runs = manager()
    seen: list[str | None] = []

    async def work() -> str:
        seen.append(downstream_key_or_none("charge"))
        with pytest.raises(errors.NoDownstreamKeyError):
            downstream_key("charge")
        return "ran"

    assert await runs.execute({"no": "id"}, work, timeout=5) == "ran"

    async def with_call(call: Call) -> str:
        return await work()

    assert await runs.execute_call({"no": "id"}, with_call, timeout=5) == "ran"
    assert seen == [None, None]


async def test_disabled_idempotency_has_no_downstream_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "1")
    runs = manager()
    seen: list[str | None] = []

    async def work() -> str:
        seen.append(downstream_key_or_none("charge"))
        return "ran"

    assert await runs.execute({"id": 1}, work, timeout=5) == "ran"
    assert seen == [None]


async def test_tasks_spawned_inside_see_the_key_until_the_call_ends() -> None:
    runs = manager()
    release = asyncio.Event()
    inside: list[str | None] = []

    async def child() -> str | None:
        inside.append(downstream_key_or_none("charge"))
        await release.wait()  # the call ends meanwhile
        return downstream_key_or_none("charge")

    spawned: list[asyncio.Task[str | None]] = []

    async def work() -> str:
        spawned.append(asyncio.create_task(child()))
        await asyncio.sleep(0)
        inside.append(downstream_key("charge"))
        return "done"

    assert await runs.execute({"id": 1}, work, timeout=5) == "done"
    release.set()
    after = await spawned[0]
    assert inside[0] is not None and inside[0] == inside[1]
    assert after is None  # the call ended: its spawned task no longer has a key


async def test_nested_calls_see_their_own_key_and_restore_the_outer_one() -> None:
    runs = manager()
    seen: dict[str, str] = {}

    async def inner() -> str:
        seen["inner"] = downstream_key("charge")
        return "inner"

    async def outer() -> str:
        seen["before"] = downstream_key("charge")
        await runs.execute({"id": 2}, inner, timeout=5)
        seen["after"] = downstream_key("charge")
        return "outer"

    assert await runs.execute({"id": 1}, outer, timeout=5) == "outer"
    assert seen["before"] == seen["after"] != seen["inner"]
    (inner_alone,) = await keys_in_run(manager(), {"id": 2}, "charge")
    assert seen["inner"] == inner_alone
    assert downstream_key_or_none("charge") is None


async def test_a_callback_cut_off_or_raising_leaves_no_key_behind() -> None:
    runs = manager()

    async def raises() -> str:
        downstream_key("charge")
        raise ValueError("declined")

    with pytest.raises(ValueError):
        await runs.execute({"id": 1}, raises, timeout=5)
    assert downstream_key_or_none("charge") is None

    async def hangs() -> str:
        await asyncio.sleep(10)
        return "never"

    with pytest.raises(errors.DeadlineExceededError):
        await runs.execute({"id": 2}, hangs, timeout=0.05)
    assert downstream_key_or_none("charge") is None


@pytest.mark.parametrize("name", ["", None, 3, b"charge"])
async def test_a_name_must_be_a_non_empty_str(name: Any) -> None:
    with pytest.raises(errors.ConfigError, match="non-empty str name"):
        downstream_key(name)


@settings(max_examples=60, deadline=None)
@given(
    payload=st.one_of(st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=40)),
    names=st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=4, unique=True),
    prefix=st.text(alphabet=string.ascii_letters + ".-_", max_size=12),
)
def test_property_every_run_of_a_key_derives_the_same_keys(
    payload: Any, names: list[str], prefix: str
) -> None:
    async def both_runs() -> tuple[list[str], list[str], list[str]]:
        clock = Clock()
        runs = manager(clock, key_prefix=prefix)
        first = await keys_in_run(runs, {"id": payload}, *names)
        clock.now += 3600
        again = await keys_in_run(runs, {"id": payload}, *names)
        fresh = await keys_in_run(manager(key_prefix=prefix), {"id": payload}, *names)
        return first, again, fresh

    first, again, fresh = asyncio.run(both_runs())
    assert first == again == fresh
    assert len(set(first)) == len(names)
    assert all(len(key) == 43 and set(key) <= URLSAFE for key in first)
