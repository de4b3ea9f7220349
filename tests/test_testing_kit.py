"""The users' test kit (``idempotency_async.testing.kit``) on the examples' own handlers:
the quickstart's ``charge_card`` and the FastAPI example's ``POST /orders`` pass it, and a
deliberately broken variant of each (an effect before the claim, a key ignoring a field,
a route left unmarked, an effect then an exception) is caught and shrunk to a reproducer
that reruns as printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from support import checkout_env

from idempotency_async import Manager, MemoryStore, Options, idempotent_function
from idempotency_async.stores.base import Store
from idempotency_async.testing.kit import (
    Call,
    HandlerCheckFailed,
    Scenario,
    asgi_route,
    check_handler,
    function_handler,
    lambda_handler,
    replay,
)

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import fastapi_app  # noqa: E402
import quickstart  # noqa: E402

from idempotency_async.integrations.fastapi import IdempotentTransaction  # noqa: E402

CHARGES: list[dict[str, Any]] = []
ORDERS = st.fixed_dictionaries(
    {"id": st.text("abc", min_size=1, max_size=3), "amount": st.integers(1, 500)}
)


def charges() -> int:
    return len(CHARGES)


async def charge(order: dict[str, Any]) -> dict[str, Any]:
    """The quickstart's side effect, counted."""
    result = await quickstart.charge_card(order)
    CHARGES.append(result)
    return result


def build_quickstart(store: Store) -> Any:
    manager = Manager(
        store,
        Options(
            key_prefix="quickstart", event_key_jmespath="id", payload_validation_jmespath="amount"
        ),
    )
    return idempotent_function(manager, payload="order", timeout=5)(charge)


def build_effect_before_claim(store: Store) -> Any:
    manager = Manager(store, Options(key_prefix="quickstart", event_key_jmespath="id"))
    charged = idempotent_function(manager, payload="order", timeout=5)(quickstart.charge_card)

    async def handle(order: dict[str, Any]) -> dict[str, Any]:
        CHARGES.append(order)  # broken: the effect happens before the idempotent call
        return await charged(order)

    handle.manager = charged.manager  # type: ignore[attr-defined]
    return handle


def build_key_ignores_amount(store: Store) -> Any:
    # Broken: no payload validation, so a reused id with another amount replays the first.
    manager = Manager(store, Options(key_prefix="quickstart", event_key_jmespath="id"))
    return idempotent_function(manager, payload="order", timeout=5)(charge)


class Declined(Exception):
    pass


async def charge_then_fail(order: dict[str, Any]) -> dict[str, Any]:
    result = await charge(order)
    if order["amount"] > 0:
        raise Declined("receipt could not be rendered")  # broken: raises after charging
    return result


def build_effect_then_raise(store: Store) -> Any:
    manager = Manager(
        store,
        Options(
            key_prefix="quickstart", event_key_jmespath="id", payload_validation_jmespath="amount"
        ),
    )
    return idempotent_function(manager, payload="order", timeout=5)(charge_then_fail)


async def charge_ignoring_cancellation(order: dict[str, Any]) -> dict[str, Any]:
    # Broken: carries on when cancelled.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.05)  # the payment API call
    CHARGES.append(order)
    return {"order": order["id"], "amount": order["amount"]}


def build_ignores_cancellation(store: Store) -> Any:
    manager = Manager(
        store,
        Options(
            key_prefix="quickstart", event_key_jmespath="id", payload_validation_jmespath="amount"
        ),
    )
    return idempotent_function(manager, payload="order", timeout=5)(charge_ignoring_cancellation)


def orders_created() -> int:
    # The example's own effect: each created order takes the next id from its counter.
    return int(repr(fastapi_app._order_ids)[len("count(") : -1]) - 1


def build_orders_app(store: Store, *, marked: bool = True) -> Any:
    from fastapi import FastAPI

    from idempotency_async.integrations.starlette import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(store, Options(key_prefix="orders-api")),
        paths=(),
        required=True,
        caller_scope=fastapi_app.caller,
        request_timeout=30.0,
    )
    if marked:
        app.post("/orders", status_code=201)(fastapi_app.create_order)
    else:
        # Broken: the endpoint without the IdempotencyKey parameter is not idempotent.
        async def create_order(order: fastapi_app.Order) -> dict[str, Any]:
            from fastapi import Response

            return await fastapi_app.create_order(order, "unused", Response())

        app.post("/orders", status_code=201)(create_order)
    return app


def build_unmarked_orders_app(store: Store) -> Any:
    return build_orders_app(store, marked=False)


ORDER_BODIES = st.fixed_dictionaries(
    {"sku": st.sampled_from(["A1", "B2"]), "qty": st.integers(1, 9)}
)
API_KEY = [("X-API-Key", "alice")]


def test_quickstart_charge_passes_the_kit() -> None:
    report = check_handler(function_handler(build_quickstart), payloads=ORDERS, effects=charges)
    assert report.payloads == 5
    assert report.mode == "lease"
    assert report.scenarios >= 100
    assert report.seconds < 30


def _caught(target: Any, effects: Any, payloads: Any = ORDERS) -> HandlerCheckFailed:
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(target, payloads=payloads, effects=effects)
    return caught.value


def _reruns(failure: HandlerCheckFailed) -> None:
    """The printed reproducer is Python that fails again, the same way."""
    code = str(failure).split("shrunk reproducer:\n\n", 1)[1]
    with pytest.raises(HandlerCheckFailed) as again:
        exec(textwrap.dedent(code), {})
    assert again.value.violations[0].split(":")[0] == failure.violations[0].split(":")[0]


def test_kit_catches_an_effect_before_the_claim() -> None:
    failure = _caught(function_handler(build_effect_before_claim), charges)
    assert failure.violations[0].startswith("effect before the claim")
    assert failure.scenario.calls == (Call(),)
    _reruns(failure)


def test_kit_catches_a_key_that_ignores_a_field() -> None:
    failure = _caught(function_handler(build_key_ignores_amount), charges)
    assert failure.violations[0].startswith("key ignores a field")
    assert "['amount']" in failure.violations[0]
    assert len(failure.scenario.calls) == 2
    _reruns(failure)


def test_kit_catches_an_effect_then_an_exception() -> None:
    failure = _caught(function_handler(build_effect_then_raise), charges)
    assert failure.violations[0].startswith("effect repeated")
    assert len(failure.scenario.calls) == 2
    _reruns(failure)


def test_kit_catches_a_handler_that_ignores_cancellation() -> None:
    failure = _caught(function_handler(build_ignores_cancellation), charges)
    assert failure.violations[0].startswith("effect after cancellation")
    assert failure.scenario.calls[0].cancel_at is not None
    _reruns(failure)


def test_fastapi_orders_route_passes_the_kit() -> None:
    route = asgi_route(build_orders_app, "/orders", headers=API_KEY)
    report = check_handler(route, payloads=ORDER_BODIES, effects=orders_created, examples=2)
    assert report.mode == "lease"
    assert report.seconds < 30


def test_kit_catches_an_unmarked_fastapi_route() -> None:
    route = asgi_route(build_unmarked_orders_app, "/orders", headers=API_KEY)
    failure = _caught(route, orders_created, ORDER_BODIES)
    assert failure.violations[0].startswith("effect without a claim")
    _reruns(failure)


class GrantingStore(MemoryStore):
    """Broken on purpose: every claim is granted, whatever the record says."""

    async def claim(self, claim: Any) -> Any:
        await self.force_release(claim.key)
        return await super().claim(claim)


def test_kit_catches_a_store_that_grants_every_claim() -> None:
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(
            function_handler(build_quickstart),
            payloads=[{"id": "a", "amount": 1}],
            effects=charges,
            store=GrantingStore,
        )
    assert caught.value.violations[0].startswith("effect repeated")


def test_a_counter_that_never_moves_fails_the_check() -> None:
    failure = _caught(function_handler(build_quickstart), lambda: 0, [{"id": "a", "amount": 1}])
    assert failure.violations[0].startswith("effect counter never moved")


async def refuse(order: dict[str, Any]) -> dict[str, Any]:
    raise ValueError("no such order")


def build_refusing(store: Store) -> Any:
    manager = Manager(store, Options(key_prefix="quickstart", event_key_jmespath="id"))
    return idempotent_function(manager, payload="order", timeout=5)(refuse)


def test_a_handler_that_never_answers_fails_the_check() -> None:
    failure = _caught(function_handler(build_refusing), charges, [{"id": "a", "amount": 1}])
    assert failure.violations[0].startswith("no call answered")


def build_keyed_on_order_id(store: Store) -> Any:
    manager = Manager(store, Options(key_prefix="quickstart", event_key_jmespath="order_id"))
    return idempotent_function(manager, payload="order", timeout=5)(charge)


def test_a_payload_without_the_key_is_an_effect_without_a_claim() -> None:
    # The payloads carry "id"; the key expression selects "order_id": no key, no claim.
    failure = _caught(function_handler(build_keyed_on_order_id), charges, ORDERS)
    assert failure.violations[0].startswith("effect without a claim")


def test_a_counter_that_raises_is_reported() -> None:
    def broken_counter() -> int:
        raise RuntimeError("the counter's database is down")

    failure = _caught(
        function_handler(build_quickstart), broken_counter, [{"id": "a", "amount": 1}]
    )
    assert failure.violations[0].startswith("run failed: RuntimeError: the counter's database")


def test_replay_passes_a_scenario_the_handler_survives() -> None:
    scenario = Scenario({"id": "a", "amount": 3}, (Call(cancel_at=2), Call("after_lease")))
    replay(function_handler(build_quickstart), scenario, effects=charges)


def test_reproducer_names_the_build_function_and_counter() -> None:
    failure = _caught(function_handler(build_effect_before_claim), charges)
    text = str(failure)
    assert "function_handler(test_testing_kit.build_effect_before_claim)" in text
    assert "effects=test_testing_kit.charges" in text
    assert re.search(
        r"Scenario\(payload=\{'id': '\w+', 'amount': \d+\}, calls=\(Call\(\),\)\)", text
    )


async def test_the_kit_runs_from_an_async_test() -> None:
    report = check_handler(
        function_handler(build_quickstart), payloads=[{"id": "x", "amount": 1}], effects=charges
    )
    assert report.payloads == 1


def test_the_pytest_plugin_is_opt_in_and_gives_the_fixture(tmp_path: Path) -> None:
    test = tmp_path / "test_user.py"
    test.write_text(
        textwrap.dedent(
            """
            from idempotency_async import Manager, MemoryStore, Options, idempotent_function
            from idempotency_async.testing.kit import function_handler

            DONE = []

            async def pay(order):
                DONE.append(order)
                return {"paid": order["id"]}

            def build(store):
                manager = Manager(store, Options(event_key_jmespath="id"))
                return idempotent_function(manager, payload="order", timeout=5)(pay)

            def test_pay(idempotency_kit):
                report = idempotency_kit.check(
                    function_handler(build), payloads=[{"id": "a"}], effects=lambda: len(DONE)
                )
                assert report.mode == "lease"
            """
        )
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    without = subprocess.run(
        command, capture_output=True, text=True, env=checkout_env(), cwd=tmp_path
    )
    assert "fixture 'idempotency_kit' not found" in without.stdout
    enabled = [*command, "-p", "idempotency_async.testing.pytest_plugin"]
    run = subprocess.run(enabled, capture_output=True, text=True, env=checkout_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "idempotency kit:" in run.stdout


def test_the_plugin_is_never_loaded_by_an_entry_point_and_imports_nothing_optional() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "pytest11" not in pyproject["project"].get("entry-points", {})
    assert "testing" in pyproject["project"]["optional-dependencies"]
    probe = (
        "import sys, idempotency_async.testing.pytest_plugin;"
        "loaded = {'hypothesis', 'starlette', 'fastapi', 'httpx', 'uvicorn'} & set(sys.modules);"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, env=checkout_env())


def build_lambda_handler(store: Store) -> Any:
    from idempotency_async.integrations.aws_lambda import idempotent_handler

    manager = Manager(
        store,
        Options(
            key_prefix="orders",
            event_key_jmespath="powertools_json(body).id",
            payload_validation_jmespath="powertools_json(body).amount",
        ),
    )

    @idempotent_handler(manager)
    async def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        order = json.loads(event["body"])
        await asyncio.sleep(0.01)  # the payment API call
        CHARGES.append(order)
        return {"statusCode": 201, "body": json.dumps({"charged": order["amount"]})}

    return handler


LAMBDA_EVENTS = ORDERS.map(lambda order: {"body": json.dumps(order)})


def test_lambda_handler_passes_the_kit() -> None:
    target = lambda_handler(build_lambda_handler, timeout=3.0)
    report = check_handler(target, payloads=LAMBDA_EVENTS, effects=charges, examples=3)
    assert report.mode == "lease"
    assert report.payloads == 3


def build_lambda_handler_charging_first(store: Store) -> Any:
    handler = build_lambda_handler(store)

    async def first_charge_then_handle(event: dict[str, Any], context: Any) -> Any:
        CHARGES.append(event)  # broken: outside the idempotent handler
        return await handler(event, context)

    return first_charge_then_handle


def test_kit_catches_a_lambda_handler_charging_before_the_claim() -> None:
    target = lambda_handler(build_lambda_handler_charging_first, timeout=3.0)
    failure = _caught(target, charges, LAMBDA_EVENTS)
    assert failure.violations[0].startswith("effect before the claim")
    expected = "lambda_handler(test_testing_kit.build_lambda_handler_charging_first, timeout=3.0)"
    assert expected in str(failure)
    _reruns(failure)


GUIDE = ROOT / "docs" / "testing-your-handler.md"


def _guide_block(title: str) -> str:
    match = re.search(
        rf'^```\w* title="{re.escape(title)}"\n(.*?)^```$', GUIDE.read_text(), re.S | re.M
    )
    assert match is not None, f"docs/testing-your-handler.md has no block titled {title!r}"
    return match[1]


def test_the_guides_opening_test_passes() -> None:
    defined: dict[str, Any] = {}
    exec(compile(_guide_block("test_charge.py"), "test_charge.py", "exec"), defined)
    defined["test_charge_is_idempotent"]()
    assert defined["CHARGES"]


@pytest.mark.parametrize(
    ("title", "target", "effects", "payloads"),
    [
        ("effect before the claim", function_handler(build_effect_before_claim), charges, ORDERS),
        ("key ignores a field", function_handler(build_key_ignores_amount), charges, ORDERS),
        ("effect repeated", function_handler(build_effect_then_raise), charges, ORDERS),
        (
            "effect after cancellation",
            function_handler(build_ignores_cancellation),
            charges,
            ORDERS,
        ),
        (
            "effect without a claim",
            asgi_route(build_unmarked_orders_app, "/orders", headers=API_KEY),
            orders_created,
            ORDER_BODIES,
        ),
    ],
)
def test_the_guide_shows_each_reproducer_as_printed(
    title: str, target: Any, effects: Any, payloads: Any
) -> None:
    printed = str(_caught(target, effects, payloads))
    shown = _guide_block(title).rstrip("\n")
    assert printed.split("\n")[1].split(":")[0] == f"  - {title}"
    assert shown.split("shrunk reproducer:")[1] == printed.split("shrunk reproducer:")[1]


def build_quick_charge(store: Store) -> Any:
    # On a real store the kit runs in real time: a short timeout keeps its leases short.
    manager = Manager(
        store,
        Options(
            key_prefix="quickstart", event_key_jmespath="id", payload_validation_jmespath="amount"
        ),
    )
    return idempotent_function(manager, payload="order", timeout=0.3)(charge)


@pytest.mark.redis
def test_the_kit_runs_on_a_real_redis_store(redis_server: Any) -> None:
    from idempotency_async.stores.redis import RedisStore

    def make_store() -> Store:
        return RedisStore.from_url(redis_server.url, key_prefix="kit:")

    report = check_handler(
        function_handler(build_quick_charge),
        payloads=[{"id": "redis-1", "amount": 5}],
        effects=charges,
        store=make_store,
        crash_points=4,
    )
    assert report.mode == "lease"
    assert report.seconds < 30


@pytest.mark.redis
def test_the_kit_catches_a_broken_handler_on_a_real_redis_store(redis_server: Any) -> None:
    from idempotency_async.stores.redis import RedisStore

    def make_store() -> Store:
        return RedisStore.from_url(redis_server.url, key_prefix="kit:")

    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(
            function_handler(build_effect_then_raise),
            payloads=[{"id": "redis-2", "amount": 5}],
            effects=charges,
            store=make_store,
        )
    assert caught.value.violations[0].startswith("effect repeated")
    assert "store=<your store factory>" in str(caught.value)


PG: dict[str, str] = {}
"""The server and tables the transactional tests set up (read by their build functions)."""


def committed_orders() -> int:
    import psycopg

    with psycopg.connect(PG["dsn"], autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {PG['table']}_orders").fetchone()
        assert row is not None
        return int(row[0])


def build_transactional(store: Store, *, outside: bool = False) -> Any:
    import asyncpg

    manager = Manager(store, Options(key_prefix="tx", event_key_jmespath="id"))
    insert = f"INSERT INTO {PG['table']}_orders VALUES ($1, $2)"

    async def handle(order: dict[str, Any]) -> dict[str, Any]:
        conn = await asyncpg.connect(PG["dsn"])
        try:
            async with conn.transaction():

                async def write() -> dict[str, Any]:
                    if outside:
                        # Broken: the write goes through another connection, outside the
                        # call's transaction, so a rollback does not undo it.
                        other = await asyncpg.connect(PG["dsn"])
                        try:
                            await other.execute(insert, order["id"], order["amount"])
                        finally:
                            await other.close()
                    else:
                        await conn.execute(insert, order["id"], order["amount"])
                    await asyncio.sleep(0.01)
                    return {"order": order["id"]}

                result: dict[str, Any] = await manager.execute_in_transaction(
                    conn, order, write, timeout=2
                )
                return result
        finally:
            await conn.close()

    handle.manager = manager  # type: ignore[attr-defined]
    return handle


def build_transactional_writing_outside(store: Store) -> Any:
    return build_transactional(store, outside=True)


def make_postgres_store() -> Store:
    from idempotency_async.stores.postgres import PostgresStore

    return PostgresStore.from_url(PG["dsn"], table=PG["table"])


@pytest.fixture
def transactional_tables(postgres_server: Any) -> None:
    from _postgres import fresh_table_name

    from idempotency_async.stores.postgres import create_table

    PG["dsn"], PG["table"] = postgres_server.dsn, fresh_table_name()
    asyncio.run(create_table(PG["dsn"], table=PG["table"]))
    import psycopg

    with psycopg.connect(PG["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {PG['table']}_orders (id text, amount int)")


@pytest.mark.postgres
@pytest.mark.usefixtures("transactional_tables")
def test_a_transactional_handler_passes_the_kit_in_transactional_mode() -> None:
    report = check_handler(
        function_handler(build_transactional),
        payloads=[{"id": "tx-1", "amount": 5}],
        effects=committed_orders,
        store=make_postgres_store,
        crash_points=8,
    )
    assert report.mode == "transactional"
    assert report.seconds < 30


@pytest.mark.postgres
@pytest.mark.usefixtures("transactional_tables")
def test_kit_catches_a_transactional_write_outside_the_transaction() -> None:
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(
            function_handler(build_transactional_writing_outside),
            payloads=[{"id": "tx-2", "amount": 5}],
            effects=committed_orders,
            store=make_postgres_store,
            crash_points=8,
        )
    assert caught.value.violations[0].startswith("effect committed twice")
    assert any(call.cancel_at for call in caught.value.scenario.calls)


def build_transactional_orders_app(store: Store, *, runs_it: bool = True) -> Any:
    import asyncpg
    from fastapi import FastAPI

    from idempotency_async.integrations.starlette import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(store, Options(key_prefix="orders-tx")),
        paths=(),
        request_timeout=10.0,
    )
    insert = f"INSERT INTO {PG['table']}_orders VALUES ($1, $2)"

    @app.post("/orders", status_code=201)
    async def create_order(order: fastapi_app.Order, tx: IdempotentTransaction) -> Any:
        conn = await asyncpg.connect(PG["dsn"])
        try:
            async with conn.transaction():

                async def work() -> dict[str, Any]:
                    await conn.execute(insert, order.sku, order.qty)
                    return {"sku": order.sku, "qty": order.qty}

                if not runs_it:
                    return await work()  # broken: not through the transactional call
                return await tx.run(conn, work)
        finally:
            await conn.close()

    return app


def build_transactional_orders_app_not_running_it(store: Store) -> Any:
    return build_transactional_orders_app(store, runs_it=False)


@pytest.mark.postgres
@pytest.mark.usefixtures("transactional_tables")
def test_a_transactional_fastapi_route_passes_the_kit() -> None:
    route = asgi_route(build_transactional_orders_app, "/orders")
    report = check_handler(
        route,
        payloads=[{"sku": "A1", "qty": 2}],
        effects=committed_orders,
        store=make_postgres_store,
        crash_points=8,
    )
    assert report.mode == "transactional"


@pytest.mark.postgres
@pytest.mark.usefixtures("transactional_tables")
def test_kit_catches_a_transactional_route_that_does_not_run_its_transaction() -> None:
    route = asgi_route(build_transactional_orders_app_not_running_it, "/orders")
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(
            route,
            payloads=[{"sku": "A1", "qty": 2}],
            effects=committed_orders,
            store=make_postgres_store,
        )
    assert caught.value.violations[0].startswith("transaction not run")
    assert "POST /orders" in caught.value.violations[0]
    assert caught.value.scenario.calls == (Call(),)
    assert str(caught.value) == _guide_block("transaction not run").rstrip("\n")
