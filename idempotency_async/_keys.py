"""Key derivation: from a payload to its idempotency key and validation hash.

One derivation for every entry point — ``Manager.execute``, ``Manager.key_for`` and the
integrations — so a key printed by one is the key stored by the others.  The key format
is chosen once, by :func:`key_deriver`: the TypeScript-compatible :class:`KeyDeriver`,
or :class:`PowertoolsPythonKeyDeriver` for ``Options(key_format="powertools-python")``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idempotency_async._key_formats import POWERTOOLS_PYTHON
from idempotency_async._prefixes import has_explicit_prefix
from idempotency_async.canonical import (
    canonical_bytes,
    canonical_digester,
    digester,
    idempotency_key,
)
from idempotency_async.errors import KeyMissingError, PayloadError, PayloadValidationError
from idempotency_async.options import Options
from idempotency_async.selection import (
    PowertoolsFunctions,
    PowertoolsPythonFunctions,
    Selector,
    compile_expression,
    is_missing,
)

if TYPE_CHECKING:
    from jmespath.functions import Functions

__all__ = ["KeyDeriver", "Keys", "PowertoolsPythonKeyDeriver", "function_prefix", "key_deriver"]

_log = logging.getLogger("idempotency_async")


class Keys:
    """The key of one call and its validation hash, derived before any I/O and never
    changed after: only :meth:`KeyDeriver.derive` makes them, ``Keys()`` then both slots.

    A slotted class, not a NamedTuple: a call reads its key a dozen times, and a slot reads
    at a third of the cost of a NamedTuple field (Python 3.11); made without an
    ``__init__`` frame, it also costs half as much to build."""

    __slots__ = ("key", "validation")

    key: str
    validation: str | None

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Keys:
            return NotImplemented
        assert isinstance(other, Keys)
        return self.key == other.key and self.validation == other.validation

    def __hash__(self) -> int:
        return hash((self.key, self.validation))

    def __repr__(self) -> str:
        return f"Keys(key={self.key!r}, validation={self.validation!r})"


class KeyDeriver:
    """Selects, canonicalises and hashes payloads as one manager's options say."""

    def __init__(self, options: Options) -> None:
        self._options = options
        functions = options.jmespath_functions or self._default_functions()
        self._key_selector = Selector(
            compile_expression(options.event_key_jmespath, option="event_key_jmespath"),
            functions,
        )
        validation = compile_expression(
            options.payload_validation_jmespath, option="payload_validation_jmespath"
        )
        self._validation_selector = None if validation is None else Selector(validation, functions)
        self.prefix = options.resolved_prefix()
        self._hasher = self._make_hasher(options.hash_function)
        self._strict_integers = options.integer_precision == "strict"
        # Resolved once: ``derive`` runs on every call, and on a small payload the calls
        # around the hash cost as much as the hash.
        self._select = None if self._key_selector.expression is None else self._key_selector.select
        self._strict_missing = options.strict_missing_key
        self._plain = options.serialize_key is None
        self._serializer = options.serializer or _model_serializer
        self._digest = self._make_digest(options)
        # ``idempotency_key`` is the key's one spelling: its head is what precedes the digest.
        self._head = idempotency_key(self.prefix, "")

    def _default_functions(self) -> Functions:
        return PowertoolsFunctions()

    def _make_hasher(self, algorithm: str) -> Callable[[bytes], str]:
        return digester(algorithm)

    def _make_digest(self, options: Options) -> Callable[[Any], str]:
        """What :meth:`derive` hashes a selection with: canonical JSON and the digest in one
        function (no frame between them), or :meth:`_hash` with ``serialize_key``."""
        if not self._plain:
            return self._hash
        return canonical_digester(
            options.hash_function,
            serializer=self._serializer,
            strict_integers=self._strict_integers,
        )

    def derive(self, payload: Any) -> Keys | None:
        """The keys of ``payload``; None when it selects no key and that is allowed."""
        select = self._select
        selected = payload if select is None else select(payload)
        if is_missing(selected, strict=self._strict_missing):
            self._no_key()
            return None
        keys = Keys()
        keys.key = self._head + self._digest(selected)
        keys.validation = None
        if self._validation_selector is not None:
            keys.validation = self._digest(self._validation_selector.select(payload))
        return keys

    def _no_key(self) -> None:
        """Raise KeyMissingError, or warn that the call runs without idempotency."""
        options = self._options
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

    def validate(self, stored: str | None, keys: Keys) -> None:
        """Raise PayloadValidationError when a stored validation hash differs from ours."""
        if keys.validation is not None and stored is not None and stored != keys.validation:
            self._mismatch(keys)

    def _mismatch(self, keys: Keys) -> None:
        raise PayloadValidationError(
            f"key {keys.key} was used before with a different payload "
            f"(payload_validation_jmespath={self._options.payload_validation_jmespath!r}): "
            "use a new key for a new request",
            key=keys.key,
        )

    def _hash(self, value: Any) -> str:
        if self._plain:
            data = canonical_bytes(
                value, serializer=self._serializer, strict_integers=self._strict_integers
            )
        else:
            text = self._options.serialize_key(value)  # type: ignore[misc]
            data = text.encode() if isinstance(text, str) else text
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


class PowertoolsPythonKeyDeriver(KeyDeriver):
    """The keys and validation hashes aws-lambda-powertools (Python) 3.x derives.

    See :mod:`idempotency_async._powertools_python` for the rules, and
    ``Options.powertools_version`` for the releases that changed them.
    """

    def __init__(self, options: Options) -> None:
        # Imported here, not at the top: only this key format pays for its rules.
        from idempotency_async import _powertools_python as python_rules

        super().__init__(options)
        self._rules = python_rules.Rules.of(python_rules.parse_version(options.powertools_version))
        self._encode = python_rules.key_encoder(options.serializer)

    def _default_functions(self) -> Functions:
        return PowertoolsPythonFunctions()

    def _make_digest(self, options: Options) -> Callable[[Any], str]:
        return self._hash  # unused: this format derives with its own rules (derive below)

    def _make_hasher(self, algorithm: str) -> Callable[[bytes], str]:
        from idempotency_async._powertools_python import hex_digester

        return hex_digester(algorithm)

    def derive(self, payload: Any) -> Keys | None:
        data = self._rules.prepare(payload)
        selected = self._key_selector.select(data)
        if self._rules.is_missing(selected):
            self._no_key()
            return None
        keys = Keys()
        keys.key = f"{self.prefix}#{self._hash(selected)}"
        keys.validation = None
        if self._validation_selector is not None:
            keys.validation = self._hash(self._validation_selector.select(data))
        return keys

    def validate(self, stored: str | None, keys: Keys) -> None:
        # Powertools compares whenever validation is configured: a record without a
        # validation hash does not match one with it.
        if keys.validation is not None and stored != keys.validation:
            self._mismatch(keys)

    def _hash(self, value: Any) -> str:
        serialize_key = self._options.serialize_key
        if serialize_key is not None:
            return super()._hash(value)
        return self._hasher(self._encode(value).encode())


def key_deriver(options: Options) -> KeyDeriver:
    """The derivation ``options.key_format`` names (chosen once, off the hot path)."""
    if options.key_format == POWERTOOLS_PYTHON:
        return PowertoolsPythonKeyDeriver(options)
    return KeyDeriver(options)


def function_prefix(options: Options, func: Callable[..., object], *, handler: bool) -> str | None:
    """The key prefix of a decorated function, or None to keep the manager's own.

    An explicit ``key_prefix`` always wins.  Otherwise ``idempotent_function`` appends the
    function's ``<module>.<qualname>`` to the manager's prefix; with
    ``key_format="powertools-python"`` both decorators build Powertools' prefix,
    ``<AWS_LAMBDA_FUNCTION_NAME or "test-func">.<module>.<qualname>`` — the Lambda handler
    too (``handler=True``), which in the TypeScript format keeps the function's prefix.
    """
    if has_explicit_prefix(options.key_prefix, options.key_format):
        return None
    name = f"{func.__module__}.{func.__qualname__}"
    if options.key_format == POWERTOOLS_PYTHON:
        from idempotency_async._powertools_python import prefix_for

        return prefix_for(name)
    if handler:
        return None
    base = options.resolved_prefix()
    return f"{base}.{name}" if base else name
