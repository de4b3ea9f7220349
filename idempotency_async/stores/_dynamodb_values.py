"""Responses as DynamoDB AttributeValues, and the ``data_format`` markers of the other forms.

A response is stored as native AttributeValues (``M``, ``L``, ``S``, ``N``, ``BOOL``,
``NULL``) when possible, because that is what the TypeScript port writes and reads.  Only
values that come back unchanged and with their Python type qualify: DynamoDB normalizes
number text (``1.0`` comes back as ``1``, which would read back as an int), keeps 38
digits, and nests at most 32 levels; empty object keys are not stored natively either.
Other responses are stored as JSON text, compressed JSON, or not at all, each named by
a ``data_format`` marker.  See ``docs/dynamodb.md``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from idempotency_async._json import MAX_STORED_DEPTH, StoredDataError, decode_stored
from idempotency_async.record import JSONValue

__all__ = [
    "FORMAT_JSON",
    "FORMAT_JSON_ZLIB",
    "FORMAT_NOT_STORED",
    "Native",
    "STEPS_TEXT_BYTES",
    "decode_response",
    "inflate",
    "number_text",
    "read_step_count",
    "read_steps",
    "steps_attribute",
    "to_native",
]

# Values of the data_format attribute.  Absent means native AttributeValues (and is
# what the TypeScript port writes and reads).
FORMAT_JSON: Final = "json"
FORMAT_JSON_ZLIB: Final = "json+zlib"
FORMAT_NOT_STORED: Final = "not-stored"

STEPS_TEXT_BYTES: Final = 64 * 1024
"""A step list up to this size (UTF-8 bytes) is stored as JSON text (``S``); a longer one
zlib-compressed (``B``), as a response is when it would not fit otherwise."""
_MAX_STEP_COUNT: Final = 10_000

_MAX_DEPTH: Final = 32
_MAX_INT_DIGITS: Final = 38
_MIN_FLOAT_MAGNITUDE: Final = 1e-130


@dataclass(frozen=True, slots=True)
class Native:
    value: dict[str, Any]
    size: int


class _NotNative(Exception):
    """The value would not come back from DynamoDB as the same Python value."""


def to_native(value: JSONValue) -> Native | None:
    """The response as AttributeValues with its DynamoDB size, or None if that is lossy."""
    encoder = _NativeEncoder()
    try:
        return Native(encoder.encode(value, 0), encoder.size)
    except _NotNative:
        return None


class _NativeEncoder:
    """Builds AttributeValues and counts item bytes the way DynamoDB does (roughly)."""

    def __init__(self) -> None:
        self.size = 0

    def encode(self, value: JSONValue, depth: int) -> dict[str, Any]:
        if isinstance(value, str):
            self.size += _utf8_size(value)
            return {"S": value}
        if value is None or isinstance(value, bool):
            self.size += 1
            return {"NULL": True} if value is None else {"BOOL": value}
        if isinstance(value, int | float):
            text = _native_number(value)
            self.size += len(text) // 2 + 2
            return {"N": text}
        if depth >= _MAX_DEPTH:
            raise _NotNative
        if isinstance(value, list | tuple):
            self.size += 3 + len(value)
            return {"L": [self.encode(element, depth + 1) for element in value]}
        if isinstance(value, dict):
            return {"M": self._encode_map(value, depth)}
        raise _NotNative

    def _encode_map(self, value: dict[Any, Any], depth: int) -> dict[str, Any]:
        self.size += 3 + len(value)
        result = {}
        for key, element in value.items():
            if not isinstance(key, str) or not key:
                raise _NotNative
            self.size += _utf8_size(key)
            result[key] = self.encode(element, depth + 1)
        return result


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        # A lone surrogate: DynamoDB holds UTF-8 only, so the JSON form (which escapes it)
        # stores the string instead.
        raise _NotNative from None


def _native_number(value: int | float) -> str:
    """N text that reads back as the same type and value, even after DynamoDB normalizes it.

    DynamoDB trims trailing zeros (``1.0`` comes back as ``1``) and keeps 38 digits, so
    integral floats and wider integers cannot be stored natively.
    """
    if isinstance(value, int):
        text = str(value)
        if len(text.lstrip("-")) > _MAX_INT_DIGITS:
            raise _NotNative
        return text
    if not math.isfinite(value) or value.is_integer() or abs(value) < _MIN_FLOAT_MAGNITUDE:
        raise _NotNative
    return repr(value)


def decode_response(
    attribute: Mapping[str, Any] | None, data_format: str | None, *, max_bytes: int
) -> JSONValue:
    """The response held in ``data``, in whichever form ``data_format`` names.

    Bounded, since other writers share the table: nesting, finite numbers (see
    :func:`~idempotency_async._json.decode_stored`) and, for compressed JSON, at most
    ``max_bytes`` inflated.  Raises ``ValueError`` (or ``TypeError``/``KeyError`` for a
    malformed AttributeValue) when the response cannot be read within them.
    """
    if attribute is None or data_format == FORMAT_NOT_STORED:
        return None
    if data_format is None:
        return _from_native(attribute, 0)
    if data_format == FORMAT_JSON:
        return decode_stored(_string(attribute))
    if data_format == FORMAT_JSON_ZLIB:
        return decode_stored(inflate(attribute["B"], max_bytes))
    raise ValueError(f"unknown data format {data_format!r} (written by a newer version?)")


def inflate(compressed: bytes, max_bytes: int) -> bytes:
    """zlib data inflated to at most ``max_bytes``: a small value that would inflate to
    gigabytes is refused after ``max_bytes + 1`` bytes, never inflated whole."""
    if not isinstance(compressed, bytes | bytearray):
        raise TypeError(f"compressed JSON is binary (B), got {type(compressed).__name__}")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(compressed, max_bytes + 1)
    except zlib.error as exc:
        raise StoredDataError(f"not zlib data ({exc})") from None
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise StoredDataError(f"inflates to more than max_response_bytes ({max_bytes} bytes)")
    if not inflater.eof:
        raise StoredDataError("truncated zlib data")
    return data


def read_steps(attribute: Mapping[str, Any], max_bytes: int) -> str:
    """The step list an item holds (``steps``): JSON text (``S``) or zlib-compressed JSON
    text (``B``), at most ``max_bytes`` long.  Kept as text: the manager parses it (strictly)
    when a claim resumes it.  Raises ``ValueError``/``TypeError``/``KeyError`` otherwise."""
    if not isinstance(attribute, Mapping) or len(attribute) != 1:
        raise TypeError("the step list is not an attribute value")
    if "S" in attribute:
        text = _string(attribute)
        if len(text) > max_bytes:
            raise StoredDataError(f"the step list is longer than max_response_bytes ({max_bytes})")
    else:
        text = inflate(attribute["B"], max_bytes).decode("utf-8")
    if not text.startswith("["):
        raise StoredDataError("the step list is not a JSON array")
    return text


def steps_attribute(text: str) -> dict[str, Any]:
    """The ``steps`` attribute holding the step list ``text`` as this store writes it: the
    JSON text up to ``STEPS_TEXT_BYTES`` of UTF-8, else that text zlib-compressed."""
    encoded = text.encode()
    if len(encoded) <= STEPS_TEXT_BYTES:
        return {"S": text}
    return {"B": zlib.compress(encoded)}


def read_step_count(attribute: Mapping[str, Any]) -> int:
    """The number of steps an item holds (``step_count``): a positive whole ``N``."""
    text = attribute["N"]
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise ValueError(f"the step count {str(text)[:40]!r} is not a whole number of steps")
    count = int(text)
    if not 0 < count <= _MAX_STEP_COUNT:
        raise ValueError(f"the step count {count} is out of range")
    return count


def _string(attribute: Mapping[str, Any]) -> str:
    text = attribute["S"]
    if not isinstance(text, str):
        raise TypeError(f"expected a string (S), got {type(text).__name__}")
    return text


def _from_native(attribute: Mapping[str, Any], depth: int) -> JSONValue:
    if depth > MAX_STORED_DEPTH:
        raise StoredDataError(f"nested more than the {MAX_STORED_DEPTH} levels accepted")
    (kind, value), *_ = attribute.items()
    if kind == "S":
        return value
    if kind == "N":
        return _decode_number(value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    if kind == "L":
        return [_from_native(element, depth + 1) for element in value]
    if kind == "M":
        return {name: _from_native(element, depth + 1) for name, element in value.items()}
    if kind == "SS":
        return list(value)
    if kind == "NS":
        return [_decode_number(element) for element in value]
    raise ValueError(f"attribute type {kind} is not a JSON value")


def _decode_number(text: str) -> int | float:
    if "." in text or "e" in text or "E" in text:
        value = float(text)
        if not math.isfinite(value):
            raise StoredDataError(f"the number {text[:40]} is beyond the range of a float")
        return value
    return int(text)  # ValueError beyond 4,300 digits


def number_text(value: float) -> str:
    """N text for a number in a condition (such as ``now``), exact for ints and floats."""
    return str(value) if isinstance(value, int) else repr(float(value))
