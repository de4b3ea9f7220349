"""Record formats a store can write: the TypeScript port's, or Powertools (Python)'s.

Both use the same statuses (``INPROGRESS``, ``COMPLETED``), expiry in Unix seconds and the
lease end in Unix milliseconds; they differ in the response.  TypeScript stores it as a
native value, Powertools (Python) as JSON text, ``json.dumps`` of the response, which it
reads back with ``json.loads``.  A store taking ``record_format=`` checks it here and
uses these helpers for the response, so the DynamoDB store and any later store (Redis)
write and read the Powertools form alike.
"""

from __future__ import annotations

from typing import Final, Literal

from idempotency_async._json import decode_stored
from idempotency_async.errors import ConfigError
from idempotency_async.record import JSONValue

__all__ = [
    "POWERTOOLS_PYTHON",
    "RECORD_FORMATS",
    "RecordFormat",
    "TYPESCRIPT",
    "check_record_format",
    "python_response",
    "python_response_text",
]

RecordFormat = Literal["typescript", "powertools-python"]
TYPESCRIPT: Final = "typescript"
POWERTOOLS_PYTHON: Final = "powertools-python"
RECORD_FORMATS: Final = (TYPESCRIPT, POWERTOOLS_PYTHON)


def check_record_format(record_format: str) -> RecordFormat:
    if record_format == TYPESCRIPT:
        return TYPESCRIPT
    if record_format == POWERTOOLS_PYTHON:
        return POWERTOOLS_PYTHON
    raise ConfigError(
        f"record_format must be one of {', '.join(map(repr, RECORD_FORMATS))}, "
        f"got {record_format!r}"
    )


def python_response_text(encoded: bytes) -> str:
    """The response as Powertools (Python) stores it: JSON text.

    ``encoded`` is the manager's compact JSON; Powertools writes spaced, sorted JSON, but
    reads any JSON text with ``json.loads``, so a replay on either side returns the same
    value.
    """
    return encoded.decode()


def python_response(text: str) -> JSONValue:
    """A stored Powertools (Python) response, read as Powertools reads it (``json.loads``:
    exact wide integers) within the bounds of every stored response: ``NaN``, ``Infinity``
    and nesting deeper than 512 levels raise ``StoredDataError``, which Powertools would
    replay but this library answers as "not stored" on every path."""
    return decode_stored(text, exact=True)
