"""The key rules of aws-lambda-powertools (Python) 3.x, for ``key_format="powertools-python"``.

Powertools (Python) derives a key in four steps, reproduced here rule for rule:

1. the payload is *prepared*: a dataclass becomes ``dataclasses.asdict(...)``, a pydantic
   model ``model_dump(mode="json")`` (plain ``model_dump()`` before 3.27), an object with
   a ``dict()`` method its result, an event source data class its ``raw_event``;
2. ``event_key_jmespath`` selects from it, with Powertools' own JMESPath functions
   (``powertools_json`` is ``json.loads``: lenient, unlike this library's default);
3. the selection is missing when it is falsy, or a list/tuple of ``None`` only, or a dict
   whose values are all ``None`` (before 3.35: whose *keys* are all ``None``, so
   ``{"a": None}`` was a key); numbers and booleans never are;
4. the selection is written by ``json.dumps(sort_keys=True)`` with Powertools' ``default``
   (``Decimal`` as its string, pydantic models and dataclasses as dicts, and since 3.36
   ``Enum`` values, ISO dates and times, ``UUID`` and paths as strings) and hashed; the key
   is ``<prefix>#<hexdigest>``, the prefix ``key_prefix`` or
   ``<AWS_LAMBDA_FUNCTION_NAME, "test-func" when unset>.<module>.<qualname>``.

The JSON text comes from the standard library's encoder configured as Powertools
configures it, so it is the same text byte for byte (default separators, ASCII escapes,
``NaN``/``Infinity``, exact integers, ``repr`` floats).  The tests prove it against the
installed package and against 3.0.0.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Final
from uuid import UUID

from idempotency_async._key_formats import KEY_FORMATS, POWERTOOLS_PYTHON
from idempotency_async.canonical import HASH_ALGORITHMS
from idempotency_async.errors import ConfigError, PayloadError

__all__ = [
    "HASH_ALGORITHMS_PYTHON",
    "KEY_FORMATS",
    "LATEST",
    "POWERTOOLS_PYTHON",
    "Rules",
    "hex_digester",
    "key_encoder",
    "parse_version",
    "prefix_for",
]


LATEST: Final = (3, 36)
"""The newest rule change inside 3.x; every later 3.x derives keys as 3.36 does."""
_PYDANTIC_JSON_MODE_SINCE: Final = (3, 27)
_MISSING_BY_VALUES_SINCE: Final = (3, 35)

_FUNCTION_NAME_ENV: Final = "AWS_LAMBDA_FUNCTION_NAME"
_FUNCTION_NAME_UNSET: Final = "test-func"

# Powertools takes any hashlib constructor by name; these are the ones that exist on every
# Python and take no length argument.
HASH_ALGORITHMS_PYTHON: Final = HASH_ALGORITHMS | frozenset(
    {"sha224", "sha3_224", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s"}
)

_VERSION: Final = re.compile(r"3(?:\.(\d+))?(?:\.\d+)?")


def parse_version(text: str | None) -> tuple[int, int]:
    """``"3.27"`` / ``"3.27.1"`` / ``"3"`` → ``(3, 27)``; ``None`` → the latest rules."""
    if text is None:
        return LATEST
    match = _VERSION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"powertools_version must name an aws-lambda-powertools 3.x release such as "
            f"'3.0' or '3.27.1', got {text!r}"
        )
    return (3, int(match.group(1) or 0))


def prefix_for(function_name: str) -> str:
    """The prefix Powertools gives a function's keys when no ``key_prefix`` is set."""
    return f"{os.environ.get(_FUNCTION_NAME_ENV, _FUNCTION_NAME_UNSET)}.{function_name}"


def hex_digester(algorithm: str) -> Callable[[bytes], str]:
    new = getattr(hashlib, algorithm)

    def digest_of(data: bytes) -> str:
        return str(new(data).hexdigest())

    return digest_of


@dataclasses.dataclass(frozen=True, slots=True)
class Rules:
    """The rules of one Powertools (Python) version (see :meth:`of`)."""

    pydantic_json_mode: bool
    missing_by_values: bool

    @classmethod
    def of(cls, version: tuple[int, int]) -> Rules:
        return cls(
            pydantic_json_mode=version >= _PYDANTIC_JSON_MODE_SINCE,
            missing_by_values=version >= _MISSING_BY_VALUES_SINCE,
        )

    def prepare(self, data: Any) -> Any:
        """The payload as Powertools' ``_prepare_data`` leaves it."""
        try:
            if hasattr(data, "__dataclass_fields__"):
                return dataclasses.asdict(data)
            dump = getattr(data, "model_dump", None)
            if callable(dump):
                return dump(mode="json") if self.pydantic_json_mode else dump()
            as_dict = getattr(data, "dict", None)
            if callable(as_dict):
                return as_dict()
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"the payload cannot be turned into a dict: {exc}") from exc
        return getattr(data, "raw_event", data)

    def is_missing(self, data: Any) -> bool:
        """Powertools' ``is_missing_idempotency_key``."""
        if isinstance(data, dict):
            members = data.values() if self.missing_by_values else data
            return all(member is None for member in members)
        if isinstance(data, tuple | list):
            return all(member is None for member in data)
        if isinstance(data, int | float):  # bool is an int
            return False
        return not data


def key_encoder(serializer: Callable[[Any], Any] | None) -> Callable[[Any], str]:
    """``json.dumps(value, cls=<Powertools' key encoder>, sort_keys=True)``, built once.

    ``serializer`` (``Options.serializer``) is consulted only for objects Powertools
    cannot write at all, so it never changes a key Powertools derives.
    """

    def default(obj: Any) -> Any:
        if isinstance(obj, Decimal):
            return math.nan if obj.is_nan() else str(obj)
        if getattr(obj, "json", False):  # Powertools' test for a pydantic model
            return obj.model_dump(mode="json")
        if getattr(obj, "__dataclass_fields__", False):
            return dataclasses.asdict(obj)
        if isinstance(obj, Enum):
            return obj.value
        if isinstance(obj, dt.date | dt.time):
            return obj.isoformat()
        if isinstance(obj, UUID | PurePath):
            return str(obj)
        if serializer is not None:
            return serializer(obj)
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    encode = json.JSONEncoder(sort_keys=True, default=default).encode

    def encode_key(value: Any) -> str:
        try:
            return encode(value)
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise PayloadError(
                f"the payload cannot be written as Powertools (Python) writes keys: {exc}. "
                "Convert the value first, or pass Options(serializer=...)"
            ) from exc

    return encode_key
