"""Quickstart: one idempotent "charge a card" call, on the embedded MemoryStore.

Run it with ``python examples/quickstart.py`` — no services needed.  It shows a first
execution, a replay, a payload validation error, concurrent duplicates, and a timeout
whose key becomes claimable again once the lease (= the deadline) has passed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from idempotency_async import Manager, MemoryStore, Options, Wait, errors

_charge_ids = itertools.count(1)


async def charge_card(order: dict[str, Any]) -> dict[str, Any]:
    """The side effect that must happen once per order: pretend to call a payment API."""
    await asyncio.sleep(0.05)
    charge_id = f"ch_{next(_charge_ids):04d}"
    print(f"    -> payment API called: charged {order['amount']} EUR as {charge_id}")
    return {"order": order["id"], "charge": charge_id, "amount": order["amount"]}


async def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    store = MemoryStore()
    manager = Manager(
        store,
        Options(
            key_prefix="quickstart",
            event_key_jmespath="id",  # the order id identifies the request
            payload_validation_jmespath="amount",  # a reused id must carry the same amount
        ),
    )
    order = {"id": "ord-1", "amount": 42}

    print("1. first execution runs the side effect:")
    print("   ", await manager.execute(order, lambda: charge_card(order), timeout=5))

    print("2. a duplicate replays the stored result (no second charge):")
    print("   ", await manager.execute(order, lambda: charge_card(order), timeout=5))

    print("3. the same id with a different amount is rejected:")
    try:
        await manager.execute({"id": "ord-1", "amount": 99}, lambda: charge_card(order), timeout=5)
    except errors.PayloadValidationError as exc:
        print(f"    PayloadValidationError: {exc}")

    print("4. five concurrent duplicates, waiting for the first one: one charge")
    waiting = Manager(
        store, Options(key_prefix="quickstart", event_key_jmespath="id", wait=Wait(timeout=10.0))
    )
    second = {"id": "ord-2", "amount": 7}
    results = await asyncio.gather(
        *(waiting.execute(second, lambda: charge_card(second), timeout=5) for _ in range(5))
    )
    print(f"    {len(results)} results, all equal: {all(r == results[0] for r in results)}")

    print("5. a call that overruns its 1 s deadline is cut off; its key is held until then:")
    third = {"id": "ord-3", "amount": 5}

    async def stuck_payment() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {}

    try:
        await manager.execute(third, stuck_payment, timeout=1.0)
    except errors.DeadlineExceededError:
        print("    DeadlineExceededError: the callback was cut off before its lease ended")
    try:
        await manager.execute(third, lambda: charge_card(third), timeout=5)
    except errors.AlreadyInProgressError:
        print("    a retry right away gets AlreadyInProgressError (the lease is still running)")
    await asyncio.sleep(1.0)
    print("    after the deadline the key is claimable again; the retry runs:")
    print("   ", await manager.execute(third, lambda: charge_card(third), timeout=5))


if __name__ == "__main__":
    asyncio.run(main())
