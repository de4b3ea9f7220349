"""Stores named by URL: one parser per scheme, registered in ``_SCHEMES``.

``dynamodb://TABLE?region=…&endpoint=…`` and, when the Redis store is installed,
``redis://…`` / ``rediss://…``.  A new backend is one module with a ``parse`` function
returning a :class:`Target` (a :class:`Listing` too if ``list`` should work on it) and one
entry in ``_SCHEMES``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import SplitResult, parse_qsl, urlsplit

from idempotency_async._redact import redact_url
from idempotency_async.cli._errors import CliError
from idempotency_async.record import Record, Status
from idempotency_async.stores._record_formats import RECORD_FORMATS
from idempotency_async.stores.base import Store

__all__ = [
    "AwsSettings",
    "Listing",
    "Page",
    "Target",
    "parse_target",
    "query_params",
    "record_format",
]


@dataclass(frozen=True, slots=True)
class AwsSettings:
    """The command line's AWS options (``--profile``, ``--region``); None: the usual lookup."""

    profile: str | None = None
    region: str | None = None


class Target(Protocol):
    """A parsed store URL, ready to open."""

    def store(self, aws: AwsSettings) -> Store:
        """A store that opens its connection on first use and closes it in ``aclose()``."""
        ...


class Page(Protocol):
    """One page of ``list``: the records it holds, and how many items were read for it."""

    @property
    def records(self) -> Sequence[Record]: ...

    @property
    def scanned(self) -> int: ...


@runtime_checkable
class Listing(Protocol):
    """A target whose store can list its records (``list``); optional for a backend."""

    def pages(
        self, store: Any, *, status: Status | None, page_size: int | None
    ) -> AsyncGenerator[Page, None]:
        """The store's records page by page, optionally only those with ``status``."""
        ...


def _dynamodb(parts: SplitResult) -> Target:
    from idempotency_async.cli import _dynamodb

    return _dynamodb.parse(parts)


def _redis(parts: SplitResult) -> Target:
    from idempotency_async.cli import _redis

    return _redis.parse(parts)


_SCHEMES: dict[str, Callable[[SplitResult], Target]] = {
    "dynamodb": _dynamodb,
    "redis": _redis,
    "rediss": _redis,
}


def parse_target(url: str | None) -> Target:
    """The store a URL names; CliError saying what is wrong otherwise."""
    if not url:
        raise CliError(
            "no store given: pass --store URL (e.g. dynamodb://TABLE?region=eu-west-1) "
            "or set IDEMPOTENCY_ASYNC_STORE"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise CliError(f"bad store URL {redact_url(url)!r}: {exc}") from exc
    parse = _SCHEMES.get(parts.scheme.lower())
    if parse is None:
        known = ", ".join(f"{scheme}://" for scheme in _SCHEMES)
        raise CliError(f"bad store URL {redact_url(url)!r}: the scheme must be one of {known}")
    return parse(parts)


def query_params(parts: SplitResult, known: Collection[str]) -> dict[str, str]:
    """The URL's query as a dict; CliError for unknown, repeated or malformed parameters."""
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        # Not quoting the field: it may be a secret written without its name.
        raise CliError(
            "bad query in the store URL: write it as NAME=VALUE pairs joined by '&'"
        ) from exc
    params: dict[str, str] = {}
    for name, value in pairs:
        if name not in known:
            raise CliError(
                f"unknown parameter {name!r} in {parts.scheme}:// URL; known: "
                f"{', '.join(sorted(known))}"
            )
        if name in params:
            raise CliError(f"parameter {name!r} appears twice in the store URL")
        params[name] = value
    return params


def record_format(value: str) -> str:
    """A ``record_format=`` URL parameter, checked: the layout the service's store writes."""
    if value not in RECORD_FORMATS:
        raise CliError(
            f"record_format= in the store URL must be one of {', '.join(RECORD_FORMATS)}, "
            f"got {value!r} (powertools-python: records aws-lambda-powertools (Python) wrote)"
        )
    return value
