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

from bisect import bisect_left
from codecs import utf_16_be_encode
from collections.abc import Callable
from functools import partial
from itertools import islice, repeat
from operator import lt as _lt
from typing import Final, NamedTuple

CACHE_ENTRIES: Final = 512
CACHE_MAX_KEYS: Final = 64
CACHE_MAX_CHARS: Final = 1024
_MAX_ARRAY_INDEX: Final = 2**32 - 2

# Learning uses C-level tests over a whole key set at once: a key set is learned on every
# cold start and for every new shape, so it must cost less than the anchor's own sort.


class KeyOrder(NamedTuple):
    """How to write the members of an object with a given key tuple."""

    sortable: bool
    """orjson's code-point sort (``OPT_SORT_KEYS``) writes the keys in TypeScript order."""
    in_order: bool
    """The object's own key order already is the TypeScript order (nothing dropped)."""
    template: dict[str, None] | None
    """The keys in TypeScript order, ``__proto__`` dropped, as a dict that is never
    changed: ``template | node`` rebuilds ``node`` in that order at C speed (and appends a
    ``__proto__`` member, which the caller then deletes).  ``None`` when ``in_order``, and
    for a sortable entry until an object needs it (:func:`completed`)."""
    has_proto: bool
    """One of the keys is ``__proto__``."""


# The orders most key sets have, shared: learning them builds nothing.
_SORTABLE: Final = KeyOrder(True, False, None, False)
_IN_ORDER: Final = KeyOrder(False, True, None, False)

# ``KeyOrder(...)`` runs a Python-level ``__new__``; the tuple constructor does not.
_new_order: Final[Callable[[tuple[bool, bool, dict[str, None], bool]], KeyOrder]] = partial(
    tuple.__new__, KeyOrder
)

_cache: dict[tuple[str, ...], KeyOrder] = {}
cached_order = _cache.get
"""The cache lookup alone, bound once for the fast path's inner loop (``None`` on a miss)."""


def key_order(keys: tuple[object, ...]) -> KeyOrder | None:
    """The :class:`KeyOrder` of an object with these keys; ``None`` unless all are ``str``."""
    found = _cache.get(keys)  # type: ignore[arg-type]
    return found if found is not None else learn_order(keys)


def learn_order(keys: tuple[object, ...]) -> KeyOrder | None:
    """Compute a key tuple's :class:`KeyOrder` and keep it if it is small enough."""
    try:
        joined = "".join(keys)  # type: ignore[arg-type]
    except TypeError:
        return None  # a key that is not a str: the general path names it
    # (A str subclass passes: orjson refuses it as a key when the object is written, and
    # the general path then converts it.)
    strings: tuple[str, ...] = keys  # type: ignore[assignment]
    entry = _compute(strings, joined)
    if len(strings) <= CACHE_MAX_KEYS and len(joined) <= CACHE_MAX_CHARS:
        if len(_cache) >= CACHE_ENTRIES:
            _cache.clear()
        _cache[strings] = entry
    return entry


def completed(keys: tuple[str, ...], entry: KeyOrder) -> KeyOrder:
    """``entry`` ready to rebuild an object: with its template unless it is in order.

    Sortable entries are learned without either (writing with sorted keys needs neither);
    the first object that needs one builds it, and the cache keeps the completed entry.
    """
    if entry.in_order or entry.template is not None:
        return entry
    ordered = sorted(keys)  # a sortable entry's order is the code-point order
    done = KeyOrder(True, tuple(ordered) == keys, dict.fromkeys(ordered), False)
    if _cache.get(keys) is entry:  # kept only in place of the cached entry: no growth
        _cache[keys] = done
    return done


def clear_cache() -> None:
    """Forget every cached key order (tests use it to start cold)."""
    _cache.clear()


def cache_size() -> int:
    return len(_cache)


def ts_sort_key(key: str) -> bytes:
    """The TypeScript comparison key: big-endian UTF-16 of the lower-cased key."""
    # Big-endian UTF-16 bytes compare exactly as JavaScript compares code units.  (The
    # codec function itself: ``str.encode`` would look the codec and handler up by name.)
    return utf_16_be_encode(key.lower(), "surrogatepass")[0]


def is_array_index(key: str) -> bool:
    return (
        key.isascii()
        and key.isdigit()
        and (key == "0" or key[0] != "0")
        and int(key) <= _MAX_ARRAY_INDEX
    )


def ts_order(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The TypeScript order of ``keys``, computed directly (the reference for the cache).

    ``deepSort``'s stable sort by ``key.toLowerCase()`` as UTF-16 code units, then
    JavaScript's own property order (array indices first, ascending), ``__proto__``
    dropped.  Uncached: the general path's order, independent of :func:`learn_order`.
    """
    ordered = sorted(keys, key=ts_sort_key)
    indices = sorted((key for key in ordered if is_array_index(key)), key=int)
    rest = [key for key in ordered if not is_array_index(key) and key != "__proto__"]
    return (*indices, *rest)


def _compute(keys: tuple[str, ...], joined: str) -> KeyOrder:
    if not joined.isascii() or "__proto__" in joined:
        return _compute_any(keys, joined)
    # ASCII keys compare alike as code points and as UTF-16 code units, and lower-case
    # alike in Python and JavaScript.
    if joined.lower() == joined:
        # Nothing to lower-case: the TypeScript sort is the code-point sort, unless an
        # array index (digits only) moves to the front.
        if joined.isalpha() or not any(map(str.isdigit, keys)):
            return _SORTABLE
        return _compute_any(keys, joined)
    ordered = sorted(keys, key=str.lower)
    # Array indices are digits only: in this order they would sit where "0" does.
    at = bisect_left(ordered, "0", key=str.lower)
    if at < len(ordered) and "0" <= ordered[at][:1] <= "9":
        return _compute_any(keys, joined)
    if all(map(_lt, ordered, islice(ordered, 1, None))):  # also the code-point order
        return _SORTABLE
    if tuple(ordered) == keys:
        return _IN_ORDER
    return _new_order((False, False, dict.fromkeys(ordered), False))


def _compute_any(keys: tuple[str, ...], joined: str) -> KeyOrder:
    """:func:`_compute` for any key set: non-ASCII keys, array indices, ``__proto__``."""
    code_points = sorted(keys)
    ascii_only = joined.isascii()
    if ascii_only:
        ordered = sorted(keys, key=str.lower)
    else:
        lowered = joined.lower()
        if len(lowered.encode("utf-16-le", "surrogatepass")) == 2 * len(lowered):
            # No astral character: code points compare as UTF-16 code units do.
            ordered = sorted(keys, key=str.lower)
        else:
            # Astral characters: sort positions by each key's UTF-16 form (a stable sort),
            # every step at C speed.
            units = list(map(utf_16_be_encode, map(str.lower, keys), repeat("surrogatepass")))
            ordered = list(map(keys.__getitem__, sorted(range(len(keys)), key=units.__getitem__)))
    # Array indices are digits only, so they sort (by code point) between "0" and ":".
    first = bisect_left(code_points, "0")
    last = bisect_left(code_points, ":", first)
    if first < last:
        indices = _array_indices(code_points[first:last])
        if indices:
            if ascii_only and len(indices) == last - first:
                # Keys starting with a digit sit at the same places in both sorts (lower-
                # casing moves no key across "0" or ":"), and all of them are indices.
                rest = ordered[:first] + ordered[last:]
            else:
                taken = set(indices)
                rest = [key for key in ordered if key not in taken]
            ordered = indices + rest
    if "__proto__" in keys:
        ordered = [key for key in ordered if key != "__proto__"]
        return _new_order((False, False, dict.fromkeys(ordered), True))
    if ordered == code_points:
        return _SORTABLE
    if tuple(ordered) == keys:
        return _IN_ORDER
    return _new_order((False, False, dict.fromkeys(ordered), False))


def _array_indices(digits: list[str]) -> list[str]:
    """The array indices among keys starting with an ASCII digit (code-point sorted), in
    ascending numeric order."""
    indices = [key for key in filter(str.isdigit, digits) if key.isascii()]
    if indices and indices[0][0] == "0":  # leading zeros: only "0" itself is an index
        ones = bisect_left(indices, "1")
        indices = indices[ones:] if indices[0] != "0" else ["0", *indices[ones:]]
    if indices and max(map(len, indices)) >= 10:
        indices = [key for key in indices if int(key) <= _MAX_ARRAY_INDEX]
    # Without leading zeros, numeric order is by length, then by code point (a stable sort).
    indices.sort(key=len)
    return indices
