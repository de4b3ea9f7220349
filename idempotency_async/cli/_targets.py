"""What a store URL's backend provides, and the helpers every backend's parser shares.

A backend is one module (``_dynamodb``, ``_redis``, ``_postgres``) with a ``parse(parts)`` function
returning a :class:`Target` (a :class:`Listing` too if ``list`` should work on it).  It
imports only this module; ``_schemes`` maps each URL scheme to its parser, so nothing
here knows the backends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import SplitResult, parse_qsl

from idempotency_async.cli._errors import CliError
from idempotency_async.record import Record, Status
from idempotency_async.stores._record_formats import RECORD_FORMATS
from idempotency_async.stores.base import Store

__all__ = [
    "AwsSettings",
    "Listing",
    "Page",
    "Target",
    "TargetParser",
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
        self,
        store: Any,
        *,
        status: Status | None,
        page_size: int | None,
        limit: int | None = None,
    ) -> AsyncGenerator[Page, None]:
        """The store's records page by page, optionally only those with ``status``.

        ``page_size``: what each request reads (None: the backend's default).  ``limit``:
        the caller stops after that many records, so without a ``page_size`` no request
        reads more than the limit needs where the backend can tell.
        """
        ...


TargetParser = Callable[[SplitResult], Target]
"""A backend's ``parse``: the split store URL → the :class:`Target` it names (or CliError)."""


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
