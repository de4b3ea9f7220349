"""A DynamoDB idempotency item read back as a :class:`~idempotency_async.record.Record`.

Items are untrusted input: other writers share the table (the Powertools ports, an
operator, an attacker with write access).  A malformed *response* makes a COMPLETED
record "not stored" (it still replays, as ``ResponseNotStoredError``); malformed *control
fields* (key, status, expiry, lease, owner, validation) make the record unreadable
(``InconsistentStateError``), and so does an item for another key than the one asked, and
an INPROGRESS item whose recovery points (``steps``, ``step_count``) are malformed or come
one without the other.  Reading never crashes and never allocates more than
``max_response_bytes`` for a response or a step list.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from idempotency_async.errors import ConfigError, InconsistentStateError
from idempotency_async.record import Record, Status
from idempotency_async.stores._dynamodb_values import (
    FORMAT_NOT_STORED,
    decode_response,
    read_step_count,
    read_steps,
)
from idempotency_async.stores._record_formats import python_response
from idempotency_async.stores.base import Extended, Stepped

__all__ = [
    "NEVER",
    "UNREADABLE",
    "ItemReader",
    "check_attribute_names",
    "default_static_pk",
    "instant",
]

logger = logging.getLogger("idempotency_async.dynamodb")

NEVER: Final = 2**63
"""The expiration of an item without one: the claim condition never passes for it."""

UNREADABLE: Final = (
    KeyError,
    ValueError,
    TypeError,
    AttributeError,
    ArithmeticError,
    RecursionError,
)
"""What reading a malformed item raises (decimal.InvalidOperation is an ArithmeticError)."""


class ItemReader:
    """Reads the items of one store's table, with that store's attribute names."""

    __slots__ = (
        "_data_attr",
        "_data_format_attr",
        "_expiry_attr",
        "_in_progress_expiry_attr",
        "_key_attr",
        "_max_response_bytes",
        "_owner_attr",
        "_python",
        "_record_key_attr",
        "_sort_key_attr",
        "_static_pk_value",
        "_status_attr",
        "_step_count_attr",
        "_steps_attr",
        "_table_name",
        "_validation_attr",
    )

    def __init__(
        self,
        *,
        table_name: str,
        key_attr: str,
        sort_key_attr: str | None,
        static_pk_value: str,
        status_attr: str,
        expiry_attr: str,
        in_progress_expiry_attr: str,
        data_attr: str,
        validation_attr: str,
        owner_attr: str,
        data_format_attr: str,
        steps_attr: str,
        step_count_attr: str,
        python: bool,
        max_response_bytes: int,
    ) -> None:
        self._table_name = table_name
        self._key_attr = key_attr
        self._sort_key_attr = sort_key_attr
        self._record_key_attr = sort_key_attr or key_attr
        self._static_pk_value = static_pk_value
        self._status_attr = status_attr
        self._expiry_attr = expiry_attr
        self._in_progress_expiry_attr = in_progress_expiry_attr
        self._data_attr = data_attr
        self._validation_attr = validation_attr
        self._owner_attr = owner_attr
        self._data_format_attr = data_format_attr
        self._steps_attr = steps_attr
        self._step_count_attr = step_count_attr
        self._python = python
        self._max_response_bytes = max_response_bytes

    def read(self, item: Any, key: str | None = None) -> Record:
        """The record in ``item`` (see the module), for the key asked about when given:
        an item for another key is an endpoint or proxy that mixed answers up, or a damaged
        item — never an answer for this key."""
        if not isinstance(item, Mapping):
            raise InconsistentStateError(
                f"the store asked table {self._table_name!r} about key {key!r} and got an item "
                f"that is not an attribute map ({type(item).__name__}): check that the "
                "client's endpoint is DynamoDB"
            )
        try:
            record = self._record(item)
        except UNREADABLE as exc:
            found = _key_text(item.get(self._record_key_attr))
            raise InconsistentStateError(
                f"the record of key {found} in table {self._table_name!r} cannot be read "
                f"({_why(exc)}): it was not written by this library or a Powertools port "
                "with this store's attribute names. Check the attribute options; if it is "
                "foreign or damaged, delete it (manager.force_release or the CLI's release)"
            ) from exc
        if key is not None and (record.key != key or not self._in_partition(item)):
            found = _key_text(item.get(self._record_key_attr))
            raise InconsistentStateError(
                f"the store asked table {self._table_name!r} about key {key!r} and got the "
                f"record of key {found}{self._partition_text(item)}: an endpoint or proxy "
                "that mixes answers up, or a damaged item. It was not used"
            )
        return record

    def not_extended(self, item: Mapping[str, Any] | None, owner: str, lease_end: int) -> Extended:
        """Why a renewal's condition failed, from the item it met: the owner's lease ends
        later already, or the lease is lost."""
        if (
            item is None
            or item.get(self._owner_attr) != {"S": owner}
            or item.get(self._status_attr) != {"S": Status.INPROGRESS.value}
        ):
            return Extended.LOST
        try:
            later = instant(item[self._in_progress_expiry_attr]) > lease_end
        except UNREADABLE:
            later = False  # not a lease this library wrote: not one to count on
        return Extended.ALREADY_LATER if later else Extended.LOST

    def released(self, item: Mapping[str, Any] | None, owner: str) -> bool | None:
        """What a release answers when its ``DeleteItem`` (owner's record without steps)
        failed its condition on ``item``: ``True`` for an ownerless record carrying steps
        (released already), ``False`` for another claim's record, ``None`` for ``owner``'s
        record carrying steps (to be written as released)."""
        if not isinstance(item, Mapping) or self._steps_attr not in item:
            return False
        held = item.get(self._owner_attr)
        if held is None:
            return True
        return None if held == {"S": owner} else False

    def not_stepped(
        self, item: Mapping[str, Any] | None, owner: str, position: int, steps: Any
    ) -> Stepped | None:
        """Why a step write's condition failed on ``item``: it holds ``steps`` already
        (``RECORDED``: the write, sent again), it is not ``owner``'s INPROGRESS record at
        ``position`` steps (``LOST``), or it is (``None``: only the guard on the expiry
        refused it)."""
        if (
            not isinstance(item, Mapping)
            or item.get(self._owner_attr) != {"S": owner}
            or item.get(self._status_attr) != {"S": Status.INPROGRESS.value}
        ):
            return Stepped.LOST
        if item.get(self._steps_attr) == steps:
            return Stepped.RECORDED
        count = item.get(self._step_count_attr)
        try:
            held = 0 if count is None else read_step_count(count)
        except UNREADABLE:
            return Stepped.LOST
        return None if held == position else Stepped.LOST

    def _in_partition(self, item: Mapping[str, Any]) -> bool:
        if self._sort_key_attr is None:
            return True
        partition = item.get(self._key_attr)
        return isinstance(partition, Mapping) and partition.get("S") == self._static_pk_value

    def _partition_text(self, item: Mapping[str, Any]) -> str:
        if self._in_partition(item):
            return ""
        return f" in partition {_key_text(item.get(self._key_attr))}"

    def _record(self, item: Mapping[str, Any]) -> Record:
        data_format = _string_or_none(item.get(self._data_format_attr))
        not_stored = None
        if data_format is not None and data_format.startswith(FORMAT_NOT_STORED):
            # "not-stored" or "not-stored: <why>"
            not_stored = data_format[len(FORMAT_NOT_STORED) :].lstrip(": ")
            data_format = FORMAT_NOT_STORED
        expiration = item.get(self._expiry_attr)
        lease_end = item.get(self._in_progress_expiry_attr)
        status = Status(item[self._status_attr]["S"])
        key = _string_or_none(item[self._record_key_attr])
        if key is None:
            raise TypeError("the key is not a string")
        record = Record(
            key=key,
            status=status,
            # No expiration: the claim condition never passes for it, so it never expires.
            expiration=NEVER if expiration is None else instant(expiration),
            lease_end=None if lease_end is None else instant(lease_end) / 1000,
            validation=_string_or_none(item.get(self._validation_attr)),
            owner=_string_or_none(item.get(self._owner_attr)),
            response_stored=not_stored is None,
            not_stored=not_stored or None,
        )
        if status is Status.INPROGRESS:
            steps = item.get(self._steps_attr)
            count = item.get(self._step_count_attr)
            if steps is None and count is None:
                return record
            if steps is None or count is None:
                raise KeyError("a step list without its step count, or a count without a list")
            read_step_count(count)
            return record._replace(steps=read_steps(steps, self._max_response_bytes))
        if not_stored is not None:
            return record
        data = item.get(self._data_attr)
        try:
            if self._python and data_format is None and data is not None and "S" in data:
                response = python_response(data["S"])
            else:
                response = decode_response(data, data_format, max_bytes=self._max_response_bytes)
        except UNREADABLE as exc:
            # The side effect happened: the record is completed, only its answer is lost.
            why = f"the stored response cannot be read: {_why(exc)}"[:300]
            logger.warning("record %r: %s; replays raise ResponseNotStoredError", key, why)
            return record._replace(response_stored=False, not_stored=why)
        return record._replace(response=response)


def instant(attribute: Mapping[str, Any]) -> int:
    """A stored instant (an ``N``), rounded up: older TypeScript versions wrote fractional
    expirations, and rounding up keeps a record live as long as the conditional write
    treats it as live."""
    text = attribute["N"]
    if not isinstance(text, str):
        raise TypeError(f"expected a number (N), got {type(text).__name__}")
    value = Decimal(text)
    if not value.is_finite() or abs(value) > NEVER:
        raise ValueError(f"the instant {text[:40]} is not a Unix time")
    return math.ceil(value)


def _string_or_none(attribute: Mapping[str, Any] | None) -> str | None:
    if attribute is None:
        return None
    text = attribute["S"]
    if not isinstance(text, str):
        raise TypeError(f"expected a string (S), got {type(text).__name__}")
    return text


def _key_text(attribute: Any) -> str:
    text = attribute.get("S") if isinstance(attribute, Mapping) else None
    return repr(text[:200]) if isinstance(text, str) else "(unreadable)"


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


# -- the layout's configuration -------------------------------------------------------


def check_attribute_names(**names: str | None) -> None:
    """``ConfigError`` unless every given attribute name is a non-empty string of its own."""
    given = {option: name for option, name in names.items() if name is not None}
    for option, name in given.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{option} must be a non-empty string, got {name!r}")
    seen: dict[str, str] = {}
    for option, name in given.items():
        if name in seen:
            raise ConfigError(
                f"{option} and {seen[name]} are both {name!r}: each attribute of the "
                "idempotency item needs its own name"
            )
        seen[name] = option


def default_static_pk(*, strip: bool) -> str:
    """The partition key value of sort-key mode, from the Lambda function's name."""
    # The TypeScript port trims the function name; Powertools (Python) does not.
    name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "")
    return f"idempotency#{name.strip() if strip else name}"
