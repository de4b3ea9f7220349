"""Canonical JSON text and digests, byte-compatible with the TypeScript Powertools port.

The TypeScript port hashes ``JSON.stringify(deepSort(value))``.  This package produces
the same text for the same JSON value, and rejects what it cannot hash faithfully.  Pure
functions: no I/O; the only state is a bounded cache of key orders.

Its modules, one idea each:

* ``_text`` — :func:`canonical_json` / :func:`canonical_bytes`: fast path, else general
  (:func:`canonical_digester`: the same, hashed, as one function for hot paths);
* ``_fast`` — orjson writes the text after one pass that patches what it would get wrong;
* ``_general`` — the TypeScript rules ported directly; every error comes from here;
* ``_orders`` — TypeScript key order and the cache of it (bound, thread safety);
* ``_numbers`` — numbers as JavaScript prints them;
* ``_digests`` — Base64 digests and the record key.
"""

from idempotency_async.canonical._digests import (
    HASH_ALGORITHMS,
    digest,
    digest_bytes,
    digester,
    idempotency_key,
)
from idempotency_async.canonical._general import MAX_DEPTH, Serializer
from idempotency_async.canonical._numbers import js_number
from idempotency_async.canonical._text import canonical_bytes, canonical_digester, canonical_json

__all__ = [
    "HASH_ALGORITHMS",
    "MAX_DEPTH",
    "Serializer",
    "canonical_bytes",
    "canonical_digester",
    "canonical_json",
    "digest",
    "digest_bytes",
    "digester",
    "idempotency_key",
    "js_number",
]
