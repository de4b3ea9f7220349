"""One record of a batch: read once before anything runs, then run through the manager."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idempotency_async._disabled import disabled_by_environment
from idempotency_async.deadlines import deadline as ambient_deadline
from idempotency_async.errors import (
    AlreadyInProgressError,
    BatchEventError,
    CompletionError,
    ResponseNotStoredError,
)
from idempotency_async.instrumentation import call_attributes
from idempotency_async.integrations._lambda.events import Source
from idempotency_async.manager import Manager

__all__ = ["Item", "RecordRunner", "identified"]

_log = logging.getLogger("idempotency_async.aws_lambda")

# Telemetry: the item on each record's call span.
_ITEM_ID = "idempotency.batch.item.id"


@dataclass(slots=True)
class Item:
    """One record of the batch, read once before anything runs."""

    identifier: str
    record: Mapping[str, Any]
    payload: dict[str, Any] | None = None
    """The record with its body decoded; None when it could not be read."""
    key: str | None = None
    """The key the manager gives it (None: no key, or unreadable)."""
    group: str | None = None
    """Its ordering group (batches whose records are ordered)."""
    unreadable: str | None = None
    """Why the record cannot run: it fails alone, the rest of the batch runs."""


def identified(records: list[Mapping[str, Any]], source: Source) -> list[Item]:
    """Each record with the identifier ``batchItemFailures`` names it by; a record without
    one fails the whole batch (:class:`~idempotency_async.errors.BatchEventError`)."""
    items = []
    for index, record in enumerate(records):
        identifier = source.identifier(record)
        if identifier is None:
            raise BatchEventError(
                f"{source.name} record {index} has no {'.'.join(source.id_path)}: "
                "batchItemFailures names records by it, so the record cannot fail on its own "
                "and the whole batch fails"
            )
        items.append(Item(identifier, record))
    return items


@dataclass(slots=True)
class RecordRunner:
    manager: Manager
    source: Source
    handler: Callable[[dict[str, Any]], Awaitable[object]]
    deadline: float | None = None
    """The records' deadline (``loop.time()``): their leases end here, and a record not
    started by then fails without running."""
    stop: float | None = None
    """Past the deadline, when a record still running (a store round trip under way) is
    cut off and fails: the batch answers before Lambda ends the invocation."""
    not_started: int = 0

    def prepare(self, item: Item) -> None:
        """Read the record: its decoded payload, key and group; or why it is unreadable.

        Nothing a record holds can fail the batch: a record that cannot be read (a body
        with duplicate JSON members, Keys nested too deeply to compare) fails alone, and so
        does one whose key cannot be derived (nested too deeply to hash, an integer too
        wide for a key), when its own call derives it.
        """
        try:
            # The group first, from the record as delivered: a record that cannot be
            # decoded still stops its group.
            if self.source.ordering is not None:
                item.group = self.source.ordering(item.record)
        except Exception as exc:  # e.g. DynamoDB Keys nested too deeply to compare
            item.unreadable = f"its {self.source.group_field} cannot be read: {reason(exc)}"
            return
        try:
            item.payload = self.source.decode(item.record)
        except Exception as exc:
            item.unreadable = reason(exc)
            return
        if disabled_by_environment():
            return  # every record runs on its own, duplicates too
        try:
            item.key = self.manager.key_for(item.payload)
        except Exception:
            # No key to group by: the record's own call derives it again and fails alone
            # with the reason (a payload that cannot be keyed, KeyMissingError).
            item.key = None

    async def __call__(self, item: Item, *, duplicate: bool = False) -> bool:
        """Run one record; True when it needs no redelivery.

        ``duplicate``: an earlier record of the batch with the same key succeeded, so this
        one replays it (or, when that one's result could not be recorded, counts as
        processed with it).
        """
        if item.unreadable is not None or item.payload is None:
            return self.unreadable(item)
        payload = item.payload
        if self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline:
            if duplicate:
                # Its first copy succeeded in this batch as the time ran out: the same
                # request, processed with it (its replay would only read that record).
                return True
            self.not_started += 1  # reported once for the batch
            return False
        handler = self.handler
        raised: list[BaseException] = []  # the handler's own failure (not the completion's)

        def handled() -> Any:
            try:
                pending: Any = handler(payload)
            except BaseException as exc:
                raised.append(exc)
                raise
            # Not awaitable: the manager's to refuse, as it is.
            return _watched(pending, raised) if hasattr(pending, "__await__") else pending

        try:
            with call_attributes(self.manager, {_ITEM_ID: item.identifier}):
                if self.stop is None:
                    await self.manager.execute(payload, handled)
                else:
                    # Also the ambient deadline of the idempotent calls the handler makes.
                    async with ambient_deadline(at=self.stop):
                        await self.manager.execute(payload, handled, deadline=self.deadline)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the batch itself is being cancelled: nothing more may run
            # The handler raised a CancelledError of its own (nobody cancelled this task):
            # a failure of this record, redelivered like any other, not of the batch.
            _log.error(
                "%s record %s failed: its handler raised CancelledError",
                self.source.name,
                item.identifier,
            )
            return False
        except (ResponseNotStoredError, CompletionError) as exc:
            if raised and raised[0] is exc:
                # The handler's own (a step whose recovery point was not recorded, or
                # whose lease was lost): it did not run to completion.  Redelivered, the
                # record resumes its recorded steps once the key is free.
                return self._failed(item, duplicate, exc)
            # The handler ran to completion; only its result was not recorded.
            # Redelivering the record could only run the side effect twice.
            _log.warning(
                "%s record %s was processed, but: %s", self.source.name, item.identifier, exc
            )
            return True
        except TimeoutError as exc:
            if self.deadline is None or asyncio.get_running_loop().time() < self.deadline:
                return self._failed(item, duplicate, exc)
            # Cut off by the invocation's deadline: redelivered, the batch still answers.
            _log.error(
                "%s record %s was cut off by the invocation's deadline and failed: %s",
                self.source.name,
                item.identifier,
                exc,
            )
            return False
        except Exception as exc:
            return self._failed(item, duplicate, exc)
        return True

    def _failed(self, item: Item, duplicate: bool, exc: Exception) -> bool:
        """A record whose call raised: redelivered (False), unless it was processed."""
        if duplicate and isinstance(exc, AlreadyInProgressError):
            # Its first copy ran to completion in this batch, but the completion write
            # did not land (in progress until the lease ends): processed with it.
            _log.warning(
                "%s record %s is a duplicate of one processed in this batch: %s",
                self.source.name,
                item.identifier,
                exc,
            )
            return True
        _log.error("%s record %s failed", self.source.name, item.identifier, exc_info=exc)
        return False

    def unreadable(self, item: Item) -> bool:
        """A record that cannot be read fails alone, without running."""
        _log.error(
            "%s record %s cannot be read, failed without running it: %s",
            self.source.name,
            item.identifier,
            item.unreadable,
        )
        return False

    def failed_with_first(self, item: Item) -> bool:
        """A duplicate of a record that failed in this batch: redelivered with it, unrun."""
        _log.info(
            "%s record %s has the key of a record that failed in this batch: "
            "reported failed with it, not run",
            self.source.name,
            item.identifier,
        )
        return False


def reason(exc: Exception, limit: int = 300) -> str:
    """Why a record cannot be read, short enough for a log line (a path 600 levels deep
    is not)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


async def _watched(pending: Awaitable[Any], raised: list[BaseException]) -> Any:
    """Await the handler's ``pending`` work, noting in ``raised`` what it raised."""
    try:
        return await pending
    except BaseException as exc:
        raised.append(exc)
        raise
