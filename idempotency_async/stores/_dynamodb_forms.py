"""The form a response takes in a DynamoDB item: native AttributeValues, JSON text,
compressed JSON, or not stored — whichever fits in the item; and the form of a step list
(JSON text, compressed above 64 KB), or none when it does not fit.

DynamoDB's item limit is 400 KB: the response's budget is that less everything else the
completion writes (names, key, token, validation hash, numbers), counted generously.  A
response that fits in none of the forms completes the record without it (the side effect
has happened: never a release), and so does one DynamoDB refuses.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from dataclasses import dataclass
from typing import Any, Final

from idempotency_async._json import utf8_text
from idempotency_async.errors import StoreValidationError
from idempotency_async.record import Completion
from idempotency_async.stores._dynamodb_values import (
    FORMAT_JSON,
    FORMAT_JSON_ZLIB,
    FORMAT_NOT_STORED,
    STEPS_TEXT_BYTES,
    steps_attribute,
    to_native,
)
from idempotency_async.stores._record_formats import python_response_text

__all__ = ["Data", "ResponseForms", "not_stored"]

logger = logging.getLogger("idempotency_async.dynamodb")

# DynamoDB's limit is 400 KB (409,600 bytes); the rest is slack for the size estimate.
_ITEM_BUDGET: Final = 400_000
# A step write does not know the record's validation hash (the claim wrote it): room for
# one (a hex digest is 32 to 128 characters).  DynamoDB's own refusal is the backstop.
_VALIDATION_ROOM: Final = 1024


@dataclass(frozen=True, slots=True)
class Data:
    """A response as the completion writes it: its ``data_format`` marker (None: native,
    or Powertools' JSON text) and its ``data`` attribute (None: not stored)."""

    format: str | None
    value: dict[str, Any] | None


class ResponseForms:
    """Chooses how one store's completions write their response."""

    __slots__ = ("_fixed", "_python")

    def __init__(self, *, python: bool, names: tuple[str, ...]) -> None:
        """``python``: the Powertools (Python) record format (JSON text only, never
        compressed); ``names``: every attribute name and constant string an item holds
        besides the per-call key, owner and validation hash."""
        self._python = python
        # Three numbers (21 digits each) and room for the rest of the encoding.
        self._fixed = sum(len(name.encode()) for name in (*names, FORMAT_JSON_ZLIB)) + 3 * 21 + 64

    async def prepare(self, completion: Completion) -> Data:
        """Native, JSON text, compressed, or not at all: the first form that fits."""
        encoded = completion.encoded
        if encoded is None:
            return not_stored(completion.not_stored)
        budget = self._budget(completion)
        if self._python:
            if len(encoded) <= budget:
                return Data(None, {"S": python_response_text(encoded)})
            return self._too_large(completion)
        native = to_native(completion.response)
        if native is not None and native.size <= budget:
            return Data(None, native.value)
        if native is None and len(encoded) <= budget:
            return Data(FORMAT_JSON, {"S": encoded.decode()})
        return await self._compressed(completion, encoded)

    async def smaller(self, completion: Completion, rejected: Data) -> Data:
        """The next form after DynamoDB found ``rejected`` too large (it counted more
        bytes than the estimate): compressed, else not stored."""
        if self._python or rejected.format == FORMAT_JSON_ZLIB or completion.encoded is None:
            return self._too_large(completion)
        return await self._compressed(completion, completion.encoded)

    def refused(self, completion: Completion, exc: StoreValidationError) -> Data:
        """Not stored: DynamoDB refused a value of the response that the encoder took for
        one it holds."""
        logger.warning(
            "DynamoDB refused the response for %r (%s); the record is completed without it, "
            "and replays will raise ResponseNotStoredError",
            completion.key,
            exc,
        )
        cause = exc.__cause__
        answer = getattr(cause, "response", None)
        detail = answer.get("Error", {}).get("Message") if isinstance(answer, dict) else None
        return not_stored(f"DynamoDB refused a value of the response ({detail or exc})"[:300])

    async def _compressed(self, completion: Completion, encoded: bytes) -> Data:
        # Off the event loop: a multi-megabyte response takes tens of milliseconds.
        compressed = await asyncio.to_thread(zlib.compress, encoded)
        if len(compressed) <= self._budget(completion):
            return Data(FORMAT_JSON_ZLIB, {"B": compressed})
        return self._too_large(completion)

    async def steps(self, key: str, owner: str, text: str, encoded: bytes) -> dict[str, Any] | None:
        """The step list ``text`` (``encoded``: as UTF-8) as the ``steps`` attribute: JSON
        text up to 64 KB, else zlib-compressed; ``None`` when it does not fit in the item
        even so."""
        budget = _ITEM_BUDGET - self._fixed - _VALIDATION_ROOM - len(key.encode())
        budget -= len(owner.encode())
        if len(encoded) > 2 * STEPS_TEXT_BYTES:
            # Off the event loop, as a response's: a list of megabytes takes milliseconds.
            attribute = await asyncio.to_thread(steps_attribute, text)
        else:
            attribute = steps_attribute(text)
        size = len(encoded) if "S" in attribute else len(attribute["B"])
        return attribute if size <= budget else None

    def _budget(self, completion: Completion) -> int:
        # The item limit less everything but the response.
        strings = (completion.key, completion.owner, completion.validation or "")
        return _ITEM_BUDGET - self._fixed - sum(len(text.encode()) for text in strings)

    def _too_large(self, completion: Completion) -> Data:
        size = 0 if completion.encoded is None else len(completion.encoded)
        how = "as JSON text" if self._python else "even compressed"
        logger.warning(
            "the response for %r (%d bytes of JSON) does not fit in a DynamoDB item %s; "
            "the record is completed without it, and replays will raise "
            "ResponseNotStoredError",
            completion.key,
            size,
            how,
        )
        return not_stored(f"too large for a DynamoDB item {how} ({size} bytes of JSON)")


def not_stored(reason: str | None) -> Data:
    """No response; the reason rides in the format marker: readers that do not know it (the
    TypeScript port) ignore ``data_format``, and no attribute is added to the item."""
    if not reason:
        return Data(FORMAT_NOT_STORED, None)
    return Data(f"{FORMAT_NOT_STORED}: {utf8_text(reason)}", None)
