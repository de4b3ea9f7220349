"""The one way an integration derives its manager from the manager it is given.

An integration *owns* some options (how its payloads are keyed and validated, how its
results are encoded and presented): it sets them itself, and finding one already set on
the given manager is a :class:`~idempotency_async.errors.ConfigError` — the user's value
would otherwise be silently replaced.  Every other option is kept as the user set it.
The derived manager shares the store; it has its own local cache and in-flight table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from idempotency_async.errors import ConfigError
from idempotency_async.manager import Manager

__all__ = ["HTTP_OWNED", "derive"]

HTTP_OWNED = (
    "event_key_jmespath",
    "payload_validation_jmespath",
    "serialize_key",
    "response_codec",
    "response_hook",
    "redaction",
)
"""What the HTTP middleware owns: the key is the request's scope, the validation its
fingerprint, and the stored value is the response as the middleware encodes it (and
redacts it: the middleware's own ``redaction`` names header and body fields)."""


def derive(
    manager: Manager,
    integration: str,
    owned: Mapping[str, Any],
    *,
    kept: Mapping[str, Any] | None = None,
) -> Manager:
    """A manager over ``manager``'s store: ``owned`` options set by the integration (an
    error when the user set any of them), ``kept`` ones adjusted (e.g. the integration's
    own ``wait`` argument), every other option as ``manager`` has it."""
    if not isinstance(manager, Manager):
        raise ConfigError(f"{integration} needs an idempotency_async.Manager, got {manager!r}")
    options = manager.options
    clashing = [name for name in owned if getattr(options, name) is not None]
    if clashing:
        names = ", ".join(clashing)
        raise ConfigError(
            f"{integration} sets {names} itself; remove {'it' if len(clashing) == 1 else 'them'} "
            "from the Options of the manager you pass (every other option is kept)"
        )
    changes = {**owned, **(kept or {})}
    if not changes:
        return manager
    return Manager(manager.store, dataclasses.replace(options, **changes))
