"""A DynamoDB record store on an aioboto3 / aiobotocore client.

Items use the TypeScript port's layout (``id``, ``status``, ``expiration``,
``in_progress_expiration``, ``data``, ``validation``) plus two attributes of our own:
``owner`` (the claim's token, which fences completion and release) and ``data_format``
(absent when ``data`` holds the response as native AttributeValues). With
``record_format="powertools-python"`` the response is JSON text in ``data``, as
aws-lambda-powertools (Python) writes and reads it. See ``docs/dynamodb.md`` for the full
item layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Self

from idempotency_async.errors import (
    ConfigError,
    InconsistentStateError,
    StoreUnavailableError,
    StoreValidationError,
)
from idempotency_async.record import Claim, Completion, Record, Status, expiration_for
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores._dynamodb_errors import (
    ConditionFailed,
    is_invalid_value,
    is_item_too_large,
    translate_errors,
)
from idempotency_async.stores._dynamodb_forms import Data, ResponseForms
from idempotency_async.stores._dynamodb_items import (
    NEVER,
    ItemReader,
    check_attribute_names,
    default_static_pk,
)
from idempotency_async.stores._dynamodb_values import FORMAT_NOT_STORED, number_text
from idempotency_async.stores._record_formats import (
    POWERTOOLS_PYTHON,
    RecordFormat,
    check_record_format,
)
from idempotency_async.stores.base import CLAIMED, Extended, Verdict, Written, judge

if TYPE_CHECKING:
    from idempotency_async.stores._dynamodb_tables import create_table

__all__ = ["DEFAULT_DYNAMODB_MAX_RESPONSE_BYTES", "DynamoDBStore", "RecordPage", "create_table"]

logger = logging.getLogger("idempotency_async.dynamodb")

ClientFactory = Callable[[], AbstractAsyncContextManager[Any]]

DEFAULT_DYNAMODB_MAX_RESPONSE_BYTES: Final = 2_000_000
"""Larger than the 400 KB item limit on purpose: responses above it are stored compressed."""

# Free means: no record, an expired record, or an INPROGRESS record whose lease ended
# (see the timeline in idempotency_async.record) — the TypeScript port's condition, word
# for word, so both ports claim a key under one rule — or an INPROGRESS record carrying
# this claim's owner token: the SDK resent a claim whose answer was lost, and the record
# it meets is its own.
# A renewal applies to its owner's in-progress record, and never moves its lease end back.
_EXTEND_CONDITION: Final = (
    "#owner = :owner AND #status = :inprogress AND "
    "(attribute_not_exists(#in_progress_expiry) OR #in_progress_expiry <= :lease_end)"
)
# A completion without a response applies to its owner's record unless that record is
# completed with a response (``status`` is set to COMPLETED as ``:status``; a record
# without a response carries the not-stored marker in its format attribute).
_BARE_COMPLETION_CONDITION: Final = (
    "#owner = :owner AND (#status <> :status OR begins_with(#format, :not_stored))"
)
_CLAIM_CONDITION: Final = (
    "attribute_not_exists(#id) OR #expiry < :now OR "
    "(#status = :inprogress AND attribute_exists(#in_progress_expiry) "
    "AND #in_progress_expiry < :now_in_millis) OR "
    "(#status = :inprogress AND #owner = :owner)"
)


# The operations whose requests carry a condition (the others never fail one).
_CONDITIONAL: Final = frozenset({"claim", "complete", "release", "extend", "release exactly"})


class RecordPage(NamedTuple):
    """One page of :meth:`DynamoDBStore.pages`: the records it matched, the items it read,
    and the errors of matched items that could not be read (foreign or damaged records;
    each names its key, so an operator can delete it)."""

    records: list[Record]
    scanned: int
    unreadable: tuple[InconsistentStateError, ...] = ()


class DynamoDBStore:
    """Keeps idempotency records in a DynamoDB table.

    Pass either a ready ``client`` (an aioboto3 / aiobotocore DynamoDB client that the
    caller opens and closes) or a ``client_factory``: a zero-argument callable returning
    an async context manager that yields a client, such as
    ``lambda: session.client("dynamodb")``.  With a factory the store opens the client on
    first use, owns it, and closes it in :meth:`aclose` (or at the end of
    ``async with store:``).  A closed store cannot be reopened.

    Claims are one conditional ``PutItem`` that returns the blocking record on conflict;
    completion and release are conditional on the claim's owner token; reads are strongly
    consistent.  The store never reads a clock and never loads AWS configuration.

    With ``sort_key_attr`` set, the partition key holds ``static_pk_value`` (default
    ``idempotency#<AWS_LAMBDA_FUNCTION_NAME>``) and the sort key holds the record's key.

    ``record_format="powertools-python"`` reads and writes the records of
    aws-lambda-powertools (Python): the response is JSON text in ``data`` (never
    compressed: a response that does not fit is not stored).  Use it with
    ``Options(key_format="powertools-python")``.
    """

    def __init__(
        self,
        client: Any = None,
        *,
        table_name: str,
        client_factory: ClientFactory | None = None,
        key_attr: str = "id",
        status_attr: str = "status",
        expiry_attr: str = "expiration",
        in_progress_expiry_attr: str = "in_progress_expiration",
        data_attr: str = "data",
        validation_attr: str = "validation",
        owner_attr: str = "owner",
        data_format_attr: str = "data_format",
        sort_key_attr: str | None = None,
        static_pk_value: str | None = None,
        max_response_bytes: int = DEFAULT_DYNAMODB_MAX_RESPONSE_BYTES,
        record_format: RecordFormat = "typescript",
    ) -> None:
        if (client is None) == (client_factory is None):
            raise ConfigError(
                "DynamoDBStore needs exactly one of client= (a client you open and close) "
                "or client_factory= (a callable the store uses to open its own client)"
            )
        if not table_name:
            raise ConfigError("DynamoDBStore needs a table_name")
        if max_response_bytes <= 0:
            raise ConfigError(f"max_response_bytes must be positive, got {max_response_bytes}")
        check_attribute_names(
            key_attr=key_attr,
            sort_key_attr=sort_key_attr,
            status_attr=status_attr,
            expiry_attr=expiry_attr,
            in_progress_expiry_attr=in_progress_expiry_attr,
            data_attr=data_attr,
            validation_attr=validation_attr,
            owner_attr=owner_attr,
            data_format_attr=data_format_attr,
        )
        self.record_format = check_record_format(record_format)
        python = self.record_format == POWERTOOLS_PYTHON
        self.max_response_bytes = max_response_bytes
        self.table_name = table_name
        self._client = client
        self._client_factory = client_factory
        self._exit_stack = AsyncExitStack()
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._key_attr = key_attr
        self._sort_key_attr = sort_key_attr
        self._static_pk_value = static_pk_value or default_static_pk(strip=not python)
        self._status_attr = status_attr
        self._expiry_attr = expiry_attr
        self._in_progress_expiry_attr = in_progress_expiry_attr
        self._data_attr = data_attr
        self._validation_attr = validation_attr
        self._owner_attr = owner_attr
        self._data_format_attr = data_format_attr
        self._items = ItemReader(
            table_name=table_name,
            key_attr=key_attr,
            sort_key_attr=sort_key_attr,
            static_pk_value=self._static_pk_value,
            status_attr=status_attr,
            expiry_attr=expiry_attr,
            in_progress_expiry_attr=in_progress_expiry_attr,
            data_attr=data_attr,
            validation_attr=validation_attr,
            owner_attr=owner_attr,
            data_format_attr=data_format_attr,
            python=python,
            max_response_bytes=max_response_bytes,
        )
        self._forms = ResponseForms(
            python=python,
            names=(
                key_attr,
                sort_key_attr or "",
                status_attr,
                expiry_attr,
                owner_attr,
                self._static_pk_value,
                in_progress_expiry_attr,
                validation_attr,
                data_attr,
                data_format_attr,
            ),
        )

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._get_client()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if the store opened it; the store refuses use afterwards."""
        self._closed = True
        async with self._open_lock:
            await self._exit_stack.aclose()

    async def _get_client(self) -> Any:
        if self._closed:
            raise closed_error("DynamoDBStore")
        if self._client is not None:
            return self._client
        async with self._open_lock:
            # Concurrent first uses wait here; only the first one opens a client.
            if self._client is None and not self._closed:
                assert self._client_factory is not None
                with translate_errors("open the client", self.table_name):
                    self._client = await self._exit_stack.enter_async_context(
                        self._client_factory()
                    )
        # aclose() may have run while this task waited for the lock.
        return await self._get_client()

    @contextlib.asynccontextmanager
    async def _call(self, operation: str) -> AsyncIterator[Any]:
        client = await self._get_client()
        try:
            with translate_errors(operation, self.table_name):
                yield client
        except ConditionFailed as exc:
            if operation in _CONDITIONAL:
                raise
            # An answer to a request without a condition: not DynamoDB's.
            raise StoreUnavailableError(
                f"the endpoint answered a {operation} on table {self.table_name!r} with a "
                "failed condition the request did not set: check that the client's endpoint "
                "is DynamoDB"
            ) from exc

    # -- Store protocol -------------------------------------------------------------

    async def claim(self, claim: Claim) -> Verdict:
        now = claim.now
        item = {
            **self._key(claim.key),
            self._status_attr: {"S": Status.INPROGRESS.value},
            self._expiry_attr: {"N": str(expiration_for(now, claim.ttl, claim.lease))},
            self._in_progress_expiry_attr: {"N": str(math.ceil((now + claim.lease) * 1000))},
            self._owner_attr: {"S": claim.owner},
        }
        if claim.validation is not None:
            item[self._validation_attr] = {"S": claim.validation}
        try:
            async with self._call("claim") as client:
                answer = await client.put_item(
                    TableName=self.table_name,
                    Item=item,
                    ConditionExpression=_CLAIM_CONDITION,
                    ExpressionAttributeNames={
                        "#id": self._key_attr,
                        "#expiry": self._expiry_attr,
                        "#status": self._status_attr,
                        "#in_progress_expiry": self._in_progress_expiry_attr,
                        "#owner": self._owner_attr,
                    },
                    ExpressionAttributeValues={
                        ":now": {"N": number_text(now)},
                        ":now_in_millis": {"N": number_text(now * 1000)},
                        ":inprogress": {"S": Status.INPROGRESS.value},
                        ":owner": {"S": claim.owner},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    # DynamoDB's report of the capacity the write consumed is the explicit
                    # confirmation that it applied: an answer without it is not trusted.
                    ReturnConsumedCapacity="TOTAL",
                )
        except ConditionFailed as failed:
            if failed.item is None:
                return judge(None, now)  # raced with a delete: claimable
            return judge(self._items.read(failed.item, claim.key), now)
        if not isinstance(answer, Mapping) or "ConsumedCapacity" not in answer:
            raise StoreUnavailableError(
                f"the endpoint answered a claim on table {self.table_name!r} without "
                "DynamoDB's confirmation (no ConsumedCapacity): check that endpoint_url points "
                "at DynamoDB; the callback was not run"
            )
        return CLAIMED

    async def get(self, key: str, *, now: float) -> Verdict:
        async with self._call("get") as client:
            response = await client.get_item(
                TableName=self.table_name, Key=self._key(key), ConsistentRead=True
            )
        item = response.get("Item")
        return judge(None if item is None else self._items.read(item, key), now)

    async def complete(self, completion: Completion) -> Written:
        data = await self._forms.prepare(completion)
        while True:
            try:
                written = await self._write_completion(completion, data)
            except StoreValidationError as exc:
                if data.value is None:
                    raise
                if is_item_too_large(exc):
                    # DynamoDB counted more bytes than the estimate.  The side effect has
                    # happened, so try a smaller form, down to no response at all.
                    data = await self._forms.smaller(completion, data)
                    continue
                if not is_invalid_value(exc):
                    raise
                # DynamoDB refused a value of the response that the encoder took for one
                # it holds.  The side effect has happened: complete without the response
                # (a refusal that is not about the response fails again, and is raised).
                data = self._forms.refused(completion, exc)
                continue
            return written

    async def release(self, key: str, owner: str) -> bool:
        try:
            async with self._call("release") as client:
                await client.delete_item(
                    TableName=self.table_name,
                    Key=self._key(key),
                    ConditionExpression="attribute_not_exists(#id) OR #owner = :owner",
                    ExpressionAttributeNames={"#id": self._key_attr, "#owner": self._owner_attr},
                    ExpressionAttributeValues={":owner": {"S": owner}},
                )
        except ConditionFailed:
            return False
        return True

    async def extend(self, claim: Claim) -> Extended:
        now = claim.now
        lease_end = math.ceil((now + claim.lease) * 1000)
        try:
            async with self._call("extend") as client:
                await client.update_item(
                    TableName=self.table_name,
                    Key=self._key(claim.key),
                    UpdateExpression="SET #expiry = :expiry, #in_progress_expiry = :lease_end",
                    ConditionExpression=_EXTEND_CONDITION,
                    ExpressionAttributeNames={
                        "#expiry": self._expiry_attr,
                        "#in_progress_expiry": self._in_progress_expiry_attr,
                        "#owner": self._owner_attr,
                        "#status": self._status_attr,
                    },
                    ExpressionAttributeValues={
                        ":expiry": {"N": str(expiration_for(now, claim.ttl, claim.lease))},
                        ":lease_end": {"N": str(lease_end)},
                        ":owner": {"S": claim.owner},
                        ":inprogress": {"S": Status.INPROGRESS.value},
                    },
                    # The record that failed the condition, read in the same step: the
                    # owner's (its lease ends later) or another's.
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
        except ConditionFailed as failed:
            return self._items.not_extended(failed.item, claim.owner, lease_end)
        return Extended.RENEWED

    async def force_release(self, key: str) -> Record | None:
        async with self._call("force release") as client:
            answer = await client.delete_item(
                TableName=self.table_name, Key=self._key(key), ReturnValues="ALL_OLD"
            )
        item = answer.get("Attributes")
        if not item:
            return None
        try:
            return self._items.read(item, key)
        except InconsistentStateError as exc:
            raise InconsistentStateError(
                f"the record was deleted, but it could not be read: {exc}"
            ) from exc.__cause__

    async def release_exactly(self, record: Record) -> bool:
        """Delete the record of ``record.key`` only if it is still ``record``: the same
        owner, status, expiry and lease end (what ``idempotency-async release`` showed the
        operator; instants compared as this store reads them, rounded up).  False, deleting
        nothing, when the key holds another record or none.  One conditional DeleteItem."""
        names = {"#id": self._key_attr, "#status": self._status_attr}
        values: dict[str, Any] = {":status": {"S": record.status.value}}
        conditions = ["attribute_exists(#id)", "#status = :status"]
        for name, attribute, value in (
            ("owner", self._owner_attr, record.owner),
            (
                "expiry",
                self._expiry_attr,
                None if record.expiration >= NEVER else record.expiration,
            ),
            (
                "lease",
                self._in_progress_expiry_attr,
                None if record.lease_end is None else round(record.lease_end * 1000),
            ),
        ):
            names[f"#{name}"] = attribute
            if value is None:
                conditions.append(f"attribute_not_exists(#{name})")
            elif isinstance(value, str):
                conditions.append(f"#{name} = :{name}")
                values[f":{name}"] = {"S": value}
            else:
                # Read as ceil(value): the instants in (value - 1, value] read the same.
                conditions.append(f"#{name} > :{name}_below AND #{name} <= :{name}")
                values[f":{name}"] = {"N": str(value)}
                values[f":{name}_below"] = {"N": str(value - 1)}
        try:
            async with self._call("release exactly") as client:
                await client.delete_item(
                    TableName=self.table_name,
                    Key=self._key(record.key),
                    ConditionExpression=" AND ".join(conditions),
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                )
        except ConditionFailed:
            return False
        return True

    # -- operators ------------------------------------------------------------------

    async def pages(
        self, *, status: Status | None = None, page_size: int | None = None
    ) -> AsyncGenerator[RecordPage, None]:
        """The table's records page by page, optionally only those with ``status``.

        A ``Query`` on the static partition in sort-key mode, a ``Scan`` of the whole table
        otherwise: meant for operators, not for the request path.  Expired records that
        DynamoDB's TTL has not deleted yet are included.  ``page_size`` caps the items read
        per request (DynamoDB's ``Limit``; default: 1 MB pages).
        """
        # Eventually consistent: half the read capacity of a strongly consistent scan, and
        # a listing is a snapshot anyway (``get`` reads one record strongly).
        request: dict[str, Any] = {"TableName": self.table_name}
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        if self._sort_key_attr is not None:
            request["KeyConditionExpression"] = "#pk = :pk"
            names["#pk"] = self._key_attr
            values[":pk"] = {"S": self._static_pk_value}
        if status is not None:
            request["FilterExpression"] = "#status = :status"
            names["#status"] = self._status_attr
            values[":status"] = {"S": Status(status).value}
        if names:
            request["ExpressionAttributeNames"] = names
            request["ExpressionAttributeValues"] = values
        if page_size is not None:
            request["Limit"] = page_size
        operation = "scan" if self._sort_key_attr is None else "query"
        while True:
            async with self._call(operation) as client:
                answer = await getattr(client, operation)(**request)
            items = answer.get("Items", [])
            if not isinstance(items, list):
                raise StoreUnavailableError(
                    f"the endpoint answered a {operation} of table {self.table_name!r} without "
                    "an item list: check that the client's endpoint is DynamoDB"
                )
            records, unreadable = [], []
            for item in items:
                try:
                    records.append(self._items.read(item))
                except InconsistentStateError as exc:
                    logger.warning("%s", exc)
                    unreadable.append(exc)
            scanned = answer.get("ScannedCount")
            if isinstance(scanned, bool) or not isinstance(scanned, int):
                scanned = len(records) + len(unreadable)
            yield RecordPage(records, scanned, tuple(unreadable))
            last = answer.get("LastEvaluatedKey")
            if not last:
                return
            request["ExclusiveStartKey"] = last

    # -- completion -----------------------------------------------------------------

    async def _write_completion(self, completion: Completion, data: Data) -> Written:
        fields: dict[str, tuple[str, dict[str, Any]]] = {
            "status": (self._status_attr, {"S": Status.COMPLETED.value}),
            "expiry": (
                self._expiry_attr,
                {"N": str(expiration_for(completion.now, completion.ttl, 0.0))},
            ),
        }
        if data.value is not None:
            fields["data"] = (self._data_attr, data.value)
        if data.format is not None:
            fields["format"] = (self._data_format_attr, {"S": data.format})
        if completion.validation is not None:
            fields["validation"] = (self._validation_attr, {"S": completion.validation})
        # A completion may follow an earlier one of the same owner (a retried write, or a
        # response attached later): remove what this one does not set.
        removed = {"lease": self._in_progress_expiry_attr}
        if data.value is None:
            removed["data"] = self._data_attr
        if data.format is None:
            removed["format"] = self._data_format_attr
        names = {f"#{name}": attribute for name, (attribute, _) in fields.items()}
        names.update({f"#{name}": attribute for name, attribute in removed.items()})
        names["#owner"] = self._owner_attr
        values = {f":{name}": value for name, (_, value) in fields.items()}
        values[":owner"] = {"S": completion.owner}
        expression = "SET " + ", ".join(f"#{name} = :{name}" for name in fields)
        expression += " REMOVE " + ", ".join(f"#{name}" for name in removed)
        request: dict[str, Any] = {"ConditionExpression": "#owner = :owner"}
        if data.value is None:
            # The owner's response is final: a completion without one (the first of a
            # stream, resent after its answer was lost) never replaces it.  The record
            # that refused it comes back in the same step, to tell kept from fenced.
            request["ConditionExpression"] = _BARE_COMPLETION_CONDITION
            request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            values[":not_stored"] = {"S": FORMAT_NOT_STORED}
        try:
            async with self._call("complete") as client:
                await client.update_item(
                    TableName=self.table_name,
                    Key=self._key(completion.key),
                    UpdateExpression=expression,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    **request,
                )
        except ConditionFailed as failed:
            if data.value is None and self._holds_response(failed.item, completion.owner):
                return Written.RESPONSE  # kept as it was
            return Written.NOTHING
        return Written.WITHOUT_RESPONSE if data.value is None else Written.RESPONSE

    def _holds_response(self, item: Mapping[str, Any] | None, owner: str) -> bool:
        """Whether ``item`` is ``owner``'s record completed with a response."""
        if (
            not isinstance(item, Mapping)
            or item.get(self._owner_attr) != {"S": owner}
            or item.get(self._status_attr) != {"S": Status.COMPLETED.value}
        ):
            return False
        marker = item.get(self._data_format_attr)
        text = marker.get("S") if isinstance(marker, Mapping) else None
        return not (isinstance(text, str) and text.startswith(FORMAT_NOT_STORED))

    # -- items ----------------------------------------------------------------------

    def _key(self, key: str) -> dict[str, Any]:
        if self._sort_key_attr is None:
            return {self._key_attr: {"S": key}}
        return {self._key_attr: {"S": self._static_pk_value}, self._sort_key_attr: {"S": key}}


def __getattr__(name: str) -> Any:
    # create_table is for tests, examples and operators: a Lambda's cold start, which
    # imports this module, does not load it.
    if name == "create_table":
        from idempotency_async.stores._dynamodb_tables import create_table

        return create_table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
