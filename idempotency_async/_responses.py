"""Responses: encoding a result once for the store, and presenting replays to callers."""

from __future__ import annotations

import logging
import math
from typing import Any, Final, TypeAlias

from idempotency_async._cache import CachedResponse, ResponseCache
from idempotency_async._emission import Emitter
from idempotency_async._flight import Flight, Outcome
from idempotency_async._json import decode_json, encode_json
from idempotency_async._keys import KeyDeriver, Keys
from idempotency_async._replayed import ENVELOPE, declared_errors, is_envelope, replayed
from idempotency_async.errors import (
    ResponseEncodingError,
    ResponseNotStoredError,
    ResponseTooLargeError,
)
from idempotency_async.options import Options
from idempotency_async.record import JSONValue, Record
from idempotency_async.stores.base import Verdict

__all__ = [
    "NEVER_STORED",
    "Encoded",
    "Replays",
    "Responses",
    "log_not_stored",
    "not_stored_error",
    "not_stored_reason",
]

_log = logging.getLogger("idempotency_async")

NEVER_STORED: Final = "never stored: the call is declared Redaction(never_store=True)"
"""The reason a record keeps when its call is declared never-stored."""


Encoded: TypeAlias = tuple[JSONValue, bytes | None, Exception | None]
"""A result ready for the store, ``(value, encoded, reason)``: the JSON value and its
encoding, or ``(None, None, why it has none)``.  A plain tuple, read by unpacking: every
first call makes one, and a tuple costs a fifth of a NamedTuple to build (Python 3.11)."""


class Responses:
    """Applies a manager's response codec, redaction and hook, and the store's size limit."""

    def __init__(self, options: Options) -> None:
        self._codec = options.response_codec
        self._hook = options.response_hook
        self._redaction = options.redaction
        self.declared = declared_errors(options.replay_errors)

    def encode(self, result: Any, limit: int, key: str) -> Encoded:
        """Encode ``result`` once for the store of ``key``; a failure is a reason, never an
        exception, because the side effect has happened and the record must complete all
        the same.  Declared fields are removed here, before the store write: the store, the
        local cache and this process's waiting duplicates all get the redacted value, and
        ``result`` itself is never changed (the caller whose call ran gets it whole)."""
        redaction = self._redaction
        if redaction is not None and redaction.never_store:
            return None, None, ResponseNotStoredError(NEVER_STORED, key=key, reason=NEVER_STORED)
        try:
            value = result if self._codec is None else self._codec.encode(result)
            if redaction is not None:
                value = redaction.apply(value)[0]
            encoded = encode_json(value)
        except Exception as exc:  # a failing codec too
            return None, None, exc
        if value.__class__ is dict and ENVELOPE in value and is_envelope(value):
            return None, None, _takes_error_form()
        if len(encoded) > limit:
            return (
                None,
                None,
                ResponseTooLargeError(
                    f"the response is {len(encoded)} bytes of JSON, over the store's limit of "
                    f"{limit}",
                    size=len(encoded),
                    limit=limit,
                ),
            )
        return value, encoded, None

    def present(self, stored: JSONValue, record: Record) -> Any:
        """What a replay returns: the stored value decoded, then passed through the hook —
        or, for a stored declared error, that error raised again."""
        if stored.__class__ is dict and ENVELOPE in stored and is_envelope(stored):
            raise replayed(stored, self.declared, record.key)
        response = stored if self._codec is None else self._codec.decode(stored)
        return response if self._hook is None else self._hook(response, record)


class Replays:
    """Replaying a completed record to a caller, and the local cache of completed records.

    The cache is filled by the loop's clock from when the request that brought a record was
    sent, and never across a ``force_release`` (see :meth:`fill`).
    """

    def __init__(self, options: Options, keys: KeyDeriver, emitter: Emitter) -> None:
        self.responses = Responses(options)
        cache = options.local_cache
        self.cache = None if cache is None else ResponseCache(cache.max_items)
        self._keys = keys
        self._emitter = emitter
        # force_release: how many are under way, and when (loop time) the last one ended.
        # A cache fill for a request sent before then may hold the released record.
        self._releasing = 0
        self._released_at = -math.inf

    def hit(self, entry: CachedResponse, keys: Keys) -> Any:
        """Replay a live cache entry."""
        self._keys.validate(entry.record.validation, keys)
        self._emitter.emit("cache_hit", keys.key)
        return self.outcome(Outcome(entry.record, entry.encoded))

    def outcome(self, outcome: Outcome) -> Any:
        """Replay what another call of this process settled with."""
        if outcome.encoded is None:
            raise not_stored_error(outcome.record)
        return self.responses.present(decode_json(outcome.encoded), outcome.record)

    def record(self, verdict: Verdict, flight: Flight) -> Any:
        """Replay the COMPLETED record of ``verdict``, the answer to the request ``flight``
        sent last (at ``flight.sent``); the flight settles with it for its duplicates."""
        record = verdict.record
        assert record is not None
        if flight.keys.validation is not None:  # else nothing to compare: no call
            self._keys.validate(record.validation, flight.keys)
        if not record.response_stored:
            flight.settle(Outcome(record, None))
            raise not_stored_error(record)
        if flight.waits is not None or self.cache is not None:
            encoded = encode_json(record.response)
            flight.settle(Outcome(record, encoded))
            if self.cache is not None and verdict.expires_in is not None:
                self.fill(record, encoded, flight.sent, verdict.expires_in)
        self._emitter.emit("replayed", record.key)
        return self.responses.present(record.response, record)

    def fill(self, record: Record, encoded: bytes, sent: float, life: float) -> None:
        """Cache a completed record for ``life`` seconds (as the store judged it) counted
        from ``sent``, on the loop's clock: never by comparing its expiration with this
        process's wall clock, which may be off the store's."""
        cache = self.cache
        if cache is None or self._releasing or sent <= self._released_at:
            # A force_release ran since the request was sent: the record may be gone.
            return
        cache.put(record.key, CachedResponse(record, encoded, sent + life))

    def releasing(self, key: str) -> None:
        """A force_release of ``key`` starts: no fill from now until it has ended."""
        self._releasing += 1
        if self.cache is not None:
            self.cache.discard(key)

    def released(self, key: str, now: float) -> None:
        """The force_release of ``key`` ended at loop time ``now`` (whatever its outcome):
        replays whose requests were sent before then are not cached."""
        self._releasing -= 1
        self._released_at = now
        if self.cache is not None:
            self.cache.discard(key)

    def clear(self) -> None:
        if self.cache is not None:
            self.cache.clear()


def _takes_error_form() -> ResponseEncodingError:
    return ResponseEncodingError(
        f"the result is an object whose only member is {ENVELOPE!r}, the form of a stored "
        "declared error (replay_errors): stored, it would replay as an error"
    )


def not_stored_reason(reason: Exception) -> str:
    """The short text a record keeps about why its response was not stored."""
    if isinstance(reason, ResponseTooLargeError):
        return f"too large ({reason.size} bytes of JSON, over the limit of {reason.limit})"
    if isinstance(reason, ResponseNotStoredError) and reason.reason == NEVER_STORED:
        return NEVER_STORED
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
    if isinstance(reason, ResponseNotStoredError) and reason.reason == NEVER_STORED:
        return  # declared: nothing to warn about (the response_not_stored event says it)
    # The reason may quote the result, lone surrogates included: a handler writing UTF-8
    # would drop the whole line ("--- Logging error ---"), so they are escaped here.
    text = str(reason).encode("utf-8", "backslashreplace").decode("utf-8")
    _log.warning(
        "response not stored: %s; duplicates of this key will get ResponseNotStoredError",
        text,
        extra={"idempotency_key": key},
    )
