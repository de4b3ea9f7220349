"""Store URLs: each scheme the command knows, mapped to its backend's parser.

``dynamodb://TABLE?region=…&endpoint=…``, ``redis://…`` / ``rediss://…`` and
``postgres://…`` / ``postgresql://…``.  Registering a backend is one entry in
``_SCHEMES``; its module is imported when a URL names it, so a command that never touches
Redis never imports the Redis client.  Backends import only ``_targets``, never this module.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from idempotency_async._redact import redact_url
from idempotency_async.cli._errors import CliError
from idempotency_async.cli._targets import Target, TargetParser

__all__ = ["parse_target"]


def _dynamodb(parts: SplitResult) -> Target:
    from idempotency_async.cli import _dynamodb

    return _dynamodb.parse(parts)


def _redis(parts: SplitResult) -> Target:
    from idempotency_async.cli import _redis

    return _redis.parse(parts)


def _postgres(parts: SplitResult) -> Target:
    from idempotency_async.cli import _postgres

    return _postgres.parse(parts)


_SCHEMES: dict[str, TargetParser] = {
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
        raise CliError(f"bad store URL {redact_url(url)!r}: {exc}") from exc
    parse = _SCHEMES.get(parts.scheme.lower())
    if parse is None:
        known = ", ".join(f"{scheme}://" for scheme in _SCHEMES)
        raise CliError(f"bad store URL {redact_url(url)!r}: the scheme must be one of {known}")
    return parse(parts)
