"""The event sources a batch can come from: how each names, decodes and orders its records.

SQS (standard and FIFO), Kinesis and DynamoDB streams.  Everything here reads the event
before any record runs, and raises :class:`~idempotency_async.errors.BatchEventError` for
an event that is not a batch Lambda delivered.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idempotency_async._json import loads_strict
from idempotency_async.canonical import canonical_json
from idempotency_async.errors import BatchEventError, ConfigError, PayloadError

__all__ = ["EventType", "Source", "parse_event_type", "records_of", "source_of"]


class EventType(enum.StrEnum):
    """The kind of batch :func:`~idempotency_async.integrations.aws_lambda.process_batch`
    expects (the names of Powertools' ``EventType``)."""

    SQS = "SQS"
    KinesisDataStreams = "KinesisDataStreams"
    DynamoDBStreams = "DynamoDBStreams"


@dataclass(frozen=True, slots=True)
class Source:
    """How one event source names, decodes and orders its records."""

    name: str
    event_source: str
    stable_id: str
    """JMESPath of the field that stays the same on every redelivery (the default key)."""
    id_path: tuple[str, ...]
    """Where the identifier ``batchItemFailures`` names the record by is."""
    decode: Callable[[Mapping[str, Any]], dict[str, Any]]
    ordering: Callable[[Mapping[str, Any]], str | None] | None
    """The ordering group of a record (``None``: unknown, the record fails on its own);
    ``ordering`` itself is ``None`` when records are independent."""
    group_field: str = ""

    def identifier(self, record: Mapping[str, Any]) -> str | None:
        value = _dig(record, *self.id_path)
        return value if isinstance(value, str) and value else None


def _dig(record: Mapping[str, Any], *path: str) -> Any:
    """The value at ``path`` in nested objects, or None where anything is missing."""
    value: Any = record
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value


def _sqs_decode(record: Mapping[str, Any]) -> dict[str, Any]:
    return {**record, "body": _json_or_text(record["body"])}


def _kinesis_decode(record: Mapping[str, Any]) -> dict[str, Any]:
    kinesis = record["kinesis"]
    data = kinesis["data"]
    try:
        text = base64.b64decode(data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return dict(record)  # binary data: keys select from the Base64 text
    return {**record, "kinesis": {**kinesis, "data": _json_or_text(text)}}


def _json_or_text(text: str) -> Any:
    """Parsed JSON, or the text itself when it is not JSON (plain-text messages)."""
    try:
        return loads_strict(text)
    except PayloadError as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError):
            return text  # not JSON at all
        raise  # JSON with duplicate members (or NaN), or nested too deeply: the record fails


def _text_at(*path: str) -> Callable[[Mapping[str, Any]], str | None]:
    def group(record: Mapping[str, Any]) -> str | None:
        value = _dig(record, *path)
        return value if isinstance(value, str) else None

    return group


def _dynamodb_partition(record: Mapping[str, Any]) -> str | None:
    keys = _dig(record, "dynamodb", "Keys")
    return canonical_json(keys) if isinstance(keys, Mapping) and keys else None


_SQS = Source("SQS", "aws:sqs", "messageId", ("messageId",), _sqs_decode, None)
_SQS_FIFO = dataclasses.replace(
    _SQS,
    name="SQS FIFO",
    ordering=_text_at("attributes", "MessageGroupId"),
    group_field="attributes.MessageGroupId",
)
_KINESIS = Source(
    "Kinesis",
    "aws:kinesis",
    "eventID",
    ("kinesis", "sequenceNumber"),
    _kinesis_decode,
    _text_at("kinesis", "partitionKey"),
    "kinesis.partitionKey",
)
_DYNAMODB = Source(
    "DynamoDB stream",
    "aws:dynamodb",
    "eventID",
    ("dynamodb", "SequenceNumber"),
    dict,
    _dynamodb_partition,
    "dynamodb.Keys",
)
_BY_TYPE = {
    EventType.SQS: _SQS,
    EventType.KinesisDataStreams: _KINESIS,
    EventType.DynamoDBStreams: _DYNAMODB,
}


def parse_event_type(value: EventType | str | None) -> EventType | None:
    if value is None or isinstance(value, EventType):
        return value
    try:
        return EventType(value)
    except ValueError:
        names = ", ".join(repr(member.value) for member in EventType)
        raise ConfigError(f"event_type must be one of {names}, got {value!r}") from None


def records_of(event: object) -> list[Mapping[str, Any]]:
    records = event.get("Records") if isinstance(event, Mapping) else None
    if not isinstance(records, list):
        what = (
            f"an object with the keys {sorted(map(str, event))[:8]}"
            if isinstance(event, Mapping)
            else f"a {type(event).__name__}"
        )
        raise BatchEventError(
            "process_batch needs an SQS, Kinesis or DynamoDB stream event, an object whose "
            f"'Records' is a list; it got {what}. Check the function's trigger, and pass "
            "the event Lambda gave the handler unchanged"
        )
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise BatchEventError(
                f"record {index} of the batch is a {type(record).__name__}, not an object: "
                "the batch is not one Lambda delivered, and the broken record cannot be "
                "reported on its own"
            )
    return records


def source_of(records: list[Mapping[str, Any]], event_type: EventType | None) -> Source:
    sources = {record.get("eventSource") for record in records}
    if event_type is not None:
        expected = _BY_TYPE[event_type]
        if sources != {expected.event_source}:
            raise BatchEventError(
                f"process_batch(event_type={event_type.value!r}) expects records whose "
                f"eventSource is {expected.event_source!r}, got {sorted(map(str, sources))}: "
                "check the function's trigger"
            )
    if len(sources) != 1:
        raise BatchEventError(
            f"a batch holds records of one event source, got {sorted(map(str, sources))}"
        )
    (event_source,) = sources
    if event_source == "aws:sqs":
        fifo = str(records[0].get("eventSourceARN", "")).endswith(".fifo")
        return _SQS_FIFO if fifo else _SQS
    if event_source == "aws:kinesis":
        return _KINESIS
    if event_source == "aws:dynamodb":
        return _DYNAMODB
    raise BatchEventError(
        f"process_batch handles SQS, Kinesis and DynamoDB stream events, not {event_source!r}"
    )
