"""Stored records are untrusted input: crafted or foreign records, written straight into a
real redis-server and a real (moto) DynamoDB table, never crash the reader.

A completed record whose *response* is malformed answers "not stored" on every path (the
store alone, the local cache, an in-process duplicate waiting on the first call), and the
callback never runs; a record whose *control fields* are malformed is
``InconsistentStateError``, reported as a ``record_unreadable`` event, and removable with
``force_release``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import tracemalloc
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from _moto import fresh_table
from _redis import RedisServer, fresh_redis_store
from hypothesis import example, given, settings
from hypothesis import strategies as st

from idempotency_async import LocalCache, Manager, Options, errors
from idempotency_async._json import _stored_depth, decode_json, encode_json, nesting_depth
from idempotency_async.events import Event
from idempotency_async.record import Record, Status
from idempotency_async.stores._redis_records import decode_record
from idempotency_async.stores.base import Store
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.postgres import PostgresStore
from idempotency_async.stores.redis import RedisStore

FUTURE = int(time.time()) + 3600
DEEP = 5_000


class Never:
    """A callback that must not run: the key's record is completed."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self) -> str:
        self.runs += 1
        return "ran again"


def make(store: Store, *, python: bool = False, **options: Any) -> tuple[Manager, list[Event]]:
    events: list[Event] = []
    manager = Manager(
        store,
        Options(
            key_prefix="orders",
            event_key_jmespath="id",
            key_format="powertools-python" if python else "typescript",
            on_event=events.append,
            **options,
        ),
    )
    return manager, events


Write = Callable[[str, Any], Awaitable[None]]
"""Writes a crafted record (the raw text for Redis, an item for DynamoDB) at a key."""


@pytest.fixture
async def redis_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    async with fresh_redis_store(redis_server) as store:
        yield store


@pytest.fixture
async def redis_python_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    async with fresh_redis_store(redis_server, record_format="powertools-python") as store:
        yield store


async def put_raw(server: RedisServer, store: RedisStore, key: str, raw: str | bytes) -> None:
    async with server.client() as client:
        await client.set(store.key_prefix + key, raw)


async def assert_not_stored_everywhere(
    store: Store, payload: dict[str, Any], *, python: bool = False, reason: str
) -> None:
    """Every path answers ResponseNotStoredError naming ``reason``, and nothing re-runs."""
    never = Never()
    # The store alone.
    alone, _ = make(store, python=python)
    with pytest.raises(errors.ResponseNotStoredError, match=reason) as caught:
        await alone.execute(payload, never, timeout=10)
    assert caught.value.reason is not None and reason in caught.value.reason
    # An in-process duplicate waiting for the first call's answer, with the local cache on.
    cached, events = make(store, python=python, local_cache=LocalCache())
    answers = await asyncio.gather(
        cached.execute(payload, never, timeout=10),
        cached.execute(payload, never, timeout=10),
        return_exceptions=True,
    )
    assert [type(answer) for answer in answers] == [errors.ResponseNotStoredError] * 2
    assert "joined" in [event.kind for event in events]  # the second one waited
    # The local cache (or the store again: a record not stored is not cached).
    with pytest.raises(errors.ResponseNotStoredError, match=reason):
        await cached.execute(payload, never, timeout=10)
    assert never.runs == 0


async def assert_unreadable(store: Store, payload: dict[str, Any], *, python: bool = False) -> None:
    """InconsistentStateError and a record_unreadable event; force_release removes it."""
    never = Never()
    manager, events = make(store, python=python)
    with pytest.raises(errors.InconsistentStateError, match="cannot be read"):
        await manager.execute(payload, never, timeout=10)
    assert never.runs == 0
    unreadable = [event for event in events if event.kind == "record_unreadable"]
    assert len(unreadable) == 1
    assert isinstance(unreadable[0].error, errors.InconsistentStateError)
    key = manager.key_for(payload)
    assert key is not None
    with pytest.raises(errors.InconsistentStateError, match="cannot be read"):
        await store.get(key, now=time.time())
    with pytest.raises(errors.InconsistentStateError, match="was deleted"):
        await manager.force_release(key)
    assert (await store.get(key, now=time.time())).record is None
    assert await manager.execute(payload, never, timeout=10) == "ran again"


def deep_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# -- Redis ----------------------------------------------------------------------------


def ts_record(data: str, **fields: Any) -> str:
    head = json.dumps({"status": "COMPLETED", "expiration": FUTURE, **fields})
    return head[:-1] + ',"data":' + data + "}"


@pytest.mark.redis
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (deep_json(DEEP), "nested 5000 levels deep"),
        ("[NaN]", "not a finite number"),
        ("[1e999]", "beyond the range of a float"),
        ('{"a": Infinity}', "not a finite number"),
    ],
    ids=["deep", "nan", "overflow", "infinity"],
)
async def test_redis_malformed_response_is_not_stored(
    redis_store: RedisStore, redis_server: RedisServer, data: str, reason: str
) -> None:
    payload = {"id": uuid.uuid4().hex}
    key = make(redis_store)[0].key_for(payload)
    assert key is not None
    await put_raw(redis_server, redis_store, key, ts_record(data))
    await assert_not_stored_everywhere(redis_store, payload, reason=reason)


@pytest.mark.redis
@pytest.mark.parametrize(
    "data",
    [json.dumps({"x": math.nan}), json.dumps({"x": math.inf}), deep_json(DEEP), "not json"],
    ids=["nan", "infinity", "deep", "not-json"],
)
async def test_redis_powertools_response_with_nan_or_depth_is_not_stored(
    redis_python_store: RedisStore, redis_server: RedisServer, data: str
) -> None:
    # Issue 21 defect 6: Powertools (Python) writes NaN as JSON text (json.dumps); one key
    # gives one answer on every path.
    payload = {"id": uuid.uuid4().hex}
    key = make(redis_python_store, python=True)[0].key_for(payload)
    assert key is not None
    raw = json.dumps({"data": data, "status": "COMPLETED", "expiration": FUTURE})
    await put_raw(redis_server, redis_python_store, key, raw)
    await assert_not_stored_everywhere(
        redis_python_store, payload, python=True, reason="the stored response cannot be read"
    )


@pytest.mark.redis
@pytest.mark.parametrize(
    "raw",
    [
        '{"status":"COMPLETED","expiration":1e999,"data":1}',
        f'{{"status":"INPROGRESS","expiration":{FUTURE},"in_progress_expiration":1e999}}',
        '{"status":"COMPLETED","expiration":"soon","data":1}',
        f'{{"status":"COMPLETED","expiration":{FUTURE},"owner":7,"data":1}}',
        f'{{"status":"DONE","expiration":{FUTURE},"data":1}}',
        f'{{"status":"COMPLETED","x":{deep_json(DEEP)},"expiration":{FUTURE}}}',
        deep_json(DEEP),
        "[1]",
    ],
    ids=[
        "expiration-1e999",
        "lease-1e999",
        "expiration-text",
        "owner-number",
        "unknown-status",
        "deep-record",
        "deep-array",
        "not-an-object",
    ],
)
async def test_redis_malformed_control_fields_are_inconsistent_state(
    redis_store: RedisStore, redis_server: RedisServer, raw: str
) -> None:
    payload = {"id": uuid.uuid4().hex}
    key = make(redis_store)[0].key_for(payload)
    assert key is not None
    await put_raw(redis_server, redis_store, key, raw)
    await assert_unreadable(redis_store, payload)


# -- DynamoDB -------------------------------------------------------------------------


@pytest.fixture
async def table(dynamodb_client: Any) -> str:
    return await fresh_table(dynamodb_client)


def item(key: str, **attributes: Any) -> dict[str, Any]:
    return {
        "id": {"S": key},
        "status": {"S": "COMPLETED"},
        "expiration": {"N": str(FUTURE)},
        **attributes,
    }


@pytest.mark.dynamodb
@pytest.mark.parametrize(
    "text",
    [json.dumps({"x": math.nan}), json.dumps([-math.inf]), deep_json(100_000), "{"],
    ids=["nan", "infinity", "deep-100000", "not-json"],
)
async def test_dynamodb_powertools_malformed_data_is_not_stored(
    dynamodb_client: Any, table: str, text: str
) -> None:
    # Issue 21 defect 6 and issue 22 item 6, in the real Powertools (Python) format.
    store = DynamoDBStore(dynamodb_client, table_name=table, record_format="powertools-python")
    payload = {"id": uuid.uuid4().hex}
    key = make(store, python=True)[0].key_for(payload)
    assert key is not None
    await dynamodb_client.put_item(TableName=table, Item=item(key, data={"S": text}))
    await assert_not_stored_everywhere(
        store, payload, python=True, reason="the stored response cannot be read"
    )


@pytest.mark.dynamodb
@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({"data": {"S": deep_json(DEEP)}, "data_format": {"S": "json"}}, "nested 5000"),
        ({"data": {"S": "[NaN]"}, "data_format": {"S": "json"}}, "not a finite number"),
        ({"data": {"B": b"\x00\x01"}}, "not a JSON value"),
        ({"data": {"B": b"not zlib"}, "data_format": {"S": "json+zlib"}}, "not zlib data"),
        ({"data": {"S": "[1]"}, "data_format": {"S": "json+bzip"}}, "unknown data format"),
    ],
    ids=["deep-json", "nan-json", "binary", "zlib", "format"],
)
async def test_dynamodb_malformed_response_is_not_stored(
    dynamodb_client: Any, table: str, attributes: dict[str, Any], reason: str
) -> None:
    store = DynamoDBStore(dynamodb_client, table_name=table)
    payload = {"id": uuid.uuid4().hex}
    key = make(store)[0].key_for(payload)
    assert key is not None
    await dynamodb_client.put_item(TableName=table, Item=item(key, **attributes))
    await assert_not_stored_everywhere(store, payload, reason=reason)


@pytest.mark.dynamodb
async def test_dynamodb_zlib_bomb_is_not_inflated_whole(dynamodb_client: Any, table: str) -> None:
    # 200 MB of JSON compress to ~200 KB: reading it must stop at max_response_bytes.
    inflated = 200_000_000
    bomb = zlib.compressobj(9)
    chunk = b"0," * 500_000
    parts = [bomb.compress(b"[")]
    parts += [bomb.compress(chunk) for _ in range(inflated // len(chunk))]
    parts.append(bomb.compress(b"0]") + bomb.flush())
    compressed = b"".join(parts)
    assert len(compressed) < 400_000
    store = DynamoDBStore(dynamodb_client, table_name=table)
    payload = {"id": uuid.uuid4().hex}
    key = make(store)[0].key_for(payload)
    assert key is not None
    await dynamodb_client.put_item(
        TableName=table,
        Item=item(key, data={"B": compressed}, data_format={"S": "json+zlib"}),
    )
    tracemalloc.start()
    try:
        verdict = await store.get(key, now=time.time())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert verdict.record is not None and not verdict.record.response_stored
    assert "inflates to more than max_response_bytes" in (verdict.record.not_stored or "")
    # The store's limit (2 MB) plus the item itself, never the 200 MB the text inflates to.
    assert peak < 5 * store.max_response_bytes
    await assert_not_stored_everywhere(store, payload, reason="inflates to more than")


@pytest.mark.dynamodb
@pytest.mark.parametrize(
    "attributes",
    [
        # DynamoDB holds numbers up to 1e126 (1e999 is refused on write): beyond any time.
        {"expiration": {"N": "9.9E+125"}},
        {"status": {"S": "DONE"}},
        {"status": {"N": "1"}},
        {"owner": {"N": "7"}},
        {"validation": {"BOOL": True}},
        {"status": {"S": "INPROGRESS"}, "in_progress_expiration": {"N": "9.9E+125"}},
    ],
    ids=[
        "expiration-9.9e125",
        "unknown-status",
        "status-number",
        "owner-number",
        "validation-bool",
        "lease-9.9e125",
    ],
)
async def test_dynamodb_malformed_control_fields_are_inconsistent_state(
    dynamodb_client: Any, table: str, attributes: dict[str, Any]
) -> None:
    store = DynamoDBStore(dynamodb_client, table_name=table)
    payload = {"id": uuid.uuid4().hex}
    key = make(store)[0].key_for(payload)
    assert key is not None
    await dynamodb_client.put_item(TableName=table, Item={**item(key), **attributes})
    await assert_unreadable(store, payload)


@pytest.mark.dynamodb
async def test_dynamodb_listing_reports_unreadable_records_and_goes_on(
    dynamodb_client: Any, table: str
) -> None:
    store = DynamoDBStore(dynamodb_client, table_name=table)
    await dynamodb_client.put_item(TableName=table, Item=item("good", data={"S": "x"}))
    await dynamodb_client.put_item(TableName=table, Item=item("bad", status={"S": "DONE"}))
    pages = [page async for page in store.pages()]
    assert [record.key for page in pages for record in page.records] == ["good"]
    unreadable = [error for page in pages for error in page.unreadable]
    assert len(unreadable) == 1 and "'bad'" in str(unreadable[0])
    assert sum(page.scanned for page in pages) == 2


# -- responses a store cannot represent (issue 21 defect 3) -----------------------------

UNREPRESENTABLE = {
    "wide-int-and-surrogate": {"n": 2**70, "s": "\ud800"},
    "surrogate-only": {"s": "x\udfffy"},
    "surrogate-key": {"\ud800": [2**64, "\udc00"]},
    "beyond-38-digits": {"n": 2**200, "f": 0.1},
}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


UNREPRESENTABLE["deep-300"] = nested(300)  # beyond orjson's 254 levels


@pytest.mark.parametrize("response", UNREPRESENTABLE.values(), ids=UNREPRESENTABLE.keys())
async def test_a_result_any_store_cannot_encode_natively_replays_exactly(
    store: Store, response: Any
) -> None:
    calls = 0

    async def work() -> Any:
        nonlocal calls
        calls += 1
        return response

    payload = {"id": uuid.uuid4().hex}
    first, events = make(store)
    assert await first.execute(payload, work, timeout=10) == response
    if isinstance(store, PostgresStore) and _has_lone_surrogate(response):
        # jsonb cannot hold a lone surrogate (docs/postgres.md): the record completes
        # without its response, and every duplicate hears so; nothing runs again.
        assert "response_not_stored" in [event.kind for event in events]
        for manager in (make(store)[0], make(store, local_cache=LocalCache())[0]):
            with pytest.raises(errors.ResponseNotStoredError):
                await manager.execute(payload, work, timeout=10)
        assert calls == 1
        return
    assert "response_not_stored" not in [event.kind for event in events]
    for manager in (make(store)[0], make(store, local_cache=LocalCache())[0]):
        assert await manager.execute(payload, work, timeout=10) == response
        assert await manager.execute(payload, work, timeout=10) == response
    assert calls == 1


def _has_lone_surrogate(value: Any) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False))


@pytest.mark.parametrize(
    "python", [False, True], ids=["typescript-format", "powertools-python-format"]
)
@pytest.mark.dynamodb
async def test_dynamodb_stores_surrogates_and_wide_integers_in_both_formats(
    dynamodb_client: Any, table: str, python: bool
) -> None:
    store = DynamoDBStore(
        dynamodb_client,
        table_name=table,
        record_format="powertools-python" if python else "typescript",
    )
    response = {"n": 2**70, "s": "\ud800", "t": "é"}
    payload = {"id": uuid.uuid4().hex}
    manager, _ = make(store, python=python)
    assert await manager.execute(payload, lambda: _value(response), timeout=10) == response
    key = manager.key_for(payload)
    assert key is not None
    record = (await store.get(key, now=time.time())).record
    assert record is not None and record.response == response
    stored = await dynamodb_client.get_item(TableName=table, Key={"id": {"S": key}})
    # Powertools (Python) reads its data with json.loads: the same value there too.
    assert json.loads(stored["Item"]["data"]["S"]) == response


async def _value(value: Any) -> Any:
    return value


@pytest.mark.dynamodb
async def test_dynamodb_refusing_a_value_completes_the_record_without_it(
    dynamodb_client: Any, table: str
) -> None:
    # A response value DynamoDB refuses although the encoder took it for one it holds
    # (fault injection: the completion's UpdateItem is answered with ValidationException).
    store = DynamoDBStore(dynamodb_client, table_name=table)
    refused: list[str] = []

    def refuse(params: dict[str, Any], **_: Any) -> Any:
        body = params.get("body", b"")
        if b'":data"' not in (body if isinstance(body, bytes) else str(body).encode()):
            return None
        refused.append("data")
        error = {"Code": "ValidationException", "Message": "Number overflow."}
        return _Answer(400), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}

    dynamodb_client.meta.events.register("before-call.dynamodb.UpdateItem", refuse)
    manager, events = make(store)
    payload = {"id": uuid.uuid4().hex}
    try:
        assert await manager.execute(payload, lambda: _value({"n": 1.5}), timeout=10) == {"n": 1.5}
    finally:
        dynamodb_client.meta.events.unregister("before-call.dynamodb.UpdateItem", refuse)
    assert refused == ["data"]
    not_stored = [event for event in events if event.kind == "response_not_stored"]
    assert len(not_stored) == 1 and "too large" not in str(not_stored[0].error)
    with pytest.raises(errors.ResponseNotStoredError, match="Number overflow") as caught:
        await make(store)[0].execute(payload, Never(), timeout=10)
    assert "too large" not in str(caught.value)


class _Answer:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""


# -- any text, any item: a record or an error of the documented kind ---------------------

RECORD_MEMBERS = ["status", "expiration", "in_progress_expiration", "owner", "data", "x"]
_NUMBER = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, 2**64, 10**30, FUTURE]) | (
    st.floats() | st.integers()
)
_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | _NUMBER | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)
_JSON_ATOMS = st.sampled_from(
    ["1e999", "-1e999", "NaN", "Infinity", '"\\ud800"', "1" * 5000, "[" * 600, "{}", "null"]
)


@settings(max_examples=250)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.one_of(_JSON_ATOMS, st.sampled_from(['{"status":', ',"data":', "]", "}", ","])),
            max_size=12,
        ).map(lambda parts: "".join(parts).encode()),
        st.fixed_dictionaries(
            {},
            optional={
                "status": st.sampled_from(["COMPLETED", "INPROGRESS", "DONE", 1]),
                "expiration": _NUMBER | _JSON_VALUE,
                "in_progress_expiration": _NUMBER | _JSON_VALUE,
                "owner": st.text(max_size=3) | _JSON_VALUE,
                "data_format": st.sampled_from(["not-stored: x", "json"]) | _JSON_VALUE,
                "data": _JSON_VALUE | _JSON_VALUE.map(json.dumps),
            },
        ).map(lambda value: json.dumps(value).encode()),
    ),
    st.booleans(),
)
def test_any_redis_record_text_decodes_or_is_a_typed_refusal(raw: bytes, python: bool) -> None:
    try:
        record = decode_record("k", raw, python=python)
    except (KeyError, ValueError, TypeError):
        return  # what RedisStore turns into InconsistentStateError
    assert record.status in (Status.COMPLETED, Status.INPROGRESS)
    assert math.isfinite(record.expiration - time.time())
    if record.response_stored and record.response is not None:
        assert decode_json(encode_json(record.response)) == record.response


def test_a_redis_record_is_read_into_every_field_in_order() -> None:
    """The reader builds a Record with tuple's constructor (a replay's cost): its fields,
    positionally, must stay Record's."""
    raw = b'{"status":"INPROGRESS","expiration":9,"in_progress_expiration":8000,'
    raw += b'"validation":"v","owner":"o","steps":"[[\\"a\\",1]]","step_count":1}'
    record = decode_record("k", raw)
    assert record._asdict() == {
        "key": "k",
        "status": Status.INPROGRESS,
        "expiration": 9,
        "lease_end": 8.0,
        "validation": "v",
        "owner": "o",
        "response": None,
        "response_stored": True,
        "not_stored": None,
        "steps": '[["a",1]]',
    }
    stored = decode_record("k", b'{"status":"COMPLETED","expiration":9,"data":[1]}')
    assert stored._asdict() == Record("k", Status.COMPLETED, 9, response=[1])._asdict()


def _read(raw: bytes, python: bool) -> Any:
    try:
        return repr(decode_record("k", raw, python=python))  # 10**30 == 1e30, not as text
    except (KeyError, ValueError, TypeError) as exc:
        return type(exc)  # (a message may quote a position in the text)


@settings(max_examples=250)
@example({"status": "COMPLETED", "expiration": FUTURE}, "1" * 30, " ", False)
@example({"status": "COMPLETED", "owner": "o"}, json.dumps("[" * 20 + "]" * 20), " ", True)
@given(
    st.fixed_dictionaries(
        {"status": st.sampled_from(["COMPLETED", "INPROGRESS", "DONE", 1])},
        optional={
            "expiration": _NUMBER | _JSON_VALUE,
            "in_progress_expiration": _NUMBER | _JSON_VALUE,
            "validation": st.text(max_size=3) | _JSON_VALUE,
            "owner": st.text(max_size=3) | _JSON_VALUE,
            "data_format": st.sampled_from(["not-stored: x", "json"]) | _JSON_VALUE,
        },
    ),
    _JSON_ATOMS
    | st.sampled_from(["1" * 30, '{"n":[-' + "9" * 25 + "]}"])  # wide integers: the stdlib's
    | _JSON_VALUE.map(json.dumps)
    | _JSON_VALUE.map(json.dumps).map(json.dumps),
    st.sampled_from(["", " "]),
    st.booleans(),
)
def test_a_short_redis_record_reads_as_the_same_record_made_long(
    members: dict[str, Any], data: str, mark: str, python: bool
) -> None:
    """A record short enough to nest within the depth bound is read by a shorter path
    (a replay's); the same record padded past that length, by the general one."""
    raw = json.dumps(members, separators=(",", ":")).encode()[:-1]
    raw += b',"data":' + (mark + data).encode() + b"}"
    padded = b"{" + b" " * 600 + raw[1:]
    assert _read(raw, python) == _read(padded, python)


_ATTRIBUTE = st.recursive(
    st.builds(lambda text: {"S": text}, st.text(max_size=5))
    | st.builds(lambda n: {"N": n}, st.sampled_from(["1", "1.5", "9.9E+125", "-1", "NaN", "x"]))
    | st.builds(lambda flag: {"BOOL": flag}, st.booleans())
    | st.just({"NULL": True})
    | st.builds(lambda data: {"B": data}, st.binary(max_size=8)),
    lambda children: (
        st.builds(lambda items: {"L": items}, st.lists(children, max_size=3))
        | st.builds(
            lambda members: {"M": members},
            st.dictionaries(st.text(max_size=3), children, max_size=3),
        )
    ),
    max_leaves=10,
)


@settings(max_examples=250)
@given(
    st.dictionaries(
        st.sampled_from([*RECORD_MEMBERS[:-1], "validation", "data_format"]),
        _ATTRIBUTE
        | st.sampled_from(
            [{"S": "COMPLETED"}, {"S": "INPROGRESS"}, {"S": "json"}, {"S": "json+zlib"}]
        ),
        max_size=7,
    ),
    st.booleans(),
)
def test_any_dynamodb_item_decodes_or_is_inconsistent_state(
    attributes: dict[str, Any], python: bool
) -> None:
    store = DynamoDBStore(
        object(),
        table_name="t",
        record_format="powertools-python" if python else "typescript",
    )
    try:
        record = store._items.read({"id": {"S": "k"}, **attributes})
    except errors.InconsistentStateError:
        return
    assert math.isfinite(record.expiration - time.time())
    if record.response_stored and record.response is not None:
        assert decode_json(encode_json(record.response)) == record.response


_TRICKY_JSON = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), children, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(_TRICKY_JSON, st.integers(0, 20))
def test_the_stored_depth_check_counts_as_the_exact_one(value: Any, wrap: int) -> None:
    # Brackets and quotes inside strings, escapes, and nesting past the quick passes.
    for _ in range(wrap):
        value = [value]
    text = json.dumps(value)
    assert _stored_depth(text) == nesting_depth(text)
    assert _stored_depth(text.encode()) == nesting_depth(text)


class _RefusingCodec:
    """A response codec whose error quotes a lone surrogate from the result."""

    def encode(self, result: Any) -> Any:
        raise ValueError(f"cannot encode {result}")

    def decode(self, stored: Any) -> Any:
        return stored


async def test_a_not_stored_reason_quoting_a_lone_surrogate_still_completes(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # The reason rides on the record (Redis JSON text, a DynamoDB string): it must be
    # UTF-8, or the completion fails and the record stays in progress.  So must the
    # warning that says so, or a handler writing UTF-8 drops it.
    payload = {"id": uuid.uuid4().hex}
    first, _ = make(store, response_codec=_RefusingCodec())
    with caplog.at_level(logging.WARNING, logger="idempotency_async"):
        assert await first.execute(payload, lambda: _value("x\ud800"), timeout=10) == "x\ud800"
    warned = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert warned and all("x\\ud800" in message for message in warned)
    for message in warned:
        message.encode("utf-8")
    with pytest.raises(errors.ResponseNotStoredError, match="cannot encode") as caught:
        await make(store, response_codec=_RefusingCodec())[0].execute(payload, Never(), timeout=10)
    assert caught.value.reason is not None and "cannot encode x" in caught.value.reason


@pytest.mark.redis
async def test_redis_record_with_members_after_data_replays(
    redis_store: RedisStore, redis_server: RedisServer
) -> None:
    # Another writer's member order: the cut at "data" is not the end of the record.
    payload = {"id": uuid.uuid4().hex}
    key = make(redis_store)[0].key_for(payload)
    assert key is not None
    raw = f'{{"status":"COMPLETED","expiration":{FUTURE},"data":{{"a":[1]}},"note":"x"}}'
    await put_raw(redis_server, redis_store, key, raw)
    assert await make(redis_store)[0].execute(payload, Never(), timeout=10) == {"a": [1]}
