"""Digests of canonical text: padded standard Base64, as the TypeScript port writes them."""

from __future__ import annotations

import binascii
import hashlib
import importlib
from collections.abc import Callable
from typing import Any, Final

from idempotency_async.errors import ConfigError

HASH_ALGORITHMS: Final = frozenset({"md5", "sha1", "sha256", "sha384", "sha512"})

SMALL_INPUT: Final = 2048
"""Below this many bytes (most keys' canonical texts) :func:`small_constructor` hashes:
short of where OpenSSL's MD5 overtakes CPython's own (about 3 KB)."""


def _builtin_md5() -> Callable[[bytes], Any] | None:
    try:
        return importlib.import_module("_md5").md5  # type: ignore[no-any-return]
    except (ImportError, AttributeError):  # a build without CPython's own hashes
        return None


# CPython's own MD5: OpenSSL's constructor looks its algorithm up on every call, which costs
# twice the hash of a key's short text; from about 3 KB on, OpenSSL's hash is the faster.
# The same digest either way.
_SMALL: Final[dict[str, Callable[[bytes], Any]]] = {
    name: new for name, new in (("md5", _builtin_md5()),) if new is not None
}


def _base64_of(
    new: Callable[[bytes], Any], small: Callable[[bytes], Any]
) -> Callable[[bytes], str]:
    def digest_of(data: bytes) -> str:
        hashed = (small if len(data) < SMALL_INPUT else new)(data)
        return binascii.b2a_base64(hashed.digest(), newline=False).decode("ascii")

    return digest_of


# The named constructors are faster than ``hashlib.new``, which matters for small payloads;
# one function per algorithm, built once, so no call pays for resolving the name.
_CONSTRUCTORS: Final[dict[str, Callable[[bytes], Any]]] = {
    "md5": hashlib.md5,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}
_DIGESTERS: Final[dict[str, Callable[[bytes], str]]] = {
    name: _base64_of(new, _SMALL.get(name, new)) for name, new in _CONSTRUCTORS.items()
}


def hash_constructor(algorithm: str) -> Callable[[bytes], Any]:
    """The ``hashlib`` constructor of ``algorithm`` (ConfigError for an unknown one)."""
    digester(algorithm)  # the one check, and its message
    return _CONSTRUCTORS[algorithm]


def small_constructor(algorithm: str) -> Callable[[bytes], Any]:
    """The constructor of ``algorithm`` for inputs under :data:`SMALL_INPUT` bytes: the
    fastest there, and :func:`hash_constructor`'s unless CPython has its own."""
    return _SMALL.get(algorithm) or hash_constructor(algorithm)


def digester(algorithm: str = "md5") -> Callable[[bytes], str]:
    """The function :func:`digest_bytes` applies for ``algorithm``, resolved once (hot paths)."""
    found = _DIGESTERS.get(algorithm)
    if found is None:
        raise ConfigError(
            f"unknown hash algorithm {algorithm!r}: use one of {', '.join(sorted(HASH_ALGORITHMS))}"
        )
    return found


def digest(text: str | bytes, algorithm: str = "md5") -> str:
    """Padded standard Base64 of the ``algorithm`` digest of ``text`` (UTF-8)."""
    data = text.encode() if type(text) is str else text
    found = _DIGESTERS.get(algorithm)
    return found(data) if found is not None else digester(algorithm)(data)  # type: ignore[arg-type]


def digest_bytes(data: bytes, algorithm: str = "md5") -> str:
    """:func:`digest` of bytes."""
    found = _DIGESTERS.get(algorithm)
    return found(data) if found is not None else digester(algorithm)(data)


def idempotency_key(prefix: str, value_digest: str) -> str:
    """The record key ``<prefix>#<digest>`` (``#<digest>`` with an empty prefix)."""
    return f"{prefix}#{value_digest}"
