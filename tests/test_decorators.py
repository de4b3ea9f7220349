"""idempotent_function: per-function keys, argument selection, models as payloads."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from idempotency_async import Manager, MemoryStore, Options, errors, idempotent_function


@dataclasses.dataclass
class Order:
    id: int
    amount: float


class OrderModel(pydantic.BaseModel):
    id: int
    amount: float


async def test_decorated_function_runs_once_per_payload() -> None:
    manager = Manager(MemoryStore(), Options())
    runs: list[int] = []

    @idempotent_function(manager, payload="order", timeout=5)
    async def charge(order: dict[str, int], note: str = "") -> dict[str, int]:
        runs.append(order["id"])
        return {"charged": order["id"]}

    assert await charge({"id": 1}, note="a") == {"charged": 1}
    assert await charge(order={"id": 1}, note="b") == {"charged": 1}
    assert await charge({"id": 2}) == {"charged": 2}
    assert runs == [1, 2]


async def test_two_functions_sharing_a_manager_never_replay_each_other() -> None:
    manager = Manager(MemoryStore(), Options())

    @idempotent_function(manager, payload="order")
    async def charge(order: dict[str, int]) -> str:
        return "charged"

    @idempotent_function(manager, payload="order")
    async def email(order: dict[str, int]) -> str:
        return "emailed"

    assert await charge({"id": 1}) == "charged"
    assert await email({"id": 1}) == "emailed"


async def test_explicit_prefix_is_used_as_is() -> None:
    store = MemoryStore()
    manager = Manager(store, Options(key_prefix="shared"))

    @idempotent_function(manager, payload="order")
    async def first(order: dict[str, int]) -> str:
        return "first"

    @idempotent_function(manager, payload="order")
    async def second(order: dict[str, int]) -> str:
        return "second"

    assert await first({"id": 1}) == "first"
    assert await second({"id": 1}) == "first"  # same prefix, same key: a deliberate share


@pytest.mark.parametrize("payload", [Order(1, 9.5), OrderModel(id=1, amount=9.5)])
async def test_dataclass_and_pydantic_payloads_hash_by_their_fields(payload: object) -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="p"))
    assert manager.key_for(payload) == manager.key_for({"id": 1, "amount": 9.5})


def test_unknown_parameter_is_a_config_error() -> None:
    manager = Manager(MemoryStore(), Options())
    with pytest.raises(errors.ConfigError, match="no parameter 'order'"):

        @idempotent_function(manager, payload="order")
        async def charge(request: dict[str, int]) -> None:
            return None


def test_sync_function_is_a_config_error() -> None:
    manager = Manager(MemoryStore(), Options())
    with pytest.raises(errors.ConfigError, match="async def"):
        idempotent_function(manager, payload="order")(lambda order: order)  # type: ignore[arg-type]


async def test_dataclass_and_pydantic_results_replay_as_their_type() -> None:
    from idempotency_async.codecs import DataclassCodec, PydanticCodec

    for codec, result in (
        (DataclassCodec(Order), Order(3, 1.5)),
        (PydanticCodec(OrderModel), OrderModel(id=3, amount=1.5)),
    ):
        manager = Manager(MemoryStore(), Options(key_prefix="c", response_codec=codec))

        async def make_result(value: object = result) -> object:
            return value

        assert await manager.execute({"id": 1}, make_result) is result
        replayed = await manager.execute({"id": 1}, make_result)
        assert replayed == result and replayed is not result
        assert type(replayed) is type(result)
