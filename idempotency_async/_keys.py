"""Key derivation: from a payload to its idempotency key and validation hash.

One derivation for every entry point — ``Manager.execute``, ``Manager.key_for`` and the
integrations — so a key printed by one is the key stored by the others.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from idempotency_async.canonical import canonical_bytes, digester, idempotency_key
from idempotency_async.errors import KeyMissingError, PayloadError, PayloadValidationError
from idempotency_async.options import Options
from idempotency_async.selection import (
    PowertoolsFunctions,
    Selector,
    compile_expression,
    is_missing,
)

__all__ = ["KeyDeriver", "Keys"]

_log = logging.getLogger("idempotency_async")


class Keys(NamedTuple):
    """The key of one call and its validation hash, frozen before any I/O."""

    key: str
    validation: str | None


class KeyDeriver:
    """Selects, canonicalises and hashes payloads as one manager's options say."""

    def __init__(self, options: Options) -> None:
        self._options = options
        functions = options.jmespath_functions or PowertoolsFunctions()
        self._key_selector = Selector(
            compile_expression(options.event_key_jmespath, option="event_key_jmespath"),
            functions,
        )
        validation = compile_expression(
            options.payload_validation_jmespath, option="payload_validation_jmespath"
        )
        self._validation_selector = None if validation is None else Selector(validation, functions)
        self.prefix = options.resolved_prefix()
        self._hasher = digester(options.hash_function)
        self._strict_integers = options.integer_precision == "strict"

    def derive(self, payload: Any) -> Keys | None:
        """The keys of ``payload``; None when it selects no key and that is allowed."""
        options = self._options
        selected = self._key_selector.select(payload)
        if is_missing(selected, strict=options.strict_missing_key):
            if options.raise_on_no_key:
                raise KeyMissingError(
                    f"no idempotency key in the payload (event_key_jmespath="
                    f"{options.event_key_jmespath!r} selected nothing): send the field, or "
                    "unset raise_on_no_key to run such calls without idempotency"
                )
            _log.warning(
                "no idempotency key in the payload: running without idempotency",
                extra={"event_key_jmespath": str(options.event_key_jmespath)},
            )
            return None
        key = idempotency_key(self.prefix, self._hash(selected))
        validation = None
        if self._validation_selector is not None:
            validation = self._hash(self._validation_selector.select(payload))
        return Keys(key, validation)

    def validate(self, stored: str | None, keys: Keys) -> None:
        """Raise PayloadValidationError when a stored validation hash differs from ours."""
        if keys.validation is not None and stored is not None and stored != keys.validation:
            raise PayloadValidationError(
                f"key {keys.key} was used before with a different payload "
                f"(payload_validation_jmespath={self._options.payload_validation_jmespath!r}): "
                "use a new key for a new request",
                key=keys.key,
            )

    def _hash(self, value: Any) -> str:
        serialize_key = self._options.serialize_key
        if serialize_key is not None:
            text = serialize_key(value)
            data = text.encode() if isinstance(text, str) else text
        else:
            data = canonical_bytes(
                value,
                serializer=self._options.serializer or _model_serializer,
                strict_integers=self._strict_integers,
            )
        return self._hasher(data)


def _model_serializer(value: Any) -> Any:
    """Default hook for payload objects: pydantic models dump to JSON values."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise PayloadError(
        f"{type(value).__name__} in the payload is not JSON: convert it first, or pass "
        "Options(serializer=...) that turns it into JSON values"
    )
