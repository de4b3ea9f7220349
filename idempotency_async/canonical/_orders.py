"""Key order: how the TypeScript port orders an object's members, and the cache of it.

``deepSort`` sorts keys by ``key.toLowerCase()`` compared as UTF-16 code units, stably
(keys equal after lower-casing keep their input order); then ``JSON.stringify`` applies
JavaScript's own property order, which puts array-index keys (canonical decimal integers
0 … 4294967294) first, ascending by value.  A ``__proto__`` key never survives.

orjson's ``OPT_SORT_KEYS`` sorts by code point instead.  For most objects the two orders
agree (a camelCase API, lower-case headers); for the others (``{"Tier", "id"}``, index
keys, some non-ASCII keys) the fast path writes the members in this order itself.

The cache
---------
:func:`key_order` maps an object's key tuple (in its own order) to a :class:`KeyOrder`.
It is the only cache in the canonical package.

* **Bound**: at most :data:`CACHE_ENTRIES` key tuples, each of at most
  :data:`CACHE_MAX_KEYS` keys and :data:`CACHE_MAX_CHARS` characters; larger key sets are
  computed on every use and never kept.  When full, the cache is emptied and refills from
  the next payloads (an entry costs one sort to recompute).  Worst case about 7 MiB
  (measured: 512 tuples of 64 astral-plane keys), typically a few KiB: a service sees a
  handful of object shapes.
* **Thread safety**: no lock.  A lookup and an insert are each one dict operation,
  atomic under the GIL (and under the per-object locks of free-threaded builds).  Entries
  are immutable and a pure function of their key, so racing threads at worst compute one
  entry twice, and a clear racing an insert only drops entries that are recomputed.
"""

from __future__ import annotations

from typing import Final, NamedTuple

CACHE_ENTRIES: Final = 512
CACHE_MAX_KEYS: Final = 64
CACHE_MAX_CHARS: Final = 1024
_MAX_ARRAY_INDEX: Final = 2**32 - 2


class KeyOrder(NamedTuple):
    """How to write the members of an object with a given key tuple."""

    sortable: bool
    """orjson's code-point sort (``OPT_SORT_KEYS``) writes the keys in TypeScript order."""
    in_order: bool
    """The object's own key order already is the TypeScript order (nothing dropped)."""
    template: dict[str, None]
    """The keys in TypeScript order, ``__proto__`` dropped, as a dict that is never
    changed: ``template | node`` rebuilds ``node`` in that order at C speed (and appends a
    ``__proto__`` member, which the caller then deletes)."""
    has_proto: bool
    """One of the keys is ``__proto__``."""


_cache: dict[tuple[str, ...], KeyOrder] = {}
cached_order = _cache.get
"""The cache lookup alone, bound once for the fast path's inner loop (``None`` on a miss)."""


def key_order(keys: tuple[object, ...]) -> KeyOrder | None:
    """The :class:`KeyOrder` of an object with these keys; ``None`` unless all are ``str``."""
    found = _cache.get(keys)  # type: ignore[arg-type]
    return found if found is not None else learn_order(keys)


def learn_order(keys: tuple[object, ...]) -> KeyOrder | None:
    """Compute a key tuple's :class:`KeyOrder` and keep it if it is small enough."""
    if not all(type(key) is str for key in keys):
        return None  # the general path names a non-string key and converts str subclasses
    strings: tuple[str, ...] = keys  # type: ignore[assignment]
    joined = "".join(strings)
    entry = _compute(strings, joined.isascii())
    if len(strings) <= CACHE_MAX_KEYS and len(joined) <= CACHE_MAX_CHARS:
        if len(_cache) >= CACHE_ENTRIES:
            _cache.clear()
        _cache[strings] = entry
    return entry


def clear_cache() -> None:
    """Forget every cached key order (tests use it to start cold)."""
    _cache.clear()


def cache_size() -> int:
    return len(_cache)


def ts_sort_key(key: str) -> bytes:
    """The TypeScript comparison key: big-endian UTF-16 of the lower-cased key."""
    # Big-endian UTF-16 bytes compare exactly as JavaScript compares code units.
    return key.lower().encode("utf-16-be", "surrogatepass")


def is_array_index(key: str) -> bool:
    return (
        key.isascii()
        and key.isdigit()
        and (key == "0" or key[0] != "0")
        and int(key) <= _MAX_ARRAY_INDEX
    )


def _compute(keys: tuple[str, ...], ascii_only: bool) -> KeyOrder:
    # ASCII keys compare alike as code points and as UTF-16 code units, and lower-case
    # alike in Python and JavaScript, so the C-level ``str.lower`` is the whole sort key.
    ordered = sorted(keys, key=str.lower if ascii_only else ts_sort_key)
    if any(map(str.isdigit, keys)):
        indices = [key for key in ordered if is_array_index(key)]
        if indices:
            indices.sort(key=int)
            ordered = indices + [key for key in ordered if not is_array_index(key)]
    sortable = ordered == sorted(keys)
    has_proto = "__proto__" in keys
    if has_proto:
        ordered.remove("__proto__")
        sortable = False
    return KeyOrder(sortable, tuple(ordered) == keys, dict.fromkeys(ordered), has_proto)
