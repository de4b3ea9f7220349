"""``redis://…`` / ``rediss://…`` URLs: a RedisStore, when the Redis store is installed."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import SplitResult, parse_qsl, urlencode

from idempotency_async._redact import redact_url
from idempotency_async.cli._errors import CliError
from idempotency_async.cli._targets import AwsSettings

__all__ = ["RedisTarget", "parse"]

# Parameters the store takes; every other query parameter goes to redis-py's from_url.
_STORE_OPTIONS: Final = ("key_prefix", "cluster")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class RedisTarget:
    url: str
    key_prefix: str = ""
    cluster: bool = False

    def store(self, aws: AwsSettings) -> Any:
        try:
            # By name: the Redis store is optional (extra "redis") and may be absent.
            redis_store: Any = importlib.import_module("idempotency_async.stores.redis")
        except ImportError as exc:
            raise CliError(
                "the Redis store is not available: install the redis extra "
                f"(pip install 'idempotency-async[redis]') ({exc})"
            ) from exc
        return redis_store.RedisStore.from_url(
            self.url, cluster=self.cluster, key_prefix=self.key_prefix
        )


def parse(parts: SplitResult) -> RedisTarget:
    if not parts.netloc:
        raise CliError(f"bad store URL {redact_url(parts.geturl())!r}: write redis://HOST:PORT/DB")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _STORE_OPTIONS:
            if name in ours:
                raise CliError(f"parameter {name!r} appears twice in the store URL")
            ours[name] = value
        else:
            rest.append((name, value))
    cluster = ours.get("cluster", "false").lower()
    if cluster not in _TRUE | _FALSE:
        raise CliError(f"cluster= in the store URL must be true or false, got {cluster!r}")
    url = parts._replace(query=urlencode(rest)).geturl()
    return RedisTarget(url, ours.get("key_prefix", ""), cluster in _TRUE)
