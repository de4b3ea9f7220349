"""A DynamoDB record store on an aioboto3 / aiobotocore client.

Items use the TypeScript port's layout (``id``, ``status``, ``expiration``,
``in_progress_expiration``, ``data``, ``validation``) plus attributes of our own:
``owner`` (the claim's token, which fences completion and release), ``data_format``
(absent when ``data`` holds the response as native AttributeValues), and ``steps`` and
``step_count`` (the recovery points of an in-progress call, when it took steps). With
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
from idempotency_async.stores._dynamodb_values import (
    FORMAT_NOT_STORED,
    number_text,
    steps_attribute,
)
from idempotency_async.stores._record_formats import (
    POWERTOOLS_PYTHON,
    RecordFormat,
    check_record_format,
)
from idempotency_async.stores.base import (
    CLAIMED,
    Extended,
    Found,
    Stepped,
    StepWrite,
    Verdict,
    Written,
    judge,
)

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
# A claim never replaces an unexpired item carrying steps (recovery points): PutItem would
# drop them.  Such an item fails the condition and comes back (ALL_OLD); the store then
# takes it over with _TAKEOVER_CONDITION, keeping its steps, or answers RESUMABLE.
_CLAIM_CONDITION: Final = (
    "attribute_not_exists(#id) OR #expiry < :now OR "
    "(#status = :inprogress AND attribute_exists(#in_progress_expiry) "
    "AND #in_progress_expiry < :now_in_millis AND attribute_not_exists(#steps)) OR "
    "(#status = :inprogress AND #owner = :owner AND attribute_not_exists(#steps))"
)
# The takeover of an unexpired INPROGRESS item carrying steps: lapsed (or released, whose
# lease ended when it was released), or this claim's own (sent again); the validation hash
# is checked in the same condition (appended).  Whatever steps the item holds when it
# applies come back (ALL_NEW): a lapsed holder may still have recorded one in between.
_TAKEOVER_CONDITION: Final = (
    "#status = :inprogress AND #expiry >= :now AND attribute_exists(#steps) AND "
    "((attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis) "
    "OR #owner = :owner)"
)
# A release deletes its owner's record, unless it carries steps: those are kept (below).
_RELEASE_CONDITION: Final = (
    "attribute_not_exists(#id) OR (#owner = :owner AND attribute_not_exists(#steps))"
)
# The released state: no owner, the lease long ended (epoch + 1 s, as MemoryStore writes
# it: the store reads no clock, and any past instant reads as a lapsed claim to every
# reader, the TypeScript and Python ports included), steps, validation and expiry kept.
_RELEASED_LEASE_END: Final = "1000"
_RELEASED_CONDITION: Final = "#owner = :owner AND #status = :inprogress"
# A step write applies to its owner's in-progress record holding ``position`` steps, or
# holding this very list already (the write, sent again).  It moves the expiry forward
# only: the first attempt's condition adds _STEP_EXPIRY_GUARD, and one refused by that
# guard alone is sent again without moving the expiry.
_STEP_CONDITION: Final = "#owner = :owner AND #status = :inprogress AND ({} OR #steps = :steps)"
_STEP_EXPIRY_GUARD: Final = (
    " AND #expiry <= :expiry AND "
    "(attribute_not_exists(#in_progress_expiry) OR #in_progress_expiry <= :expiry_millis)"
)


# The operations whose requests carry a condition (the others never fail one).
_CONDITIONAL: Final = frozenset(
    {
        "claim",
        "take over",
        "complete",
        "release",
        "keep progress",
        "extend",
        "record step",
        "release exactly",
    }
)


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
    consistent.  It records steps (recovery points,
    :class:`~idempotency_async.stores.base.RecordsSteps`): one ``UpdateItem`` per step; a
    claim that resumes a record carrying steps, and a release that keeps them, take a
    second request (``UpdateItem``) after the first one met them.  The store never reads a
    clock and never loads AWS configuration.

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
        steps_attr: str = "steps",
        step_count_attr: str = "step_count",
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
            steps_attr=steps_attr,
            step_count_attr=step_count_attr,
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
        self._steps_attr = steps_attr
        self._step_count_attr = step_count_attr
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
            steps_attr=steps_attr,
            step_count_attr=step_count_attr,
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
                steps_attr,
                step_count_attr,
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
                        "#steps": self._steps_attr,
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
            record = self._items.read(failed.item, claim.key)
            if record.steps is None:
                return judge(record, now)
            return await self._take_over(claim, record)
        if not isinstance(answer, Mapping) or "ConsumedCapacity" not in answer:
            raise StoreUnavailableError(
                f"the endpoint answered a claim on table {self.table_name!r} without "
                "DynamoDB's confirmation (no ConsumedCapacity): check that endpoint_url points "
                "at DynamoDB; the callback was not run"
            )
        return CLAIMED

    async def _take_over(self, claim: Claim, record: Record) -> Verdict:
        """The claim met ``record``, an item carrying steps: take it over keeping them
        (a second request, ``UpdateItem``), answer that it is another payload's progress
        (``RESUMABLE``, nothing written), or judge it as any blocking record."""
        now = claim.now
        if record.owner != claim.owner or record.expiration < now:
            verdict = judge(record, now)
            if verdict.found is not Found.CLAIMABLE or record.expiration < now:
                return verdict  # held by another, or expired since: claim again
        if record.validation != claim.validation:
            return Verdict(Found.RESUMABLE, record)
        names = {
            "#status": self._status_attr,
            "#expiry": self._expiry_attr,
            "#in_progress_expiry": self._in_progress_expiry_attr,
            "#owner": self._owner_attr,
            "#steps": self._steps_attr,
            "#validation": self._validation_attr,
            "#data": self._data_attr,
            "#format": self._data_format_attr,
        }
        values: dict[str, Any] = {
            ":now": {"N": number_text(now)},
            ":now_in_millis": {"N": number_text(now * 1000)},
            ":inprogress": {"S": Status.INPROGRESS.value},
            ":owner": {"S": claim.owner},
            ":expiry": {"N": str(expiration_for(now, claim.ttl, claim.lease))},
            ":lease_end": {"N": str(math.ceil((now + claim.lease) * 1000))},
        }
        if claim.validation is None:
            same_payload = " AND attribute_not_exists(#validation)"
        else:
            same_payload = " AND #validation = :validation"
            values[":validation"] = {"S": claim.validation}
        try:
            async with self._call("take over") as client:
                answer = await client.update_item(
                    TableName=self.table_name,
                    Key=self._key(claim.key),
                    UpdateExpression=(
                        "SET #expiry = :expiry, #in_progress_expiry = :lease_end, "
                        "#owner = :owner REMOVE #data, #format"
                    ),
                    ConditionExpression=_TAKEOVER_CONDITION + same_payload,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
        except ConditionFailed as failed:
            # Changed since the claim read it: judged as it is now; the manager claims
            # again if it is claimable.
            if not failed.item:
                return judge(None, now)
            return judge(self._items.read(failed.item, claim.key), now)
        item = answer.get("Attributes") if isinstance(answer, Mapping) else None
        taken = None if item is None else self._items.read(item, claim.key)
        if taken is None or taken.owner != claim.owner or taken.status is not Status.INPROGRESS:
            raise StoreUnavailableError(
                f"the endpoint answered a claim on table {self.table_name!r} without the item "
                "it wrote (ReturnValues=ALL_NEW): check that endpoint_url points at DynamoDB; "
                "the callback was not run"
            )
        return CLAIMED if taken.steps is None else Verdict(Found.CLAIMED, taken)

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
                    ConditionExpression=_RELEASE_CONDITION,
                    ExpressionAttributeNames={
                        "#id": self._key_attr,
                        "#owner": self._owner_attr,
                        "#steps": self._steps_attr,
                    },
                    ExpressionAttributeValues={":owner": {"S": owner}},
                    # The record that refused: another claim's, or one carrying steps.
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
        except ConditionFailed as failed:
            released = self._items.released(failed.item, owner)
            if released is not None:
                return released
            return await self._keep_progress(key, owner)
        return True

    async def _keep_progress(self, key: str, owner: str) -> bool:
        """Write ``owner``'s record carrying steps as released: no owner, its lease ended,
        everything else kept.  A second request, only for a record with steps."""
        try:
            async with self._call("keep progress") as client:
                await client.update_item(
                    TableName=self.table_name,
                    Key=self._key(key),
                    UpdateExpression="SET #in_progress_expiry = :released REMOVE #owner",
                    ConditionExpression=_RELEASED_CONDITION,
                    ExpressionAttributeNames={
                        "#in_progress_expiry": self._in_progress_expiry_attr,
                        "#owner": self._owner_attr,
                        "#status": self._status_attr,
                    },
                    ExpressionAttributeValues={
                        ":released": {"N": _RELEASED_LEASE_END},
                        ":owner": {"S": owner},
                        ":inprogress": {"S": Status.INPROGRESS.value},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
        except ConditionFailed as failed:
            # Gone since (an operator's release) counts as released; anything else is not
            # this owner's any more.
            return not failed.item
        return True

    async def record_step(self, write: StepWrite) -> Stepped:
        """Write the step list on ``write.owner``'s INPROGRESS record holding
        ``write.position`` steps (or holding this list already): one conditional
        ``UpdateItem`` (see :class:`~idempotency_async.stores.base.RecordsSteps`)."""
        try:
            encoded = write.steps.encode()
        except UnicodeEncodeError as exc:
            raise StoreValidationError(
                f"the step list of key {write.key!r} is not valid UTF-8 text ({exc}): "
                "DynamoDB holds UTF-8 only"
            ) from None
        if len(encoded) > self.max_response_bytes:
            return Stepped.TOO_LARGE
        steps = await self._forms.steps(write.key, write.owner, write.steps, encoded)
        if steps is None:
            return Stepped.TOO_LARGE
        position = write.position
        expiry = expiration_for(write.now, write.ttl, 0.0)
        names = {
            "#owner": self._owner_attr,
            "#status": self._status_attr,
            "#steps": self._steps_attr,
            "#step_count": self._step_count_attr,
            "#expiry": self._expiry_attr,
            "#in_progress_expiry": self._in_progress_expiry_attr,
        }
        values: dict[str, Any] = {
            ":owner": {"S": write.owner},
            ":inprogress": {"S": Status.INPROGRESS.value},
            ":steps": steps,
            ":count": {"N": str(position + 1)},
            ":expiry": {"N": str(expiry)},
            ":expiry_millis": {"N": str(expiry * 1000)},
        }
        if position == 0:
            condition = _STEP_CONDITION.format("attribute_not_exists(#step_count)")
        else:
            condition = _STEP_CONDITION.format("#step_count = :before")
            values[":before"] = {"N": str(position)}
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": self._key(write.key),
            "UpdateExpression": "SET #steps = :steps, #step_count = :count, #expiry = :expiry",
            "ConditionExpression": condition + _STEP_EXPIRY_GUARD,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        stepped = await self._write_step(request, write, steps)
        if stepped is not None:
            return stepped
        # The record's expiry is later than this write's (a longer lease, a renewal): the
        # list is written, the expiry left where it is.
        request["UpdateExpression"] = "SET #steps = :steps, #step_count = :count"
        request["ConditionExpression"] = condition
        del names["#expiry"], names["#in_progress_expiry"], values[":expiry"]
        del values[":expiry_millis"]
        return await self._write_step(request, write, steps) or Stepped.LOST

    async def _write_step(
        self, request: dict[str, Any], write: StepWrite, steps: dict[str, Any]
    ) -> Stepped | None:
        try:
            async with self._call("record step") as client:
                await client.update_item(**request)
        except ConditionFailed as failed:
            return self._items.not_stepped(failed.item, write.owner, write.position, steps)
        except StoreValidationError as exc:
            if is_item_too_large(exc):
                return Stepped.TOO_LARGE  # DynamoDB counted more than the estimate
            raise
        return Stepped.RECORDED

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
        owner, status, expiry, lease end and recovery points (what ``idempotency-async
        release`` showed the operator; instants compared as this store reads them, rounded
        up; the step list as this store writes it).  False, deleting nothing, when the key
        holds another record or none.  One conditional DeleteItem."""
        names = {"#id": self._key_attr, "#status": self._status_attr, "#steps": self._steps_attr}
        values: dict[str, Any] = {":status": {"S": record.status.value}}
        conditions = ["attribute_exists(#id)", "#status = :status"]
        # A step recorded since the record was read is progress the operator never saw.
        if record.steps is None:
            conditions.append("attribute_not_exists(#steps)")
        else:
            conditions.append("#steps = :steps")
            values[":steps"] = steps_attribute(record.steps)
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
        removed = {
            "lease": self._in_progress_expiry_attr,
            "steps": self._steps_attr,
            "step_count": self._step_count_attr,
        }
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
