"""Stores named by URL: one parser per scheme, registered in ``_SCHEMES``.

``dynamodb://TABLE?region=…&endpoint=…`` and, when the Redis store is installed,
``redis://…`` / ``rediss://…``, and ``postgres://…`` / ``postgresql://…``.  A new backend
is one module with a ``parse`` function and one entry in ``_SCHEMES``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import SplitResult, parse_qsl, urlsplit

from idempotency_async.cli._errors import CliError
from idempotency_async.stores.base import Store

__all__ = ["AwsSettings", "Target", "parse_target", "query_params"]


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


def _dynamodb(parts: SplitResult) -> Target:
    from idempotency_async.cli import _dynamodb

    return _dynamodb.parse(parts)


def _redis(parts: SplitResult) -> Target:
    from idempotency_async.cli import _redis

    return _redis.parse(parts)


def _postgres(parts: SplitResult) -> Target:
    from idempotency_async.cli import _postgres

    return _postgres.parse(parts)


_SCHEMES: dict[str, Callable[[SplitResult], Target]] = {
    "dynamodb": _dynamodb,
    "redis": _redis,
    "rediss": _redis,
    "postgres": _postgres,
    "postgresql": _postgres,
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
        raise CliError(f"bad store URL {url!r}: {exc}") from exc
    parse = _SCHEMES.get(parts.scheme.lower())
    if parse is None:
        known = ", ".join(f"{scheme}://" for scheme in _SCHEMES)
        raise CliError(f"bad store URL {url!r}: the scheme must be one of {known}")
    return parse(parts)


def query_params(parts: SplitResult, known: Collection[str]) -> dict[str, str]:
    """The URL's query as a dict; CliError for unknown, repeated or malformed parameters."""
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise CliError(f"bad query in store URL: {exc}") from exc
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
