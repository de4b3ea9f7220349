"""examples/steps_checkout.py: an order, a charge and a receipt as steps; a failed run
resumes without a second charge, and the receipt goes out once."""

from __future__ import annotations

import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import checkout_env

from idempotency_async import Manager, MemoryStore, Options, Status

EXAMPLE = Path(__file__).parents[1] / "examples" / "steps_checkout.py"


def _example() -> dict[str, Any]:
    return runpy.run_path(str(EXAMPLE), run_name="steps_checkout")


def test_the_example_prints_one_charge_and_one_receipt_per_cart() -> None:
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=checkout_env(),
    )
    out = completed.stdout
    assert out.count("provider: charged") == 2
    assert out.count("a repeated key, answered with the first charge") == 1
    assert out.count("receipt sent") == 2
    assert out.count("attempt failed") == 2
    assert out.endswith("orders: 2, charges: 2 (provider requests: 3), receipts: 2\n")
    assert completed.stderr == ""


async def test_a_crash_after_the_charge_resumes_without_charging_again() -> None:
    example = _example()
    store = MemoryStore()
    manager = Manager(store, Options(key_prefix="checkout", event_key_jmespath="cart_id"))
    shop = example["Shop"]()
    cart = {"cart_id": "cart-9", "amount": 30}
    key = manager.key_for(cart)

    shop.fail = "after_charge"
    assert await example["place"](manager, shop, cart) is None
    # The record holds the order and the charge, released for a retry (no owner).
    record = (await store.get(key, now=time.time())).record
    assert record is not None and record.status is Status.INPROGRESS and record.owner is None
    assert record.steps is not None and '"create_order"' in record.steps
    assert '"charge"' in record.steps and '"send_receipt"' not in record.steps
    assert sum(shop.provider.requests.values()) == 1

    result = await example["place"](manager, shop, cart)
    again = await example["place"](manager, shop, cart)

    assert result == again == {"order": "ord_1", "charge": "ch_1"}
    assert shop.orders == ["ord_1"]
    assert sum(shop.provider.requests.values()) == 1  # the charge was replayed, not re-sent
    assert len(shop.provider.charges) == 1
    assert shop.receipts == ["ord_1"]
    completed = (await store.get(key, now=time.time())).record
    assert completed is not None and completed.status is Status.COMPLETED
    assert completed.steps is None  # the completion dropped the steps


async def test_a_crash_inside_the_charge_repeats_the_same_downstream_key() -> None:
    example = _example()
    manager = Manager(MemoryStore(), Options(key_prefix="checkout", event_key_jmespath="cart_id"))
    shop = example["Shop"]()
    cart = {"cart_id": "cart-10", "amount": 12}

    shop.fail = "in_charge"
    assert await example["place"](manager, shop, cart) is None
    result = await example["place"](manager, shop, cart)

    assert result == {"order": "ord_1", "charge": "ch_1"}
    assert shop.orders == ["ord_1"]  # the order step was replayed
    # The step ran twice, with one key: the provider charged once.
    (requests,) = shop.provider.requests.values()
    assert requests == 2 and len(shop.provider.charges) == 1
    assert shop.receipts == ["ord_1"]
