"""Recovery points: an order, a charge and a receipt as three steps of one idempotent call.

Run it with ``python examples/steps_checkout.py`` — no services needed (MemoryStore).

Each step's result is recorded on the key's record as it finishes.  When the call fails
after the charge, the retry of the same key replays the order and the charge from the
record — the payment provider is not called again — and runs only the receipt.  When the
failure falls inside the charge step (the provider charged, the step did not return), the
retry runs the step again with the same downstream key, and the provider recognises the
duplicate: one charge either way.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from idempotency_async import Manager, MemoryStore, Options, downstream_key, step


class PaymentProvider:
    """A fake payment API that deduplicates by ``Idempotency-Key``, as real ones do."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        """Requests received, per idempotency key."""
        self.charges: dict[str, dict[str, Any]] = {}
        """Charges made, per idempotency key: a repeated key gets the first charge back."""
        self._ids = itertools.count(1)

    async def charge(self, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        self.requests[idempotency_key] += 1
        if idempotency_key not in self.charges:
            self.charges[idempotency_key] = {"id": f"ch_{next(self._ids)}", "amount": amount}
            print(f"    provider: charged {amount} EUR")
        else:
            print("    provider: a repeated key, answered with the first charge")
        return dict(self.charges[idempotency_key])


class Shop:
    """The application: orders, the provider, receipts — and faults to inject."""

    def __init__(self) -> None:
        self.provider = PaymentProvider()
        self.orders: list[str] = []
        self.receipts: list[str] = []
        self.fail: str | None = None
        """Where the next run fails, once: "after_charge" (the callback raises after the
        charge step returned) or "in_charge" (the step raises after the provider charged)."""

    def _fail_once(self, where: str) -> None:
        if self.fail == where:
            self.fail = None
            raise ConnectionError(f"the process failed ({where.replace('_', ' ')})")

    async def create_order(self, cart: dict[str, Any]) -> dict[str, Any]:
        order_id = f"ord_{len(self.orders) + 1}"
        self.orders.append(order_id)
        print(f"    created order {order_id}")
        return {"id": order_id, "amount": cart["amount"]}

    async def charge(self, order: dict[str, Any]) -> dict[str, Any]:
        # Derived inside the step: the same key on every run of this step of this call.
        key = downstream_key("payment")
        charge = await self.provider.charge(order["amount"], idempotency_key=key)
        self._fail_once("in_charge")
        return charge

    async def send_receipt(self, order: dict[str, Any], charge: dict[str, Any]) -> str:
        self.receipts.append(order["id"])
        print(f"    receipt sent for {order['id']} ({charge['id']})")
        return order["id"]

    async def checkout(self, cart: dict[str, Any]) -> dict[str, Any]:
        """The idempotent call's callback: three steps, in the same order on every run."""
        order = await step("create_order", lambda: self.create_order(cart))
        charge = await step("charge", lambda: self.charge(order))
        self._fail_once("after_charge")
        await step("send_receipt", lambda: self.send_receipt(order, charge))
        return {"order": order["id"], "charge": charge["id"]}


async def place(manager: Manager, shop: Shop, cart: dict[str, Any]) -> dict[str, Any] | None:
    """One attempt of the client: the result, or None when it failed."""
    try:
        return await manager.execute(cart, lambda: shop.checkout(cart), timeout=10)
    except ConnectionError as exc:
        print(f"    attempt failed: {exc}")
        return None


async def main() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="checkout", event_key_jmespath="cart_id"))
    shop = Shop()

    print("1. the call fails after the charge; the retry resumes at the receipt:")
    cart = {"cart_id": "cart-1", "amount": 42}
    shop.fail = "after_charge"
    await place(manager, shop, cart)
    print("   ", await place(manager, shop, cart))

    print("2. the step fails after the provider charged; the retry repeats the same key:")
    cart = {"cart_id": "cart-2", "amount": 7}
    shop.fail = "in_charge"
    await place(manager, shop, cart)
    print("   ", await place(manager, shop, cart))

    print("3. a duplicate of a completed checkout replays it; nothing runs:")
    print("   ", await place(manager, shop, cart))

    requests = sum(shop.provider.requests.values())
    print(
        f"orders: {len(shop.orders)}, charges: {len(shop.provider.charges)} "
        f"(provider requests: {requests}), receipts: {len(shop.receipts)}"
    )


if __name__ == "__main__":
    asyncio.run(main())
