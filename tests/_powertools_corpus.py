"""Key corpus for ``key_format="powertools-python"``, and the keys the real package derives.

Imported by the tests and, in a subprocess, with an older aws-lambda-powertools first on
``sys.path`` (``_cli(["keys", "3.0"])`` prints the keys that version derives as JSON,
``_cli(["dynamodb", ...])`` calls a function with its DynamoDB layer).  It uses only what
Powertools 3.0 already had, and nothing of idempotency_async, so the same code drives
every version.

Keys are taken from the real decorators (``idempotent_function`` and ``@idempotent``)
through a persistence layer that keeps records in a dict: the package's whole path —
payload preparation, deep copy, prefix, JMESPath, JSON text, hash — runs unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import uuid
import warnings
from decimal import Decimal
from enum import Enum
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, field_serializer

# -- payload types ------------------------------------------------------------------------


@dataclasses.dataclass
class Line:
    sku: str
    qty: int
    price: float


@dataclasses.dataclass
class Order:
    id: str
    lines: list[Line]
    note: str | None = None
    amount: Decimal = Decimal("10.50")


class Customer(BaseModel):
    id: int
    name: str
    tags: list[str]
    balance: Decimal
    address: dict[str, str]


class Sensor(BaseModel):
    """Dumps differently in pydantic's python and JSON modes (NaN, and a JSON-only
    serializer): the key of a top-level model changed in Powertools 3.27."""

    id: str
    reading: float
    unit: str

    @field_serializer("unit", when_used="json")
    def _unit(self, unit: str) -> str:
        return unit.upper()


class Color(Enum):
    RED = "red"


# -- cases -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    payload: Any
    event_key_jmespath: str = ""
    validation_jmespath: str | None = None
    hash_function: str = "md5"
    key_prefix: str | None = None
    kind: str = "function"  # or "handler" (@idempotent on handler(event, context))
    since: tuple[int, int] = (3, 0)
    """First Powertools version that derives a key (older ones raise, or lack the option)."""


NESTED = {
    "b": {"z": [1, 2, {"y": None, "x": [[], {}]}]},
    "a": [True, False, None],
    "A": "upper",
    "10": 1,
    "2": 2,
    "": "empty key",
}
UNICODE = {
    "id": 'ü😀\u2028\t\x01"\\/',
    "Zürich": "grün",
    "лат": "кир",
    "lone": "\ud800",
    "ﬀ": "ligature",
}
FLOATS = {
    "f": [1.0, 0.1, 1e21, 1e-7, -0.0, 1.7976931348623157e308, 5e-324, 123456789.125],
    "special": [float("nan"), float("inf"), float("-inf")],
}
LARGE_INTS = {"i": [2**53 + 1, 2**64, -(2**70), 10**40, 0, -1]}
ORDER = Order("o-1", [Line("A-1", 2, 19.99), Line("B-2", 1, 0.5)], note="leave at door")
CUSTOMER = Customer(
    id=7, name="Ada", tags=["vip"], balance=Decimal("1.10"), address={"city": "Zürich"}
)
API_EVENT = {
    "body": '{"order_id": "o-9", "amount": 12.5, "order_id": "o-10"}',
    "headers": {"Idempotency-Key": "k-1"},
    "requestContext": {"requestId": "differs-per-delivery"},
}
ENCODED_EVENT = {
    # A line break inside Base64 is skipped by Powertools (base64.b64decode).
    "body": "eyJvcmRl\ncl9pZCI6ICJvLTEiLCAiYW1vdW50IjogM30=",
    "zipped": "H4sIAAAAAAACA6tWyi9KSS2Kz0xRslJQytc1UqoFALeG7MATAAAA",
}

CASES = [
    Case("nested-whole-payload", NESTED),
    Case("unicode", UNICODE),
    Case("floats", FLOATS),
    Case("large-integers", LARGE_INTS),
    Case("selection-and-validation", {"order": NESTED, "amount": 12.5}, "order", "amount"),
    Case("multi-select-list", {"id": "o-1", "customer": {"name": "Ada"}}, "[id, customer.name]"),
    Case("multi-select-hash", {"id": "o-1", "n": 3}, "{id: id, n: n}"),
    Case("powertools-json-last-member-wins", API_EVENT, "powertools_json(body).order_id"),
    Case("base64", ENCODED_EVENT, "powertools_json(powertools_base64(body)).order_id"),
    Case(
        "base64-gzip",
        ENCODED_EVENT,
        "powertools_json(powertools_base64_gzip(zipped))",
        "powertools_base64(body)",  # functions in validation selections: since 3.36
        since=(3, 36),
    ),
    Case("string", {"id": "order-1001"}, "id"),
    Case("integer", {"id": 42}, "id"),
    Case("zero-is-a-key", {"id": 0}, "id"),
    Case("false-is-a-key", {"id": False}, "id"),
    Case("float", {"id": 3.5}, "id"),
    Case("dataclass", ORDER),
    Case("dataclass-selection", ORDER, "lines[0]", "amount"),
    Case("dataclass-nested-in-dict", {"order": ORDER, "at": 1}),
    Case("pydantic", CUSTOMER),
    Case("pydantic-selection", CUSTOMER, "address", "balance"),
    Case("pydantic-nested-in-dict", {"customer": CUSTOMER}),
    Case("pydantic-python-vs-json-mode", Sensor(id="s-1", reading=float("nan"), unit="c")),
    Case("decimals", {"amount": Decimal("10.50"), "nan": Decimal("NaN"), "e": Decimal("1E+3")}),
    Case("tuples-and-int-keys", {"t": (1, (2, 3)), "m": {2: "b", 1: "a"}}),
    Case("sha256", NESTED, hash_function="sha256"),
    Case("sha3-256-validation", NESTED, "b", "a", hash_function="sha3_256"),
    Case("blake2b", UNICODE, hash_function="blake2b"),
    Case("missing-none", {"id": None}, "id"),
    Case("missing-empty-string", {"id": ""}, "id"),
    Case("missing-empty-list", {"id": []}, "id"),
    Case("missing-all-none-multi-select-list", {"x": 1}, "[a, b]"),
    Case("all-none-multi-select-hash", {"x": 1}, "{a: a, b: b}"),
    Case("handler-whole-event", API_EVENT, kind="handler"),
    Case("handler-selection", API_EVENT, 'headers."Idempotency-Key"', "body", kind="handler"),
    Case("key-prefix", {"id": "o-1"}, "id", key_prefix="orders", since=(3, 5)),
    Case("handler-key-prefix", API_EVENT, "body", key_prefix="api", kind="handler", since=(3, 5)),
    Case(
        "enum-date-uuid-path",
        {
            "color": Color.RED,
            "day": dt.date(2026, 11, 30),
            "at": dt.datetime(2026, 11, 30, 12, 0, 5, 123, tzinfo=dt.UTC),
            "time": dt.time(23, 59),
            "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "path": PurePosixPath("/tmp/x"),
        },
        since=(3, 36),
    ),
]

# Cases whose key changed inside 3.x: the key of 3.0 differs from the latest one.
CHANGED_IN_3X = {"pydantic-python-vs-json-mode", "all-none-multi-select-hash"}

RESPONSE = {"ok": True, "n": 1}


# -- the real package ---------------------------------------------------------------------


def process_order(order: Any) -> dict[str, Any]:
    return dict(RESPONSE)


def handler(event: Any, context: Any) -> dict[str, Any]:
    return dict(RESPONSE)


class LambdaContext:
    """The attributes of a Lambda context that Powertools reads."""

    function_name = "test-func"
    aws_request_id = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def powertools_keys(case: Case) -> tuple[str, str] | None:
    """(key, validation hash) the installed Powertools writes for ``case``, or None when it
    finds no key (validation hash ``""`` when validation is off)."""
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyItemNotFoundError,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.base import (
        BasePersistenceLayer,
    )

    class DictLayer(BasePersistenceLayer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.items: dict[str, Any] = {}

        def _get_record(self, idempotency_key: str) -> Any:
            raise IdempotencyItemNotFoundError

        def _put_record(self, data_record: Any) -> None:
            self.items[data_record.idempotency_key] = data_record

        def _update_record(self, data_record: Any) -> None:
            self.items[data_record.idempotency_key] = data_record

        def _delete_record(self, data_record: Any) -> None:
            self.items.pop(data_record.idempotency_key, None)

    layer = DictLayer()
    config = IdempotencyConfig(
        event_key_jmespath=case.event_key_jmespath,
        payload_validation_jmespath=case.validation_jmespath,
        hash_function=case.hash_function,
    )
    options: dict[str, Any] = {"persistence_store": layer, "config": config}
    if case.key_prefix is not None:
        options["key_prefix"] = case.key_prefix
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no idempotency key", "no Lambda context"
        if case.kind == "handler":
            idempotent(handler, **options)(case.payload, LambdaContext())
        else:
            idempotent_function(process_order, data_keyword_argument="order", **options)(
                order=case.payload
            )
    if not layer.items:
        return None
    ((key, record),) = layer.items.items()
    return key, record.payload_hash


def dynamodb_call(
    endpoint: str, table: str, order: Any, response: Any, *, may_run: bool
) -> dict[str, Any]:
    """Call an ``idempotent_function`` keyed on ``id`` with Powertools' DynamoDB layer, as
    ``process_order`` (key prefix ``test-func._powertools_corpus.process_order``)."""
    import boto3
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        aws_session_token="testing",
    )
    return _call(
        DynamoDBPersistenceLayer(table_name=table, boto3_client=client),
        order,
        response,
        may_run=may_run,
    )


def _call(layer: Any, order: Any, response: Any, *, may_run: bool) -> dict[str, Any]:
    import functools

    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

    ran = []

    def body(order: Any) -> Any:
        ran.append(True)
        if not may_run:
            raise AssertionError("the Powertools function ran: the record was not replayed")
        return response

    functools.update_wrapper(body, process_order)
    decorated = idempotent_function(
        body,
        data_keyword_argument="order",
        persistence_store=layer,
        config=IdempotencyConfig(event_key_jmespath="id"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = decorated(order=order)
    return {"result": result, "ran": bool(ran)}


def redis_call(
    port: int, database: int, order: Any, response: Any, may_run: bool
) -> dict[str, Any]:
    """:func:`dynamodb_call` with Powertools' Redis layer on a local redis-server."""
    import redis
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    client = redis.Redis(host="127.0.0.1", port=port, db=database, decode_responses=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = RedisCachePersistenceLayer(client=client)
    try:
        return _call(layer, order, response, may_run=may_run)
    finally:
        client.close()


def _cli(argv: list[str]) -> None:
    """``keys <major.minor>``, ``dynamodb <endpoint> <table> <order> <response> <may_run>``
    or ``redis <port> <db> <order> <response> <may_run>`` (JSON arguments); prints JSON."""
    if argv[0] == "keys":
        major, minor = argv[1].split(".")[:2]
        version = (int(major), int(minor))
        keys = {case.name: powertools_keys(case) for case in CASES if case.since <= version}
        json.dump(keys, sys.stdout)
    elif argv[0] == "redis":
        port, database, order, response, may_run = argv[1:]
        outcome = redis_call(
            int(port), int(database), json.loads(order), json.loads(response), may_run == "yes"
        )
        json.dump(outcome, sys.stdout)
    else:
        endpoint, table, order, response, may_run = argv[1:]
        outcome = dynamodb_call(
            endpoint, table, json.loads(order), json.loads(response), may_run=may_run == "yes"
        )
        json.dump(outcome, sys.stdout)
