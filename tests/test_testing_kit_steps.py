"""The users' test kit (``idempotency_async.testing.kit``) on a handler that takes steps
(recovery points): the checkout example (``examples/steps_checkout.py``, on the kit's
MemoryStore), written only with the kit, passes it — with its crashes before and after
each step's recovery point — and each deliberately broken variant is caught, shrunk and
printed as ``docs/testing-your-handler.md`` shows it: an effect made outside a step (it
runs again on every resume), step names taken from a counter (a retry's steps differ from
the record's), a step that raises after its effect, a step sending its provider a new
key on every run (``downstream=True``), and a store that forgets a record's steps when a
claim takes it over.  A FastAPI route and an SQS batch handler taking steps pass too; the
latter's changing step names are caught from process_batch's log."""

from __future__ import annotations

import itertools
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from idempotency_async import Manager, MemoryStore, Options, downstream_key, step
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.record import Claim
from idempotency_async.stores.base import Found, Store, Verdict
from idempotency_async.testing.kit import (
    Call,
    Fault,
    HandlerCheckFailed,
    Scenario,
    asgi_route,
    check_handler,
    function_handler,
    replay,
    sqs_batch_handler,
)

ROOT = Path(__file__).parents[1]
GUIDE = ROOT / "docs" / "testing-your-handler.md"
sys.path.insert(0, str(ROOT / "examples"))
import steps_checkout  # noqa: E402

CARTS = [{"cart_id": "cart-1", "amount": 42}, {"cart_id": "cart-2", "amount": 7}]


def _checkout(store: Store, shop: steps_checkout.Shop) -> Any:
    # The example's manager and callback, on the kit's store.
    manager = Manager(store, Options(key_prefix="checkout", event_key_jmespath="cart_id"))

    async def place(cart: dict[str, Any]) -> dict[str, Any]:
        return await manager.execute(cart, lambda: shop.checkout(cart), timeout=10)

    place.manager = manager  # type: ignore[attr-defined]
    return place


def _effects(shop: steps_checkout.Shop) -> int:
    """Every effect the shop makes: orders, requests the provider received, receipts."""
    return len(shop.orders) + sum(shop.provider.requests.values()) + len(shop.receipts)


# -- the example, as it is --------------------------------------------------------------------

SHOP = steps_checkout.Shop()


def build_checkout(store: Store) -> Any:
    return _checkout(store, SHOP)


def shop_effects() -> int:
    return _effects(SHOP)


PROVIDER_SHOP = steps_checkout.Shop()
"""The shop of the downstream check: its provider has seen none of the carts."""


def build_checkout_for_the_provider(store: Store) -> Any:
    return _checkout(store, PROVIDER_SHOP)


def provider_charges() -> int:
    return len(PROVIDER_SHOP.provider.charges)


def test_the_checkout_example_passes_the_kit(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_handler(function_handler(build_checkout), payloads=CARTS, effects=shop_effects)
    assert report.mode == "lease + recovery points"
    assert report.payloads == 2
    assert report.seconds < 10
    capsys.readouterr()


def test_the_checkout_example_passes_with_downstream_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Counting what the provider applied: one charge per key, whatever crashed.
    report = check_handler(
        function_handler(build_checkout_for_the_provider),
        payloads=CARTS[:1],
        effects=provider_charges,
        downstream=True,
    )
    assert report.mode == "downstream keys + recovery points"
    capsys.readouterr()


def test_the_kit_crashes_before_and_after_each_recovery_point() -> None:
    # Before step 2's recovery point: the charge ran and the retry after the lease runs it
    # again (once); after it: the retry replays the charge, and only the receipt runs.
    shop = steps_checkout.Shop()
    before = _effects(shop)
    cart = {"cart_id": "cart-9", "amount": 3}

    def build(store: Store) -> Any:
        return _checkout(store, shop)

    crashed = (Call(crash_before_step=2), Call(start="after_lease"), Call())
    replay(function_handler(build), Scenario(cart, crashed), effects=lambda: _effects(shop))
    assert sum(shop.provider.requests.values()) == 2  # the charge step ran twice
    assert len(shop.provider.charges) == 1  # with one downstream key: charged once
    assert (len(shop.orders), len(shop.receipts)) == (1, 1)
    shop = steps_checkout.Shop()
    crashed = (Call(crash_after_step=2), Call(start="after_lease"), Call())
    replay(function_handler(build), Scenario(cart, crashed), effects=lambda: _effects(shop))
    assert _effects(shop) - before == 3  # each step once


# -- broken: the charge outside a step ---------------------------------------------------------


class ShopChargingOutsideAStep(steps_checkout.Shop):
    async def checkout(self, cart: dict[str, Any]) -> dict[str, Any]:
        order = await step("create_order", lambda: self.create_order(cart))
        charge = await self.charge(order)  # broken: not a step, so it runs on every resume
        await step("send_receipt", lambda: self.send_receipt(order, charge))
        return {"order": order["id"], "charge": charge["id"]}


OUTSIDE = ShopChargingOutsideAStep()


def build_checkout_charging_outside_a_step(store: Store) -> Any:
    return _checkout(store, OUTSIDE)


def outside_effects() -> int:
    return _effects(OUTSIDE)


# -- broken: step names from a counter ---------------------------------------------------------

ATTEMPTS = itertools.count(1)


class ShopNamingStepsByAttempt(steps_checkout.Shop):
    async def checkout(self, cart: dict[str, Any]) -> dict[str, Any]:
        attempt = next(ATTEMPTS)  # broken: another name on every run
        order = await step(f"create_order-{attempt}", lambda: self.create_order(cart))
        charge = await step(f"charge-{attempt}", lambda: self.charge(order))
        await step(f"send_receipt-{attempt}", lambda: self.send_receipt(order, charge))
        return {"order": order["id"], "charge": charge["id"]}


BY_ATTEMPT = ShopNamingStepsByAttempt()


def build_checkout_naming_steps_by_attempt(store: Store) -> Any:
    return _checkout(store, BY_ATTEMPT)


def by_attempt_effects() -> int:
    return _effects(BY_ATTEMPT)


# -- broken: a step that raises after its effect -----------------------------------------------


class ShopFailingAfterTheReceipt(steps_checkout.Shop):
    def __init__(self) -> None:
        super().__init__()
        self.failed: set[str] = set()

    async def send_receipt(self, order: dict[str, Any], charge: dict[str, Any]) -> str:
        self.receipts.append(order["id"])
        if order["id"] not in self.failed:  # broken: raises after the receipt went out
            self.failed.add(order["id"])
            raise ConnectionError("the receipt went out, then the mail server timed out")
        return order["id"]


AFTER_RECEIPT = ShopFailingAfterTheReceipt()


def build_checkout_failing_after_the_receipt(store: Store) -> Any:
    return _checkout(store, AFTER_RECEIPT)


def after_receipt_effects() -> int:
    return _effects(AFTER_RECEIPT)


# -- broken: a new key for the provider on every run -------------------------------------------


class ShopWithRandomPaymentKey(steps_checkout.Shop):
    async def charge(self, order: dict[str, Any]) -> dict[str, Any]:
        key = str(uuid.uuid4())  # broken: not downstream_key("payment")
        return await self.provider.charge(order["amount"], idempotency_key=key)


RANDOM_KEY = ShopWithRandomPaymentKey()


def build_checkout_with_a_random_payment_key(store: Store) -> Any:
    return _checkout(store, RANDOM_KEY)


def random_key_charges() -> int:
    return len(RANDOM_KEY.provider.charges)


# -- the kit catches each ----------------------------------------------------------------------


def _caught(target: Any, effects: Any, **options: Any) -> HandlerCheckFailed:
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(target, payloads=CARTS[:1], effects=effects, **options)
    return caught.value


def _reruns(failure: HandlerCheckFailed) -> None:
    """The printed reproducer is Python that fails again, the same way."""
    code = str(failure).split("shrunk reproducer:\n\n", 1)[1]
    with pytest.raises(HandlerCheckFailed) as again:
        exec(textwrap.dedent(code), {})
    assert again.value.violations[0].split(":")[0] == failure.violations[0].split(":")[0]


def _as_in_the_guide(failure: HandlerCheckFailed, title: str) -> None:
    match = re.search(
        rf'^```\w* title="{re.escape(title)}"\n(.*?)^```$', GUIDE.read_text(), re.S | re.M
    )
    assert match is not None, f"docs/testing-your-handler.md has no block titled {title!r}"
    shown = match[1].rstrip("\n")
    assert shown.split("shrunk reproducer:")[1] == str(failure).split("shrunk reproducer:")[1]


def test_kit_catches_an_effect_outside_a_step(capsys: pytest.CaptureFixture[str]) -> None:
    failure = _caught(function_handler(build_checkout_charging_outside_a_step), outside_effects)
    assert failure.violations[0].startswith("effect outside a step: call 1 resumed the key")
    assert "'create_order', 'send_receipt'" in failure.violations[0]
    assert failure.scenario.calls[0].crash_after_step == 2 or any(
        fault.op == "record_step" for fault in failure.scenario.calls[0].faults
    )
    _reruns(failure)
    _as_in_the_guide(failure, "steps: effect outside a step")
    capsys.readouterr()


def test_kit_catches_step_names_that_change_between_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failure = _caught(function_handler(build_checkout_naming_steps_by_attempt), by_attempt_effects)
    assert failure.violations[0].startswith("step order differs: call 1 asked for step")
    assert "(StepMismatchError)" in failure.violations[0]
    assert "the recovery-point guarantee" in str(failure)
    _reruns(failure)
    _as_in_the_guide(failure, "steps: step order differs")
    capsys.readouterr()


def test_kit_catches_a_step_that_raises_after_its_effect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failure = _caught(
        function_handler(build_checkout_failing_after_the_receipt), after_receipt_effects
    )
    assert failure.violations[0].startswith("step repeated: call 0 made the effect of step 3")
    assert "raised ConnectionError" in failure.violations[0]
    _reruns(failure)
    capsys.readouterr()


def test_kit_catches_a_step_sending_a_new_provider_key_on_each_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failure = _caught(
        function_handler(build_checkout_with_a_random_payment_key),
        random_key_charges,
        downstream=True,
    )
    assert failure.violations[0].startswith(
        "effect repeated downstream: the provider applied the effect of step 2 ('charge')"
    )
    assert failure.scenario.calls[0].crash_before_step == 2 or failure.scenario.calls[0].faults
    _reruns(failure)
    capsys.readouterr()


def test_a_recovery_point_fault_in_a_scenario_is_a_reproducer_value() -> None:
    scenario = Scenario(
        {"cart_id": "c"},
        (Call(crash_before_step=1), Call(faults=(Fault("record_step", 0, "lose"),))),
    )
    assert eval(repr(scenario)) == scenario


# -- a store that forgets a record's steps when a claim takes it over ---------------------------


class StoreForgettingSteps(MemoryStore):
    """Broken: a claim taking over a record with steps answers without them."""

    async def claim(self, claim: Claim) -> Verdict:
        verdict = await super().claim(claim)
        if verdict.found is Found.CLAIMED and verdict.record is not None:
            return verdict._replace(record=verdict.record._replace(steps=None))
        return verdict


FORGOTTEN = steps_checkout.Shop()


def build_checkout_with_a_short_lease(store: Store) -> Any:
    # On a store of the user's the kit runs in real time: a short lease.
    manager = Manager(store, Options(key_prefix="checkout", event_key_jmespath="cart_id"))

    async def place(cart: dict[str, Any]) -> dict[str, Any]:
        return await manager.execute(cart, lambda: FORGOTTEN.checkout(cart), timeout=0.2)

    return place


def forgotten_effects() -> int:
    return _effects(FORGOTTEN)


def test_kit_catches_a_store_that_forgets_recorded_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(HandlerCheckFailed) as caught:
        replay(
            function_handler(build_checkout_with_a_short_lease),
            Scenario(CARTS[0], (Call(crash_after_step=1), Call(start="after_lease"))),
            effects=forgotten_effects,
            store=StoreForgettingSteps,
        )
    assert caught.value.violations[0].startswith(
        "recorded step ran again: call 1 ran step 'create_order' (step 1), which call 0 had "
        "recorded"
    )
    capsys.readouterr()


# -- a FastAPI route taking steps (the shape of docs/steps.md's app.py) -------------------------

ROUTE_CHARGES: dict[str, int] = {}


def build_orders_app_with_steps(store: Store) -> Any:
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware, manager=Manager(store), paths=(), caller_scope=lambda r: "alice"
    )

    async def charge(amount: int, key: str) -> dict[str, Any]:
        ROUTE_CHARGES[key] = ROUTE_CHARGES.get(key, 0) + 1
        return {"id": f"ch_{len(ROUTE_CHARGES)}", "amount": amount}

    @app.post("/orders", status_code=201)
    async def create_order(request: Request, key: IdempotencyKey) -> dict[str, Any]:
        order = await request.json()
        made = await step("charge", lambda: charge(order["amount"], downstream_key("c")))
        await step("receipt", lambda: charge(0, downstream_key("r")))
        return {"charge": made["id"]}

    return app


def route_effects() -> int:
    return sum(ROUTE_CHARGES.values())


def test_a_fastapi_route_taking_steps_passes_the_kit() -> None:
    report = check_handler(
        asgi_route(build_orders_app_with_steps, "/orders"),
        payloads=[{"amount": 5}],
        effects=route_effects,
    )
    assert report.mode == "lease + recovery points"


class StoreGrantingLiveLeases(MemoryStore):
    """Broken: a claim refused by a live lease is judged again as if that lease had ended."""

    async def claim(self, claim: Claim) -> Verdict:
        verdict = await super().claim(claim)
        record = verdict.record
        if verdict.found is Found.IN_PROGRESS and record is not None and record.lease_end:
            return await super().claim(claim._replace(now=record.lease_end + 0.001))
        return verdict


def test_kit_catches_a_step_run_again_inside_the_lease(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(HandlerCheckFailed) as caught:
        replay(
            function_handler(build_checkout_with_a_short_lease),
            Scenario(CARTS[0], (Call(crash_before_step=2), Call())),
            effects=forgotten_effects,
            store=StoreGrantingLiveLeases,
        )
    assert caught.value.violations[0].startswith(
        "step ran again inside the lease: call 0 made the effect of step 2 ('charge')"
    )
    capsys.readouterr()


# -- an SQS batch handler taking steps (process_batch answers for the record's errors) ---------

PACKED: list[str] = []
BATCH_ATTEMPTS = itertools.count(1)


def _build_batch(store: Store, *, names_by_attempt: bool) -> Any:
    manager = Manager(store, Options(key_prefix="ship", event_key_jmespath="body.order_id"))

    async def pack(what: str) -> str:
        PACKED.append(what)
        return what

    async def ship(record: dict[str, Any]) -> dict[str, Any]:
        # Broken with names_by_attempt: another step name on every run.
        suffix = f"-{next(BATCH_ATTEMPTS)}" if names_by_attempt else ""
        await step(f"pack{suffix}", lambda: pack("box"))
        await step("label", lambda: pack("label"))
        return {"shipped": True}

    async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return await process_batch(manager, event, ship, context=context)

    return handle


def build_batch_with_steps(store: Store) -> Any:
    return _build_batch(store, names_by_attempt=False)


def build_batch_naming_steps_by_attempt(store: Store) -> Any:
    return _build_batch(store, names_by_attempt=True)


def packed() -> int:
    return len(PACKED)


def test_an_sqs_batch_handler_taking_steps_passes_the_kit() -> None:
    report = check_handler(
        sqs_batch_handler(build_batch_with_steps, timeout=5.0),
        payloads=[{"order_id": "o-1"}],
        effects=packed,
    )
    assert report.mode == "lease + recovery points"


def test_kit_catches_step_names_that_change_in_an_sqs_batch_handler() -> None:
    # process_batch reports the record in batchItemFailures: the mismatch is read from its log.
    with pytest.raises(HandlerCheckFailed) as caught:
        check_handler(
            sqs_batch_handler(build_batch_naming_steps_by_attempt, timeout=5.0),
            payloads=[{"order_id": "o-1"}],
            effects=packed,
        )
    assert caught.value.violations[0].startswith("step order differs: a retry asked for step")
    _reruns(caught.value)
