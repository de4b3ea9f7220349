"""DynamoDBStore against a real moto server over HTTP (aioboto3, no mocks)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _moto import fresh_store, new_session, open_transport

from idempotency_async._json import encode_json
from idempotency_async.errors import (
    ConfigError,
    InconsistentStateError,
    PersistenceError,
    StoreAccessDeniedError,
    StoreThrottledError,
    StoreUnavailableError,
    StoreValidationError,
)
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import Found, Store, Written
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table
from idempotency_async.stores.dynamodb_light import LightDynamoDBClient

pytestmark = pytest.mark.dynamodb

NOW = 1_700_000_000.0
TTL = 3600
LEASE = 30


def claim_for(
    key: str, owner: str, *, now: float = NOW, lease: float = LEASE, validation: str | None = None
) -> Claim:
    return Claim(key, owner, now, lease, TTL, validation)


def completion_for(
    key: str, owner: str, response: Any, *, stored: bool = True, now: float = NOW
) -> Completion:
    encoded = encode_json(response) if stored else None
    return Completion(key, owner, now, TTL, None, encoded, response if stored else None)


async def try_claim(store: Store, claim: Claim, now: float) -> Record | None:
    """Claim at ``now`` (the lease still ends where ``claim`` says): None when claimed,
    else the record that blocked it."""
    shifted = claim._replace(now=now, lease=claim.lease - (now - claim.now))
    verdict = await store.claim(shifted)
    return None if verdict.found is Found.CLAIMED else verdict.record


async def get_record(store: Store, key: str, now: float = NOW) -> Record | None:
    return (await store.get(key, now=now)).record


async def complete_ok(store: Store, completion: Completion) -> bool:
    return await store.complete(completion) is not Written.NOTHING


def typed(value: Any) -> Any:
    """The value with every node's type spelled out, so 1 and 1.0 and True differ."""
    if isinstance(value, dict):
        return ("dict", {name: typed(element) for name, element in value.items()})
    if isinstance(value, list):
        return ("list", [typed(element) for element in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


@contextlib.contextmanager
def sent_requests(client: Any) -> Iterator[list[str]]:
    """Names of the HTTP requests the client sends inside the block (each retry counts
    with aioboto3; the light client's retries are its own and are not counted)."""
    sent: list[str] = []
    if isinstance(client, LightDynamoDBClient):
        request = client.request

        async def counted(operation: str, body: Any) -> dict[str, Any]:
            sent.append(operation)
            return await request(operation, body)

        client.request = counted  # type: ignore[method-assign]
        try:
            yield sent
        finally:
            del client.request
        return

    def record(event_name: str, **_: Any) -> None:
        sent.append(event_name.rsplit(".", 1)[-1])

    client.meta.events.register("before-send.dynamodb.*", record)
    try:
        yield sent
    finally:
        client.meta.events.unregister("before-send.dynamodb.*", record)


async def raw_item(store: DynamoDBStore, client: Any, key: dict[str, Any]) -> dict[str, Any]:
    response = await client.get_item(TableName=store.table_name, Key=key, ConsistentRead=True)
    item: dict[str, Any] = response["Item"]
    return item


async def complete_and_read(store: DynamoDBStore, response: Any) -> Record:
    key = f"k#{uuid.uuid4().hex}"
    assert await try_claim(store, claim_for(key, "A"), NOW) is None
    assert await complete_ok(store, completion_for(key, "A", response))
    record = await get_record(store, key)
    assert record is not None
    return record


@pytest.fixture
async def store(dynamodb_client: Any, store_client: Any) -> DynamoDBStore:
    """A store on each transport (``store_client``); ``dynamodb_client`` reads items raw."""
    return await fresh_store(dynamodb_client, store_client=store_client)


# -- claim ------------------------------------------------------------------------


async def test_store_satisfies_the_protocol(store: DynamoDBStore) -> None:
    assert isinstance(store, Store)


async def test_claim_writes_an_inprogress_record_with_owner_and_validation(
    store: DynamoDBStore,
) -> None:
    claim = claim_for("k#1", "owner-a", validation="hash==")
    assert await try_claim(store, claim, NOW) is None
    assert await get_record(store, "k#1") == claim.to_record(claim.now)


async def test_conflicting_claim_returns_the_holder_in_one_request(
    store: DynamoDBStore, store_client: Any
) -> None:
    await try_claim(store, claim_for("k#1", "A", validation="v"), NOW)
    with sent_requests(store_client) as sent:
        blocking = await try_claim(store, claim_for("k#1", "B"), NOW + 1)
    assert sent == ["PutItem"]
    assert blocking == claim_for("k#1", "A", validation="v").to_record(NOW)


async def test_conflict_on_a_completed_record_carries_its_response(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A"), NOW)
    await complete_ok(store, completion_for("k#1", "A", {"order": 7}))
    blocking = await try_claim(store, claim_for("k#1", "B"), NOW + 1)
    assert blocking is not None
    assert (blocking.status, blocking.owner, blocking.response) == (
        Status.COMPLETED,
        "A",
        {"order": 7},
    )


async def test_record_is_claimable_only_after_it_expires(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A", lease=TTL), NOW)
    expiration = int(NOW) + TTL
    assert await try_claim(store, claim_for("k#1", "B", now=expiration), expiration) is not None
    later = expiration + 1
    assert await try_claim(store, claim_for("k#1", "B", now=later), later) is None
    record = await get_record(store, "k#1")
    assert record is not None and record.owner == "B"


async def test_inprogress_record_is_claimable_only_after_its_lease_lapses(
    store: DynamoDBStore,
) -> None:
    await try_claim(store, claim_for("k#1", "A", lease=5), NOW)
    assert await try_claim(store, claim_for("k#1", "B"), NOW + 4.999) is not None
    assert await try_claim(store, claim_for("k#1", "B"), NOW + 5.001) is None


async def test_completed_record_is_not_reclaimable_after_the_lease(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A", lease=5), NOW)
    await complete_ok(store, completion_for("k#1", "A", "done"))
    blocking = await try_claim(store, claim_for("k#1", "B"), NOW + 60)
    assert blocking is not None and blocking.response == "done"


async def test_twenty_concurrent_claims_of_one_key_have_one_winner(store: DynamoDBStore) -> None:
    results = await asyncio.gather(
        *(try_claim(store, claim_for("k#race", f"owner-{n}"), NOW) for n in range(20))
    )
    winners = [n for n, result in enumerate(results) if result is None]
    assert len(winners) == 1
    winner = f"owner-{winners[0]}"
    assert {result.owner for result in results if result is not None} == {winner}
    record = await get_record(store, "k#race")
    assert record is not None and record.owner == winner


# -- complete, release, fencing ------------------------------------------------------


async def test_stale_owner_cannot_complete_or_release_the_new_claim(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A", lease=5), NOW)
    assert await try_claim(store, claim_for("k#1", "B", now=NOW + 6), NOW + 6) is None

    assert await complete_ok(store, completion_for("k#1", "A", "zombie")) is False
    assert await store.release("k#1", "A") is False
    assert await get_record(store, "k#1") == claim_for("k#1", "B", now=NOW + 6).to_record(NOW + 6)

    assert await complete_ok(store, completion_for("k#1", "B", "fresh"))
    record = await get_record(store, "k#1")
    assert record is not None and (record.owner, record.response) == ("B", "fresh")


async def test_complete_does_not_create_a_missing_record(store: DynamoDBStore) -> None:
    assert await complete_ok(store, completion_for("k#gone", "A", 1)) is False
    assert await get_record(store, "k#gone") is None


async def test_release_deletes_only_the_owners_record(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A"), NOW)
    assert await store.release("k#1", "A")
    assert await get_record(store, "k#1") is None
    assert await store.release("k#1", "A")  # nothing left: still released


async def test_release_without_owner_deletes_any_record(store: DynamoDBStore) -> None:
    await try_claim(store, claim_for("k#1", "A"), NOW)
    assert await store.force_release("k#1")
    assert await get_record(store, "k#1") is None


async def test_completed_record_keeps_owner_and_validation_and_drops_the_lease(
    store: DynamoDBStore,
) -> None:
    await try_claim(store, claim_for("k#1", "A", validation="v1"), NOW)
    completion = Completion("k#1", "A", NOW + 5, 99, "v1", encode_json([1, "two"]), [1, "two"])
    await complete_ok(store, completion)
    assert await get_record(store, "k#1") == completion.to_record(NOW + 5)


# -- layout and interoperability -----------------------------------------------------


async def test_sort_key_mode_keeps_the_logical_key(dynamodb_client: Any, store_client: Any) -> None:
    store = await fresh_store(
        dynamodb_client, store_client=store_client, sort_key_attr="sk", static_pk_value="idem#fn"
    )
    await try_claim(store, claim_for("fn#abc", "A"), NOW)
    await complete_ok(store, completion_for("fn#abc", "A", {"ok": True}))
    item = await raw_item(store, dynamodb_client, {"id": {"S": "idem#fn"}, "sk": {"S": "fn#abc"}})
    assert item["data"] == {"M": {"ok": {"BOOL": True}}}
    record = await get_record(store, "fn#abc")
    assert record is not None and (record.key, record.response) == ("fn#abc", {"ok": True})
    assert await store.release("fn#abc", "A")
    assert await get_record(store, "fn#abc") is None


async def test_sort_key_mode_defaults_the_partition_to_the_function_name(
    dynamodb_client: Any, store_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "checkout")
    store = await fresh_store(dynamodb_client, store_client=store_client, sort_key_attr="sk")
    await try_claim(store, claim_for("checkout#h", "A"), NOW)
    key = {"id": {"S": "idempotency#checkout"}, "sk": {"S": "checkout#h"}}
    assert (await raw_item(store, dynamodb_client, key))["owner"] == {"S": "A"}


async def test_renamed_attributes_are_used_for_every_field(
    dynamodb_client: Any, store_client: Any
) -> None:
    names = {
        "key_attr": "pk",
        "status_attr": "st",
        "expiry_attr": "ttl",
        "in_progress_expiry_attr": "lease",
        "data_attr": "body",
        "validation_attr": "fp",
        "owner_attr": "tok",
        "data_format_attr": "fmt",
    }
    store = await fresh_store(dynamodb_client, store_client=store_client, **names)
    await try_claim(store, claim_for("k#1", "A", validation="v"), NOW)
    item = await raw_item(store, dynamodb_client, {"pk": {"S": "k#1"}})
    assert set(item) == {"pk", "st", "ttl", "lease", "fp", "tok"}
    assert await try_claim(store, claim_for("k#1", "B"), NOW + 1) is not None
    await complete_ok(store, completion_for("k#1", "A", 1.0))
    item = await raw_item(store, dynamodb_client, {"pk": {"S": "k#1"}})
    assert set(item) == {"pk", "st", "ttl", "body", "fmt", "fp", "tok"}
    record = await get_record(store, "k#1")
    assert record is not None and typed(record.response) == typed(1.0)


async def test_typescript_record_is_replayed(store: DynamoDBStore, dynamodb_client: Any) -> None:
    # What @aws-lambda-powertools/idempotency writes: marshall(result), no owner token.
    await dynamodb_client.put_item(
        TableName=store.table_name,
        Item={
            "id": {"S": "fn#ts"},
            "status": {"S": "COMPLETED"},
            "expiration": {"N": str(int(NOW) + TTL)},
            "in_progress_expiration": {"N": str(int(NOW * 1000) + 5000)},
            "validation": {"S": "abc=="},
            "data": {
                "M": {
                    "statusCode": {"N": "200"},
                    "price": {"N": "12.50"},
                    "items": {"L": [{"S": "a"}, {"NULL": True}, {"BOOL": False}]},
                    "big": {"N": "1e+21"},
                }
            },
        },
    )
    blocking = await try_claim(store, claim_for("fn#ts", "B"), NOW + 10)
    assert blocking is not None
    assert (blocking.status, blocking.owner, blocking.validation) == (
        Status.COMPLETED,
        None,
        "abc==",
    )
    assert typed(blocking.response) == typed(
        {"statusCode": 200, "price": 12.5, "items": ["a", None, False], "big": 1e21}
    )


async def test_typescript_record_without_data_replays_none(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    await dynamodb_client.put_item(
        TableName=store.table_name,
        Item={
            "id": {"S": "fn#void"},
            "status": {"S": "COMPLETED"},
            "expiration": {"N": f"{NOW + TTL:.3f}"},  # older TS versions wrote fractions
        },
    )
    record = await get_record(store, "fn#void")
    assert record is not None
    assert (record.response, record.response_stored, record.expiration) == (
        None,
        True,
        int(NOW) + TTL,
    )


async def test_typescript_inprogress_record_blocks_until_its_lease_lapses(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    await dynamodb_client.put_item(
        TableName=store.table_name,
        Item={
            "id": {"S": "fn#busy"},
            "status": {"S": "INPROGRESS"},
            "expiration": {"N": str(int(NOW) + TTL)},
            "in_progress_expiration": {"N": str(int(NOW * 1000) + 2000)},
        },
    )
    assert await try_claim(store, claim_for("fn#busy", "B"), NOW + 1) is not None
    assert await try_claim(store, claim_for("fn#busy", "B"), NOW + 3) is None


async def test_native_response_has_the_typescript_layout(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    record = await complete_and_read(store, {"n": [1, 2.5, None], "s": ""})
    item = await raw_item(store, dynamodb_client, {"id": {"S": record.key}})
    assert "data_format" not in item
    assert item["data"] == {
        "M": {
            "n": {"L": [{"N": "1"}, {"N": "2.5"}, {"NULL": True}]},
            "s": {"S": ""},
        }
    }


async def test_unknown_status_is_inconsistent_state(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    await dynamodb_client.put_item(
        TableName=store.table_name,
        Item={"id": {"S": "k#odd"}, "status": {"S": "EXPIRED"}, "expiration": {"N": "1"}},
    )
    with pytest.raises(InconsistentStateError, match="cannot be read"):
        await get_record(store, "k#odd")


# -- exact responses -------------------------------------------------------------------

EXACT_RESPONSES = {
    "int64-max-plus-one": 2**63,
    "int-2-70": -(2**70),
    "int-38-digits": 10**37 + 1,
    "int-beyond-38-digits": 2**200,
    "tenth": 0.1,
    "tiny-float": 5e-324,
    "huge-float": 1e300,
    "integral-float": 1.0,
    "negative-zero": -0.0,
    "decimal-looking-text": "123.4500",
    "nested": {"a": [1, 2.5, {"b": [None, True, {"c": {"d": [[], {}]}}]}], "e": 3.0},
    "zero": 0,
    "empty-string": "",
    "empty-list": [],
    "empty-dict": {},
    "false": False,
    "none": None,
    "zero-float": 0.0,
    "empty-key": {"": 1},
    "deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
}


@pytest.mark.parametrize("response", EXACT_RESPONSES.values(), ids=EXACT_RESPONSES.keys())
async def test_response_replays_with_identical_types(store: DynamoDBStore, response: Any) -> None:
    record = await complete_and_read(store, response)
    assert record.response_stored
    assert typed(record.response) == typed(response)


@pytest.mark.parametrize(
    ("response", "native"),
    [
        (2**70, True),
        (0.1, True),
        (1.0, False),  # DynamoDB returns "1.0" as "1", which would read back as int
        (1e300, False),  # beyond DynamoDB's number range
        (2**200, False),  # more than 38 digits
        ({"": 1}, False),
    ],
)
async def test_lossy_native_values_fall_back_to_json_text(
    store: DynamoDBStore, dynamodb_client: Any, response: Any, native: bool
) -> None:
    record = await complete_and_read(store, response)
    item = await raw_item(store, dynamodb_client, {"id": {"S": record.key}})
    assert item.get("data_format") == (None if native else {"S": "json"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.50", 12.5), ("1E+2", 100.0), ("-7", -7), ("18446744073709551617", 2**64 + 1)],
)
async def test_number_text_decodes_by_its_form(
    store: DynamoDBStore, dynamodb_client: Any, text: str, expected: Any
) -> None:
    await dynamodb_client.put_item(
        TableName=store.table_name,
        Item={
            "id": {"S": "k#n"},
            "status": {"S": "COMPLETED"},
            "expiration": {"N": str(int(NOW) + TTL)},
            "data": {"N": text},
        },
    )
    record = await get_record(store, "k#n")
    assert record is not None and typed(record.response) == typed(expected)


async def test_response_not_stored_marker_round_trips(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    await try_claim(store, claim_for("k#1", "A"), NOW)
    assert await complete_ok(store, completion_for("k#1", "A", {"secret": 1}, stored=False))
    record = await get_record(store, "k#1")
    assert record is not None
    assert (record.status, record.response_stored, record.response) == (
        Status.COMPLETED,
        False,
        None,
    )
    assert "data" not in await raw_item(store, dynamodb_client, {"id": {"S": "k#1"}})


async def test_none_response_is_stored_not_confused_with_not_stored(store: DynamoDBStore) -> None:
    record = await complete_and_read(store, None)
    assert (record.response, record.response_stored) == (None, True)


# -- the 400 KB item limit ------------------------------------------------------------


async def test_response_over_the_item_limit_is_stored_compressed(
    store: DynamoDBStore, dynamodb_client: Any
) -> None:
    response = {"rows": [{"id": n, "name": f"row {n}", "tags": ["a", "b"]} for n in range(30_000)]}
    record = await complete_and_read(store, response)
    assert record.response == response
    item = await raw_item(store, dynamodb_client, {"id": {"S": record.key}})
    assert item["data_format"] == {"S": "json+zlib"}
    assert 0 < len(item["data"]["B"]) < 400_000


async def test_incompressible_response_over_the_limit_completes_without_it(
    store: DynamoDBStore,
) -> None:
    noise = base64.b85encode(os.urandom(600_000)).decode()
    record = await complete_and_read(store, {"noise": noise})
    assert record.status is Status.COMPLETED
    assert (record.response_stored, record.response) == (False, None)


async def test_item_rejected_as_too_large_is_retried_compressed(
    store: DynamoDBStore, dynamodb_client: Any, store_client: Any
) -> None:
    # About 360 KB by DynamoDB's count, which the store writes natively; moto counts
    # number text in full (540 KB) and refuses the item, standing in for any item that
    # DynamoDB finds larger than estimated.
    response = [123456789012345678] * 30_000
    await try_claim(store, claim_for("k#1", "A"), NOW)
    with sent_requests(store_client) as sent:
        assert await complete_ok(store, completion_for("k#1", "A", response))
    assert sent == ["UpdateItem", "UpdateItem"]
    record = await get_record(store, "k#1")
    assert record is not None and record.response == response
    item = await raw_item(store, dynamodb_client, {"id": {"S": "k#1"}})
    assert item["data_format"] == {"S": "json+zlib"}


async def test_response_that_does_not_fit_even_compressed_is_not_stored(
    dynamodb_client: Any,
    store_client: Any,
) -> None:
    store = await fresh_store(dynamodb_client, store_client=store_client)
    noise = base64.b64encode(os.urandom(450_000)).decode()  # incompressible, over 400 KB
    record = await complete_and_read(store, noise)
    assert (record.response_stored, record.response) == (False, None)
    assert record.not_stored is not None and "even compressed" in record.not_stored


# -- configuration and client ownership -----------------------------------------------


def test_needs_exactly_one_of_client_and_factory() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        DynamoDBStore(table_name="t")
    with pytest.raises(ConfigError, match="exactly one"):
        DynamoDBStore(object(), table_name="t", client_factory=lambda: None)  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    "names",
    [
        {"data_attr": "status"},
        {"owner_attr": "id"},
        {"sort_key_attr": "id"},
        {"validation_attr": "expiration"},
        {"in_progress_expiry_attr": "data_format"},
        {"data_attr": ""},
    ],
)
def test_duplicate_or_empty_attribute_names_are_rejected(names: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        DynamoDBStore(object(), table_name="t", **names)


class _Factory:
    """A client_factory that counts the clients it opened and closed."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.opened = 0
        self.closed = 0

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[Any]:
        self.opened += 1
        await asyncio.sleep(0.05)  # let concurrent first uses pile up
        async with new_session().client("dynamodb", endpoint_url=self.endpoint) as client:
            yield client
        self.closed += 1


async def test_factory_client_is_opened_once_under_concurrency_and_closed(
    dynamodb_client: Any, moto_endpoint: str
) -> None:
    table = (await fresh_store(dynamodb_client)).table_name
    factory = _Factory(moto_endpoint)
    store = DynamoDBStore(table_name=table, client_factory=factory)
    assert factory.opened == 0
    await asyncio.gather(*(store.get(f"k#{n}", now=NOW) for n in range(10)))
    assert (factory.opened, factory.closed) == (1, 0)
    await store.aclose()
    assert factory.closed == 1
    with pytest.raises(ConfigError, match="closed"):
        await get_record(store, "k#1")


async def test_async_with_opens_the_factory_client_and_closes_it(
    dynamodb_client: Any, moto_endpoint: str
) -> None:
    table = (await fresh_store(dynamodb_client)).table_name
    factory = _Factory(moto_endpoint)
    async with DynamoDBStore(table_name=table, client_factory=factory) as store:
        assert factory.opened == 1
        assert await try_claim(store, claim_for("k#1", "A"), NOW) is None
    assert factory.closed == 1
    with pytest.raises(ConfigError):
        await store.__aenter__()


async def test_aclose_leaves_an_injected_client_open(
    dynamodb_client: Any, store_client: Any
) -> None:
    store = await fresh_store(dynamodb_client, store_client=store_client)
    await store.aclose()
    with pytest.raises(ConfigError):
        await get_record(store, "k#1")
    # The store's client still answers.  Not by list_tables: it returns the first 100
    # tables of the session-wide moto server, which leaves this one out once enough tests
    # ran before.
    answer = await store_client.get_item(TableName=store.table_name, Key={"id": {"S": "k#1"}})
    assert "Item" not in answer and answer["ResponseMetadata"]["HTTPStatusCode"] == 200


async def test_create_table_enables_ttl_on_expiration(dynamodb_client: Any) -> None:
    name = f"idem-ttl-{uuid.uuid4().hex[:8]}"  # the moto server lives for the whole session
    await create_table(dynamodb_client, name, sort_key=True)
    ttl = await dynamodb_client.describe_time_to_live(TableName=name)
    assert ttl["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED",
        "AttributeName": "expiration",
    }
    table = (await dynamodb_client.describe_table(TableName=name))["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert [key["AttributeName"] for key in table["KeySchema"]] == ["id", "sk"]


# -- errors -------------------------------------------------------------------------


async def test_missing_table_is_a_validation_error(dynamodb_client: Any) -> None:
    store = DynamoDBStore(dynamodb_client, table_name="no-such-table")
    with pytest.raises(StoreValidationError, match="ResourceNotFoundException") as caught:
        await try_claim(store, claim_for("k#1", "A"), NOW)
    assert caught.value.__cause__ is not None


class _Proxy:
    """A TCP proxy in front of moto that can forward, drop or stall connections."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.mode = "forward"
        self.lose_answers = 0
        """How many of the next answers to drop after the request reached the server."""
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def aclose(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.mode == "forward":
                await self._forward(reader, writer)
            elif self.mode == "stall":
                await reader.read()  # never answers; ends when the client gives up
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), self._answer(up_reader, writer))
        finally:
            self._writers.discard(up_writer)
            up_writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if self.lose_answers > 0:
                    # The server applied the request; its answer dies with the connection.
                    self.lose_answers -= 1
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()
            writer.write_eof()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()


@pytest.fixture
async def proxied_store(
    dynamodb_client: Any, moto_endpoint: str, transport: str
) -> AsyncIterator[tuple[DynamoDBStore, _Proxy]]:
    table = (await fresh_store(dynamodb_client)).table_name
    proxy = _Proxy(moto_endpoint)
    await proxy.start()
    async with open_transport(transport, proxy.url, fast_fail=True) as c:
        yield DynamoDBStore(c, table_name=table), proxy
    await proxy.aclose()


async def test_dropped_connection_is_unavailable_and_recovers(
    proxied_store: tuple[DynamoDBStore, _Proxy],
) -> None:
    store, proxy = proxied_store
    assert await try_claim(store, claim_for("k#1", "A"), NOW) is None
    proxy.mode = "drop"
    with pytest.raises(StoreUnavailableError, match="could not be reached") as caught:
        await get_record(store, "k#1")
    assert caught.value.__cause__ is not None
    proxy.mode = "forward"
    record = await get_record(store, "k#1")
    assert record is not None and record.owner == "A"


async def test_unanswered_request_times_out_as_unavailable(
    proxied_store: tuple[DynamoDBStore, _Proxy],
) -> None:
    store, proxy = proxied_store
    proxy.mode = "stall"
    with pytest.raises(StoreUnavailableError):
        await try_claim(store, claim_for("k#1", "A"), NOW)


async def test_refused_connection_is_unavailable(transport: str) -> None:
    with socket_port() as port:
        endpoint = f"http://127.0.0.1:{port}"
    async with open_transport(transport, endpoint, fast_fail=True) as c:
        with pytest.raises(StoreUnavailableError):
            await DynamoDBStore(c, table_name="t").get("k#1", now=NOW)


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield probe.getsockname()[1]


async def _answer_with_error(
    code: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    body = f'{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"injected"}}'
    writer.write(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode()
    )
    await writer.drain()
    writer.close()


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("ThrottlingException", StoreThrottledError),
        ("ProvisionedThroughputExceededException", StoreThrottledError),
        ("AccessDeniedException", StoreAccessDeniedError),
        ("UnrecognizedClientException", StoreAccessDeniedError),
        ("ValidationException", StoreValidationError),
        ("SomethingNewException", PersistenceError),
    ],
)
async def test_service_errors_map_to_typed_errors(
    code: str, error: type[Exception], transport: str
) -> None:
    server = await asyncio.start_server(lambda r, w: _answer_with_error(code, r, w), "127.0.0.1", 0)
    endpoint = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with open_transport(transport, endpoint, fast_fail=True) as client:
            store = DynamoDBStore(client, table_name="t")
            with pytest.raises(error, match=code) as caught:
                await complete_ok(store, completion_for("k#1", "A", 1))
    finally:
        server.close()
        await server.wait_closed()
    assert type(caught.value) is error
    assert caught.value.__cause__ is not None


# A realistic InvalidSignatureException from DynamoDB, made with temporary credentials: AWS
# quotes the canonical request and the string to sign, session token included.
_SESSION_TOKEN = "IQoJb3JpZ2luX2VjEHoaCXVzLWVhc3QtMSJHMEUCIQD" + "x" * 40
_SIGNATURE_MESSAGE = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details.\n\nThe Canonical String for this request should have been\n'POST\n/\n\n"
    "content-type:application/x-amz-json-1.0\nhost:dynamodb.eu-west-1.amazonaws.com\n"
    f"x-amz-date:20261201T182000Z\nx-amz-security-token:{_SESSION_TOKEN}\n"
    "x-amz-target:DynamoDB_20120810.GetItem\n\n"
    "content-type;host;x-amz-date;x-amz-security-token;x-amz-target\n"
    "3f1c...'\n\nThe String-to-Sign should have been\n'AWS4-HMAC-SHA256\n20261201T182000Z\n"
    "20261201/eu-west-1/dynamodb/aws4_request\n9a8b...'\n"
)


@pytest.mark.parametrize(
    "message",
    [
        _SIGNATURE_MESSAGE,
        # Without the markers to cut at: the token itself is still hidden.
        f"denied; X-Amz-Security-Token={_SESSION_TOKEN}&X-Amz-Date=20261201T182000Z",
        f"denied; x-amz-security-token: {_SESSION_TOKEN}",
    ],
)
def test_denied_errors_never_quote_the_session_token(message: str) -> None:
    from idempotency_async.stores._dynamodb_errors import ServiceError, translate_errors

    response = {"Error": {"Code": "InvalidSignatureException", "Message": message}}
    with pytest.raises(StoreAccessDeniedError) as caught, translate_errors("get", "orders"):
        raise ServiceError(response)
    shown = str(caught.value)
    assert _SESSION_TOKEN[:20] not in shown, shown
    assert "InvalidSignatureException" in shown and "'orders'" in shown
    # The light client's own exception (the cause) does not quote it either.
    assert _SESSION_TOKEN[:20] not in str(caught.value.__cause__)
    if message is _SIGNATURE_MESSAGE:
        assert "Check your AWS Secret Access Key and signing method" in shown
        assert "String-to-Sign" not in shown and "content-type" not in shown
