"""The canonical fast path: what it covers, that it matches the general path, its cache."""

from __future__ import annotations

import copy
import enum
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from _canonical_cases import EDGE_FLOATS, SPECIAL_KEYS
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_async.canonical import _orders, canonical_bytes, canonical_json, js_number
from idempotency_async.canonical._fast import fast_bytes
from idempotency_async.canonical._general import general_bytes
from idempotency_async.canonical._numbers import js_float
from idempotency_async.errors import PayloadError

EVENTS = Path(__file__).parent / "events"


def rest_v1_event() -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "api_gateway_rest_v1.json").read_text())
    extra = {"accept": "application/json", "x-api-key": "k-1", "Idempotency-Key": "x"}
    event["headers"].update(extra)
    event["multiValueHeaders"].update({name: [value] for name, value in extra.items()})
    return event


SHAPES: dict[str, Any] = {
    "mixed case": {"Tier": "gold", "id": "ord-1", "Amount": 42.5, "currency": "EUR"},
    "case collisions": {"id": 1, "ID": 2, "Id": 3, "b": 4, "A": 5},
    "index keys": {"10": "a", "9": "b", "b": 1, "A": 2, "01": 3, "4294967295": 4, "0": 5},
    "astral and high BMP": {"\uff5a": 1, "\U0001f600": 2, "\U00010400": 3, "a": 4},
    "case specials": {"ß": 1, "SS": 2, "\u0130": 3, "j": 4, "i": 5, "\u03a3": 6, "\u212a": 7},
    "proto": {"B": {"__proto__": 1, "a": 2}, "a": {"__proto__": {"x": 1}}},
    "floats": {"f": [1e21, 5e-324, 1e-7, 2.5e-6, 132.0, -0.0, 1e16, 1.5e17, 0.1]},
    "REST v1 event": rest_v1_event(),
    "mixed case deep in a consistent payload": {
        "orders": [{"orderId": n, "price": n + 0.5} for n in range(20)],
        "zHeaders": {"Host": "h", "accept": "a", "X-Trace": "t"},
    },
    "mixed case nested in mixed case": {
        "Orders": [{"Sku": "s", "qty": 1, "Lines": [{"No": 1, "id": 2.0}]}] * 3,
        "batch": 1,
    },
}


@pytest.mark.parametrize("value", SHAPES.values(), ids=list(SHAPES))
def test_fast_path_takes_real_payload_shapes_and_matches_the_general_path(value: Any) -> None:
    before = copy.deepcopy(value)
    fast = fast_bytes(value)
    assert fast is not None, "the fast path declined a plain JSON value"
    assert fast == general_bytes(value)
    assert value == before  # reordering and patching never touch the caller's value


def test_typescript_order_examples() -> None:
    assert canonical_json({"Tier": 1, "id": 2}) == '{"id":2,"Tier":1}'
    # Keys equal after lower-casing keep their input order, in either input order.
    assert canonical_json({"id": 1, "ID": 2, "Id": 3}) == '{"id":1,"ID":2,"Id":3}'
    assert canonical_json({"Id": 3, "id": 1, "ID": 2}) == '{"Id":3,"id":1,"ID":2}'
    # Array-index keys first, numerically; "01" and 2**32-1 are not indices.
    assert canonical_json({"b": 0, "10": 1, "01": 2, "9": 3, "4294967295": 4}) == (
        '{"9":3,"10":1,"01":2,"4294967295":4,"b":0}'
    )
    # UTF-16 code units: an astral key (a surrogate pair, D83D…) sorts before U+FF5A.
    assert canonical_json({"\uff5a": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\uff5a":1}'
    assert canonical_json({"a": {"__proto__": 1, "B": 2, "a": 3}}) == '{"a":{"a":3,"B":2}}'


def test_a_mixed_case_object_is_embedded_without_resorting_its_members() -> None:
    # Its subtree is written in TypeScript order by a separate orjson call; the
    # surrounding object is still sorted by orjson, and the two must agree.
    value = {"z": {"Host": {"B": 1, "a": 2}, "accept": [{"Y": 1, "x": 2}]}, "a": 1.0}
    assert canonical_json(value) == ('{"a":1,"z":{"accept":[{"x":2,"Y":1}],"Host":{"a":2,"B":1}}}')


# ------------------------------------------------------------------------------ coverage

PLAIN_KEYS = st.one_of(st.text(max_size=6), st.sampled_from(SPECIAL_KEYS)).filter(
    lambda key: not any("\ud800" <= char <= "\udfff" for char in key)
)
PLAIN_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EDGE_FLOATS),
    st.text(max_size=8).filter(lambda text: not any("\ud800" <= c <= "\udfff" for c in text)),
)
PLAIN_VALUES = st.recursive(
    PLAIN_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(PLAIN_KEYS, inner)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(PLAIN_VALUES)
def test_fast_path_never_declines_plain_json(value: Any) -> None:
    # Mixed case, Unicode, index keys, every float and integers within 2**53: all fast.
    fast = fast_bytes(value)
    assert fast is not None
    assert fast == general_bytes(value)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(EDGE_FLOATS)))
def test_js_float_makes_orjson_print_what_javascript_prints(value: float) -> None:
    assert orjson.dumps(js_float(value)).decode() == js_number(value)


def test_installed_orjson_prints_exponents_as_javascript() -> None:
    # The fast path leaves these to orjson (requires orjson >= 3.11.7).
    for value, text in [(1e21, b"1e+21"), (1.5e300, b"1.5e+300"), (1e-7, b"1e-7")]:
        assert orjson.dumps(value) == text
    assert js_float(math.nan) is None
    assert js_float(-math.inf) is None


# ------------------------------------------------------------------------------ the cache

KEY_SETS = st.lists(
    st.one_of(
        st.sampled_from(SPECIAL_KEYS),
        st.text(alphabet="aAbBzZ_[`-0123456789:$", max_size=5),
        st.text(max_size=4).filter(lambda key: not any("\ud800" <= c <= "\udfff" for c in key)),
    ),
    unique=True,
    max_size=12,
)


def _learned(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The order the cache writes an object with ``keys`` in (cold, then completed)."""
    entry = _orders.learn_order(keys)
    assert entry is not None
    done = _orders.completed(keys, entry)
    assert done.sortable == entry.sortable
    if done.in_order:
        return keys
    assert done.template is not None
    written = tuple(done.template)
    if entry.sortable:
        assert written == tuple(sorted(keys))  # what orjson's OPT_SORT_KEYS writes
    return written


@settings(max_examples=300, deadline=None)
@given(KEY_SETS)
def test_learned_orders_are_the_typescript_order(keys: list[str]) -> None:
    # The cache's shortcuts (ASCII without capitals, one sort, shared entries completed on
    # first use) against the reference port of deepSort, which the general path uses.
    _orders.clear_cache()
    key_tuple = tuple(keys)
    expected = _orders.ts_order(key_tuple)
    assert _learned(key_tuple) == expected
    assert _learned(key_tuple) == expected  # warm: the completed entry the cache kept


def test_str_subclass_keys_get_the_general_paths_text() -> None:
    # Learning a key set no longer checks each key's type (a join refuses non-strings);
    # orjson refuses a str subclass as a key, so the fast path declines such an object in
    # every mode (sorted, rebuilt, already in order) and the general path decides.
    class Field(str, enum.Enum):  # noqa: UP042 (not StrEnum: its str() is "Field.TIER")
        TIER = "Tier"

    class Label(str):
        pass

    _orders.clear_cache()
    for value in (
        {Field.TIER: 1, "id": 2},
        {"id": 2, Field.TIER: 1},
        {Label("b"): 1, "a": 2},
        {"a": {Label("B"): 1, "a": 2}, "Z": [{Label("x"): 1}]},
    ):
        assert fast_bytes(value) is None
        assert canonical_bytes(value) == general_bytes(value)
    # Written as their text (an Enum member as its value), never a KeyError.
    assert canonical_json({Field.TIER: 1, "id": 2}) == '{"id":2,"Tier":1}'

    class Distinct(str):  # equal to nothing but itself: "a" stays a key of its own
        def __eq__(self, other: object) -> bool:
            return self is other

        def __hash__(self) -> int:
            return 1

    with pytest.raises(PayloadError, match="two keys written as 'a'"):
        canonical_json({Distinct("a"): 1, "a": 2})


def test_reference_order_examples() -> None:
    # The reference itself, on the rules the TypeScript vectors exercise.
    assert _orders.ts_order(("Tier", "id", "Amount")) == ("Amount", "id", "Tier")
    assert _orders.ts_order(("ID", "id", "j")) == ("ID", "id", "j")
    assert _orders.ts_order(("id", "ID")) == ("id", "ID")
    assert _orders.ts_order(("b", "10", "01", "9", "__proto__")) == ("9", "10", "01", "b")
    assert _orders.ts_order(("\uff5a", "\U0001f600")) == ("\U0001f600", "\uff5a")


def test_cache_stays_within_its_bound_and_skips_large_key_sets() -> None:
    _orders.clear_cache()
    for n in range(_orders.CACHE_ENTRIES + 50):
        value = {f"Key{n}": 1, f"key{n}b": 2}
        assert canonical_bytes(value) == general_bytes(value)
        assert _orders.cache_size() <= _orders.CACHE_ENTRIES
    _orders.clear_cache()
    wide = {f"K{n}": n for n in range(_orders.CACHE_MAX_KEYS + 1)}
    long = {"x" * (_orders.CACHE_MAX_CHARS + 1): 1, "B": 2}
    assert canonical_bytes(wide) == general_bytes(wide)
    assert canonical_bytes(long) == general_bytes(long)
    assert _orders.cache_size() == 0


def test_threads_share_the_cache_while_it_is_cleared() -> None:
    values = [*SHAPES.values(), *({f"K{n}": n, f"k{n}x": [n]} for n in range(200))]
    expected = [general_bytes(value) for value in values]
    wrong: list[Any] = []
    stop = threading.Event()

    def hash_all() -> None:
        for _ in range(5):
            for value, text in zip(values, expected, strict=True):
                if canonical_bytes(value) != text:
                    wrong.append(value)

    def clear() -> None:
        while not stop.is_set():
            _orders.clear_cache()

    clearer = threading.Thread(target=clear)
    clearer.start()
    workers = [threading.Thread(target=hash_all) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    clearer.join()
    assert wrong == []


def test_deep_value_from_a_deep_caller_falls_back_instead_of_overflowing() -> None:
    # 190 levels (within the fast path's depth limit) take ~290 Python frames.
    value: Any = 1.0
    for depth in range(95):
        value = {f"K{depth}": [value], "a": 0}

    def call_at_depth(levels: int) -> bytes:
        return call_at_depth(levels - 1) if levels else canonical_bytes(value)

    assert fast_bytes(value) == general_bytes(value)
    assert call_at_depth(sys.getrecursionlimit() - 150) == general_bytes(value)
