"""Responses: encoding a result once for the store, and presenting replays to callers."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from idempotency_async._codec import encode_json
from idempotency_async.errors import ResponseNotStoredError, ResponseTooLargeError
from idempotency_async.options import Options
from idempotency_async.record import JSONValue, Record

__all__ = ["Encoded", "Responses", "log_not_stored", "not_stored_error", "not_stored_reason"]

_log = logging.getLogger("idempotency_async")


class Encoded(NamedTuple):
    """A result ready for the store: the JSON value and its encoding, or why it has none."""

    value: JSONValue
    encoded: bytes | None
    reason: Exception | None = None


class Responses:
    """Applies a manager's response codec and hook, and the store's size limit."""

    def __init__(self, options: Options) -> None:
        self._codec = options.response_codec
        self._hook = options.response_hook

    def encode(self, result: Any, limit: int) -> Encoded:
        """Encode ``result`` once; a failure is a reason, never an exception, because the
        side effect has happened and the record must complete all the same."""
        try:
            value = result if self._codec is None else self._codec.encode(result)
            encoded = encode_json(value)
        except Exception as exc:  # a failing codec too
            return Encoded(None, None, exc)
        if len(encoded) > limit:
            return Encoded(
                None,
                None,
                ResponseTooLargeError(
                    f"the response is {len(encoded)} bytes of JSON, over the store's limit of "
                    f"{limit}",
                    size=len(encoded),
                    limit=limit,
                ),
            )
        return Encoded(value, encoded)

    def present(self, stored: JSONValue, record: Record) -> Any:
        """What a replay returns: the stored value decoded, then passed through the hook."""
        response = stored if self._codec is None else self._codec.decode(stored)
        return response if self._hook is None else self._hook(response, record)


def not_stored_reason(reason: Exception) -> str:
    """The short text a record keeps about why its response was not stored."""
    if isinstance(reason, ResponseTooLargeError):
        return f"too large ({reason.size} bytes of JSON, over the limit of {reason.limit})"
    return f"not storable as JSON ({type(reason).__name__}: {reason})"[:300]


def not_stored_error(record: Record) -> ResponseNotStoredError:
    why = record.not_stored or "too large or not JSON"
    return ResponseNotStoredError(
        f"the first call for key {record.key} succeeded, but its response was not stored "
        f"({why}), so it cannot be replayed: use a new key to run the request again",
        key=record.key,
        reason=record.not_stored,
    )


def log_not_stored(key: str, reason: Exception) -> None:
    _log.warning(
        "response not stored: %s; duplicates of this key will get ResponseNotStoredError",
        reason,
        extra={"idempotency_key": key},
    )
