"""Declared errors (``replay_errors``): a deterministic failure is a result — the record
completes with it and every duplicate gets it raised again, across processes (two managers
on one real store), from the local cache and to in-process waiters."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import pytest

from idempotency_async import (
    LocalCache,
    Manager,
    MemoryStore,
    Options,
    Redaction,
    ReplayErrors,
    Wait,
    idempotent_function,
)
from idempotency_async.errors import (
    ConfigError,
    ReplayedError,
    ResponseNotStoredError,
)
from idempotency_async.events import Event
from idempotency_async.stores.base import Store


class CardDeclined(Exception):
    """A deterministic failure that carries data."""

    def __init__(self, message: str, code: str = "declined") -> None:
        super().__init__(message)
        self.code = code

    def __idempotency_data__(self) -> dict[str, str]:
        return {"code": self.code}

    @classmethod
    def __idempotency_replay__(cls, args: tuple[Any, ...], data: Any) -> CardDeclined:
        code = data.get("code", "declined") if isinstance(data, dict) else "declined"
        return cls(str(args[0]) if args else "", code)


class InsufficientFunds(CardDeclined):
    pass


class Invalid(Exception):
    pass


class Flaky(Exception):
    pass


def _declared(**extra: Any) -> ReplayErrors:
    # The store fixture includes DynamoDB and Redis, whose default record layout the
    # TypeScript port reads: these tests' records are read by this library only.
    return ReplayErrors((CardDeclined, Invalid), private_records=True, **extra)


def _manager(store: Store, **options: Any) -> Manager:
    options.setdefault("replay_errors", _declared())
    return Manager(store, Options(key_prefix="pay", event_key_jmespath="id", **options))


class Effect:
    """A callback that counts its runs and raises ``error`` (or returns ``result``)."""

    def __init__(self, error: BaseException | None = None, result: Any = "charged") -> None:
        self.runs = 0
        self.error = error
        self.result = result

    async def __call__(self) -> Any:
        self.runs += 1
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        return self.result


def _payload() -> dict[str, str]:
    return {"id": uuid.uuid4().hex}


async def test_declared_error_is_replayed_to_another_process(store: Store) -> None:
    first, second = _manager(store), _manager(store)
    payload, effect = _payload(), Effect(InsufficientFunds("no money", "funds"))
    with pytest.raises(InsufficientFunds) as raised:
        await first.execute(payload, effect)
    assert raised.value is effect.error  # the caller gets its own exception
    with pytest.raises(InsufficientFunds) as replayed:
        await second.execute(payload, effect)
    # Rebuilt as its own (loaded, declared-base) type with its data, marked as a replay.
    assert replayed.value is not effect.error
    assert str(replayed.value) == "no money" and replayed.value.code == "funds"
    assert any("replayed" in note for note in replayed.value.__notes__)
    assert effect.runs == 1
    record = await store.get(first.key_for(payload) or "", now=first.options.clock())
    assert record.record is not None and record.record.status == "COMPLETED"


async def test_undeclared_error_still_releases_the_key(store: Store) -> None:
    manager = _manager(store)
    payload, effect = _payload(), Effect(Flaky("try again"))
    for _ in range(2):
        with pytest.raises(Flaky):
            await manager.execute(payload, effect)
    assert effect.runs == 2


async def test_a_reader_that_does_not_declare_the_type_gets_replayed_error(store: Store) -> None:
    first = _manager(store)
    other = _manager(store, replay_errors=ReplayErrors((Invalid,), private_records=True))
    plain = Manager(store, Options(key_prefix="pay", event_key_jmespath="id"))
    payload, effect = _payload(), Effect(CardDeclined("declined", "do_not_honor"))
    with pytest.raises(CardDeclined):
        await first.execute(payload, effect)
    for reader in (other, plain):
        with pytest.raises(ReplayedError) as replayed:
            await reader.execute(payload, effect)
        error = replayed.value
        assert error.error_type == f"{__name__}:CardDeclined"
        assert error.error_message == "declined"
        assert error.data == {"code": "do_not_honor"}
        assert error.key == first.key_for(payload)
    assert effect.runs == 1


async def test_declared_error_replays_from_the_local_cache() -> None:
    events: list[Event] = []
    manager = _manager(MemoryStore(), local_cache=LocalCache(), on_event=events.append)
    payload, effect = _payload(), Effect(Invalid("amount must be positive"))
    for _ in range(3):
        with pytest.raises(Invalid, match="amount must be positive"):
            await manager.execute(payload, effect)
    assert effect.runs == 1
    assert [event.kind for event in events].count("cache_hit") >= 1


@pytest.mark.parametrize(
    "redaction",
    [Redaction(never_store=True), Redaction(fields=("code",))],
    ids=["never_store", "fields"],
)
async def test_redaction_is_of_results_a_declared_error_is_stored_whole(
    redaction: Redaction,
) -> None:
    # A route that never stores its result may still fail deterministically: the error
    # form (type, message, declared data) is stored and replayed, not dropped.
    manager = _manager(MemoryStore(), redaction=redaction)
    payload, effect = _payload(), Effect(CardDeclined("card ending 4242 declined", "do_not_honor"))
    for _ in range(2):
        with pytest.raises(CardDeclined, match="4242 declined") as raised:
            await manager.execute(payload, effect)
        assert raised.value.code == "do_not_honor"
    assert effect.runs == 1


async def test_in_process_waiters_get_the_declared_error(store: Store) -> None:
    manager = _manager(store, wait=Wait())
    payload, gate = _payload(), asyncio.Event()
    runs = 0

    async def slow_decline() -> None:
        nonlocal runs
        runs += 1
        await gate.wait()
        raise CardDeclined("declined")

    calls = [asyncio.ensure_future(manager.execute(payload, slow_decline)) for _ in range(5)]
    await asyncio.sleep(0.05)
    gate.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert runs == 1
    assert all(isinstance(outcome, CardDeclined) for outcome in outcomes), outcomes
    assert {str(outcome) for outcome in outcomes} == {"declined"}


async def test_the_data_hook_and_the_size_bound() -> None:
    store = MemoryStore()
    settings = ReplayErrors((Invalid,), data=lambda exc: {"field": "amount"}, max_bytes=256)
    first, second = _manager(store, replay_errors=settings), _manager(store)
    payload = _payload()
    with pytest.raises(Invalid):
        await first.execute(payload, Effect(Invalid("x" * 10_000)))
    record = (await store.get(first.key_for(payload) or "", now=first.options.clock())).record
    assert record is not None
    from idempotency_async._json import encode_json

    assert len(encode_json(record.response)) <= 256
    with pytest.raises(Invalid) as replayed:
        await second.execute(payload, Effect())
    assert str(replayed.value).startswith("x") and len(str(replayed.value)) < 256


async def test_a_stored_error_never_imports_its_type() -> None:
    store = MemoryStore()
    manager = _manager(store)
    payload = _payload()
    forged = {"__idempotency_error__": {"v": 1, "type": "not_loaded_evil_mod:Boom"}}
    # An operator or attacker with write access to the store writes the envelope.
    from idempotency_async.record import Claim, Completion

    key = manager.key_for(payload) or ""
    now = manager.options.clock()
    await store.claim(Claim(key, "owner", now, 60, 3600))
    from idempotency_async._json import encode_json

    await store.complete(Completion(key, "owner", now, 3600, None, encode_json(forged), forged))
    with pytest.raises(ReplayedError) as replayed:
        await manager.execute(payload, Effect())
    assert replayed.value.error_type == "not_loaded_evil_mod:Boom"
    assert "not_loaded_evil_mod" not in sys.modules


async def test_a_result_in_the_error_form_is_not_stored() -> None:
    manager = _manager(MemoryStore())
    payload = _payload()
    looks_like = {"__idempotency_error__": {"type": f"{__name__}:Invalid"}}
    assert await manager.execute(payload, Effect(result=looks_like)) == looks_like
    with pytest.raises(ResponseNotStoredError):
        await manager.execute(payload, Effect())


async def test_idempotent_function_declares_its_own_errors() -> None:
    manager = Manager(MemoryStore())
    runs = 0

    @idempotent_function(manager, payload="order", replay_errors=(CardDeclined,))
    async def charge(order: str) -> str:
        nonlocal runs
        runs += 1
        raise CardDeclined(f"declined {order}")

    for _ in range(2):
        with pytest.raises(CardDeclined, match="declined o-1"):
            await charge("o-1")
    assert runs == 1


def test_library_errors_and_non_exceptions_cannot_be_declared() -> None:
    with pytest.raises(ConfigError):
        ReplayErrors((ResponseNotStoredError,))
    with pytest.raises(ConfigError):
        ReplayErrors((KeyboardInterrupt,))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ReplayErrors(())
    with pytest.raises(ConfigError, match="Exception itself"):
        ReplayErrors((Exception,))
    with pytest.raises(ConfigError):
        idempotent_function(Manager(MemoryStore()), payload="x", replay_errors=(int,))  # type: ignore[arg-type]


def test_powertools_key_format_refuses_declared_errors() -> None:
    with pytest.raises(ConfigError, match="powertools-python"):
        Options(key_format="powertools-python", replay_errors=(CardDeclined,))


@pytest.mark.parametrize("store", ["redis", "dynamodb"], indirect=True)
async def test_ts_layout_stores_refuse_declared_errors_unless_private(store: Store) -> None:
    with pytest.raises(ConfigError, match="private_records=True"):
        Manager(store, Options(replay_errors=(CardDeclined,)))
    Manager(store, Options(replay_errors=ReplayErrors((CardDeclined,), private_records=True)))


async def test_manager_replay_raises_the_stored_error(store: Store) -> None:
    manager = _manager(store)
    payload = _payload()
    assert await manager.replay(payload, default="none") == "none"
    with pytest.raises(Invalid):
        await manager.execute(payload, Effect(Invalid("bad amount")))
    with pytest.raises(Invalid, match="bad amount"):
        await manager.replay(payload, default="none")


async def test_a_cut_off_declared_error_releases_the_key() -> None:
    # A declared error raised because the cutoff cancelled the work is not deterministic.
    manager = _manager(MemoryStore())
    payload, runs = _payload(), 0

    async def converts_its_cutoff() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise Invalid("gave up") from None

    for _ in range(2):
        # Its own exception, as any callback that raised after its cutoff; released.
        with pytest.raises(Invalid, match="gave up"):
            await manager.execute(payload, converts_its_cutoff, timeout=0.2)
    assert runs == 2


@pytest.mark.postgres
async def test_in_a_transaction_a_declared_error_rolls_back(postgres_server: Any) -> None:
    from _postgres import fresh_postgres_store

    async with fresh_postgres_store(postgres_server) as store:
        manager = _manager(store)
        payload, effect = _payload(), Effect(CardDeclined("declined"))
        pool = await postgres_server.pool()
        try:
            for _ in range(2):
                async with pool.acquire() as conn:
                    with pytest.raises(CardDeclined):
                        async with conn.transaction():
                            await manager.execute_in_transaction(conn, payload, effect)
        finally:
            await pool.close()
        # Rolled back like any other exception: the retry ran it again.
        assert effect.runs == 2
        assert (await store.get(manager.key_for(payload) or "", now=0)).record is None


def test_the_http_middleware_refuses_declared_errors() -> None:
    from starlette.applications import Starlette

    from idempotency_async.integrations.starlette import IdempotencyMiddleware

    manager = _manager(MemoryStore())
    with pytest.raises(ConfigError, match="return the 4xx response"):
        IdempotencyMiddleware(Starlette(), manager=manager)


async def test_a_batch_record_whose_declared_error_is_replayed_fails_again_without_running() -> (
    None
):
    import json
    from pathlib import Path

    from idempotency_async.integrations.aws_lambda import process_batch

    manager = Manager(
        MemoryStore(),
        Options(key_prefix="ship", event_key_jmespath="body.order_id", replay_errors=(Invalid,)),
    )
    shipped: list[str] = []

    async def ship(record: dict[str, Any]) -> str:
        order = record["body"]
        shipped.append(order["order_id"])
        if order["quantity"] <= 0:
            raise Invalid("nothing to ship")
        return str(order["order_id"])

    event = json.loads((Path(__file__).parent / "events" / "sqs.json").read_text())
    bad = event["Records"][1]["messageId"]
    for _ in range(2):
        answer = await process_batch(manager, event, ship)
        assert [item["itemIdentifier"] for item in answer["batchItemFailures"]] == [bad]
    # The declared failure ran once: its redelivery replayed the error.
    assert sorted(shipped) == ["ord-1001", "ord-1002", "ord-1003"]
