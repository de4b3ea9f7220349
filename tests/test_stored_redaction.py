"""Redaction of stored results: declared fields never reach the store, duplicates or the
cache; the caller whose call ran gets its whole result; never-stored calls complete
without a response.  Against MemoryStore, a real Redis (both record layouts), a real
Postgres, and DynamoDB on the moto server."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from _moto import fresh_store, open_client
from _postgres import PostgresServer, fresh_postgres_store
from _redis import RedisServer, fresh_redis_store

from idempotency_async import (
    Call,
    Event,
    LocalCache,
    Manager,
    MemoryStore,
    Options,
    Redaction,
    Wait,
)
from idempotency_async._stored_redaction import remove
from idempotency_async.errors import ConfigError, ResponseNotStoredError
from idempotency_async.stores.base import Store

SECRET = "wJalrXUtnFEMI-secret"
RESULT: dict[str, Any] = {
    "credentials": {"access_key": "AKIA1", "secret": SECRET, "token": "tok-1"},
    "grants": [{"role": "r1", "token": "g1"}, {"role": "r2"}],
    "kept": 0,
}
REDACTED = {
    "credentials": {"access_key": "AKIA1"},
    "grants": [{"role": "r1"}, {"role": "r2"}],
    "kept": 0,
}
FIELDS = ("credentials.secret", "credentials.token", "grants[*].token")


def _redacting(store: Store | None = None, **options: Any) -> Options:
    return _options(store, redaction=Redaction(fields=FIELDS), **options)


def _options(store: Store | None, **options: Any) -> Options:
    """Options whose key format is the store's record format (Redis writes both)."""
    return Options(key_format=getattr(store, "record_format", "typescript"), **options)


@pytest.fixture(params=["memory", "redis", "redis-powertools", "postgres", "dynamodb"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param.startswith("redis"):
        server: RedisServer = request.getfixturevalue("redis_server")
        layout = "powertools-python" if request.param == "redis-powertools" else "typescript"
        async with fresh_redis_store(server, record_format=layout) as redis_store:
            yield redis_store
    elif request.param == "dynamodb":  # native AttributeValues, the TypeScript port's layout
        async with open_client(request.getfixturevalue("moto_endpoint")) as client:
            dynamodb = await fresh_store(client)
            yield dynamodb
            await dynamodb.aclose()
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        async with fresh_postgres_store(postgres) as postgres_store:
            yield postgres_store


@dataclass
class Runs:
    count: int = 0

    async def run(self) -> dict[str, Any]:
        self.count += 1
        return copy.deepcopy(RESULT)


def _holds_secret(value: Any) -> bool:
    return SECRET in repr(value) or "tok-1" in repr(value) or "'g1'" in repr(value)


# ---------------------------------------------------------------- declaring fields


@pytest.mark.parametrize(
    "field",
    ["length(a)", "a[*]", "a[1:2].b", "a[].b", "[?a].b", "a.b[0]", "@", "a ||", 7],
)
def test_a_path_that_names_no_member_is_refused_at_construction(field: Any) -> None:
    with pytest.raises(ConfigError, match="redacted field"):
        Redaction(fields=[field])


def test_never_store_with_fields_is_refused() -> None:
    with pytest.raises(ConfigError, match="one or the other"):
        Redaction(fields=["a.b"], never_store=True)


def test_options_refuse_a_redaction_that_is_not_one() -> None:
    with pytest.raises(ConfigError, match="Redaction"):
        Options(redaction=("a.b",))  # type: ignore[arg-type]


def test_a_lone_string_is_one_field_not_its_characters() -> None:
    assert Redaction(fields="credentials.secret").fields == ("credentials.secret",)


def test_a_long_path_keeps_every_step() -> None:
    (path,) = Redaction(fields='a.b[0].c.*.d[*]."e-f"').paths
    assert path.steps[:4] == ("a", "b", 0, "c")
    assert path.steps[-1] == "e-f" and len(path.steps) == 8


def test_removal_copies_only_what_it_changes_and_never_the_input() -> None:
    value = copy.deepcopy(RESULT)
    redacted, found = Redaction(fields=(*FIELDS, "absent.member")).apply(value)
    assert redacted == REDACTED
    assert found == FIELDS
    assert value == RESULT  # the input is untouched
    assert remove(value, ("kept", "x")) == (value, False)
    assert remove([{"a": 1}], (0, "a")) == ([{}], True)
    assert remove(
        {"m": {"x": {"s": 1}, "y": 2}}, ("m", *Redaction(fields="m.*.s").paths[0].steps[1:])
    ) == (
        {"m": {"x": {}, "y": 2}},
        True,
    )


# ---------------------------------------------------------------- plain calls, real stores


async def test_the_caller_gets_all_and_duplicates_and_the_store_never_see_the_fields(
    store: Store,
) -> None:
    manager = Manager(store, _redacting(store))
    runs = Runs()
    payload = {"order": "o-1"}
    assert await manager.execute(payload, runs.run, timeout=10) == RESULT
    assert await manager.execute(payload, runs.run, timeout=10) == REDACTED
    key = manager.key_for(payload)
    assert key is not None
    verdict = await store.get(key, now=manager.options.clock())
    assert verdict.record is not None and verdict.record.response == REDACTED
    # Another process (no redaction of its own) replays what the store holds.
    other = Manager(store, _options(store))
    assert await other.execute(payload, runs.run, timeout=10) == REDACTED
    assert await other.replay(payload, default=None, timeout=10) == REDACTED
    assert runs.count == 1


async def test_a_never_stored_call_completes_without_its_response(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Event] = []
    never = Redaction(never_store=True)
    manager = Manager(store, _options(store, redaction=never, on_event=events.append))
    runs = Runs()
    with caplog.at_level(logging.WARNING, logger="idempotency_async"):
        assert await manager.execute({"n": 1}, runs.run, timeout=10) == RESULT
    assert "response not stored" not in caplog.text  # declared: no warning
    assert [event.kind for event in events].count("response_not_stored") == 1
    with pytest.raises(ResponseNotStoredError, match="never_store") as caught:
        await Manager(store, _options(store)).execute({"n": 1}, runs.run, timeout=10)
    assert caught.value.reason is not None and "never_store" in caught.value.reason
    key = manager.key_for({"n": 1})
    assert key is not None
    verdict = await store.get(key, now=manager.options.clock())
    assert verdict.record is not None and not verdict.record.response_stored
    assert not _holds_secret(verdict.record)
    assert runs.count == 1


# ---------------------------------------------------------------- in-process paths


async def test_the_local_cache_holds_the_redacted_form() -> None:
    events: list[Event] = []
    store = MemoryStore()
    manager = Manager(store, _redacting(local_cache=LocalCache(), on_event=events.append))
    runs = Runs()
    assert await manager.execute({"c": 1}, runs.run, timeout=10) == RESULT
    key = manager.key_for({"c": 1})
    assert key is not None
    await store.force_release(key)  # behind the manager's back: only its cache answers now
    assert await manager.execute({"c": 1}, runs.run, timeout=10) == REDACTED
    assert [event.kind for event in events][-1] == "cache_hit"
    assert runs.count == 1


async def test_an_in_process_waiter_gets_the_redacted_form() -> None:
    manager = Manager(MemoryStore(), _redacting(wait=Wait(timeout=10.0)))
    release = asyncio.Event()
    runs = Runs()

    async def slow() -> dict[str, Any]:
        await release.wait()
        return await runs.run()

    first = asyncio.create_task(manager.execute({"w": 1}, slow, timeout=10))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(manager.execute({"w": 1}, slow, timeout=10))
    await asyncio.sleep(0.01)
    release.set()
    assert await first == RESULT
    assert await second == REDACTED
    assert runs.count == 1


async def test_execute_call_completing_early_stores_the_redacted_form(store: Store) -> None:
    manager = Manager(store, _redacting(store))
    returned: list[Any] = []

    async def work(call: Call) -> dict[str, Any]:
        result = copy.deepcopy(RESULT)
        await call.complete(result)
        returned.append(await manager.execute({"e": 1}, Runs().run, timeout=10))
        return result

    assert await manager.execute_call({"e": 1}, work, timeout=10) == RESULT
    assert returned == [REDACTED]  # a duplicate while the first call still runs


async def test_fields_name_the_codecs_json_value() -> None:
    @dataclass
    class Grant:
        user: str
        secret: str

    class Codec:
        def encode(self, result: Any) -> Any:
            return {"user": result.user, "secret": result.secret}

        def decode(self, stored: Any) -> Any:
            return stored

    manager = Manager(
        MemoryStore(), Options(response_codec=Codec(), redaction=Redaction(fields="secret"))
    )

    async def grant() -> Grant:
        return Grant("u", SECRET)

    assert await manager.execute({"g": 1}, grant, timeout=10) == Grant("u", SECRET)
    assert await manager.execute({"g": 1}, grant, timeout=10) == {"user": "u"}
