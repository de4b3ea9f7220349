"""Canonical JSON: TypeScript vectors, JavaScript numbers, errors, and fast == general."""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _canonical_cases import EDGE_FLOATS, SPECIAL_KEYS
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_async._json import loads_strict
from idempotency_async.canonical import (
    MAX_DEPTH,
    _orders,
    canonical_bytes,
    canonical_digester,
    canonical_json,
    digest,
    digest_bytes,
    idempotency_key,
    js_number,
)
from idempotency_async.canonical._digests import SMALL_INPUT
from idempotency_async.canonical._fast import fast_bytes
from idempotency_async.canonical._general import general_bytes
from idempotency_async.errors import ConfigError, PayloadError

VECTORS = json.loads((Path(__file__).parent / "data" / "ts_canonical_vectors.json").read_text())
LONE_SURROGATE = '{"lone":"\\ud800x\\udfff"}'
DUPLICATE_MEMBER = '{"a":1,"a":2,"b":3}'
VALID = [case for case in VECTORS if case["input_json"] not in (LONE_SURROGATE, DUPLICATE_MEMBER)]


def general(value: Any) -> bytes:
    return general_bytes(value)


# ------------------------------------------------------------------------------ vectors


def test_vector_file_has_the_two_rejected_cases() -> None:
    assert len(VECTORS) == 34
    assert len(VALID) == 32


@pytest.mark.parametrize("case", VALID, ids=lambda case: case["input_json"][:40])
def test_vector_matches_typescript_byte_for_byte(case: dict[str, str]) -> None:
    value = loads_strict(case["input_json"])
    text = canonical_json(value)
    assert text == case["canonical"]
    assert digest(text) == case["md5_b64"]
    assert digest(text, "sha256") == case["sha256_b64"]
    assert general(value) == case["canonical"].encode()
    # The fast path takes every vector but those with integers beyond 2**53.
    assert fast_bytes(value) in (case["canonical"].encode(), None)
    assert fast_bytes(value) is not None or '"big1":' in case["input_json"]


def test_vector_with_lone_surrogate_is_rejected() -> None:
    value = json.loads(LONE_SURROGATE)
    with pytest.raises(PayloadError, match=r"lone surrogate") as info:
        canonical_json(value)
    assert info.value.path == "$.lone"


def test_vector_with_duplicate_member_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"'a' twice"):
        loads_strict(DUPLICATE_MEMBER)


# ------------------------------------------------------------------------------ numbers

JS_NUMBERS = [
    (1e21, "1e+21"),
    (1e-7, "1e-7"),
    (1e-6, "0.000001"),
    (123e-20, "1.23e-18"),
    (0.1 + 0.2, "0.30000000000000004"),
    (float(2**53 + 1), "9007199254740992"),
    (5e-324, "5e-324"),
    (-1.5e-10, "-1.5e-10"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (100.0, "100"),
    (1e20, "100000000000000000000"),
    (-0.0, "0"),
    (1e16, "10000000000000000"),
    (123456789.12345679, "123456789.12345679"),
    (1.5, "1.5"),
    (-2.5e-5, "-0.000025"),
    (2.5e21, "2.5e+21"),
]


@pytest.mark.parametrize(("value", "expected"), JS_NUMBERS)
def test_js_number_matches_javascript(value: float, expected: str) -> None:
    assert js_number(value) == expected
    assert canonical_json(value) == expected
    assert canonical_json([value]) == f"[{expected}]"


def test_wide_integers_are_rounded_like_doubles() -> None:
    assert canonical_json(2**53 + 1) == "9007199254740992"
    assert canonical_json({"id": 12345678901234567890}) == '{"id":12345678901234567000}'
    assert canonical_json(2**53 - 1) == "9007199254740991"


def test_js_number_agrees_with_node_on_random_floats() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is required in CI to cross-check js_number")
        pytest.skip("node is not installed")
    rng = random.Random(20240101)
    values = [
        rng.choice([-1, 1]) * rng.uniform(1, 10) * 10.0 ** rng.randint(-325, 308)
        for _ in range(400)
    ]
    values += [float(rng.getrandbits(64)) for _ in range(50)]
    values = [value for value in values if math.isfinite(value)]
    script = (
        "const v = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "process.stdout.write(JSON.stringify(v.map(String)));"
    )
    completed = subprocess.run(
        [node, "-e", script], input=json.dumps(values), capture_output=True, text=True, check=True
    )
    expected = json.loads(completed.stdout)
    assert [js_number(value) for value in values] == expected


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_number_is_rejected_with_its_path(bad: float) -> None:
    payload = {"items": [{"price": 1.5}, {"price": 2.5}, {"price": 3.5}, {"price": bad}]}
    with pytest.raises(PayloadError, match=r"\$\.items\[3\]\.price") as info:
        canonical_json(payload)
    assert info.value.path == "$.items[3].price"


def test_non_finite_decimal_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"not a JSON number"):
        canonical_json({"a": Decimal("NaN")})


def test_lone_surrogate_in_key_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"lone surrogate"):
        canonical_json({"ok": 1, "bad\udc00": 2})


def test_lone_surrogate_in_value_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"lone surrogate") as info:
        canonical_json({"a": ["x", "\ud800"]})
    assert info.value.path == "$.a[1]"


def test_non_string_key_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"keys must be strings"):
        canonical_json({"a": {1: "x"}})


def test_unknown_object_suggests_a_serializer() -> None:
    with pytest.raises(PayloadError, match=r"serializer") as info:
        canonical_json({"when": object()})
    assert info.value.path == "$.when"


def test_serializer_hook_turns_objects_into_json() -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

    def serialize(value: Any) -> Any:
        assert isinstance(value, Money)
        return {"Cents": value.cents, "currency": "EUR"}

    text = canonical_json({"total": Money(250)}, serializer=serialize)
    assert text == '{"total":{"Cents":250,"currency":"EUR"}}'


def test_serializer_returning_its_input_is_rejected() -> None:
    with pytest.raises(PayloadError, match=r"unchanged"):
        canonical_json({"x": object()}, serializer=lambda value: value)


def test_decimal_hashes_as_the_double_javascript_sees() -> None:
    assert canonical_json({"amount": Decimal("1.10")}) == '{"amount":1.1}'
    assert canonical_json(Decimal("10")) == "10"


def test_enum_hashes_as_its_value() -> None:
    class Color(enum.Enum):
        RED = "red"

    class Size(enum.IntEnum):
        BIG = 3

    assert canonical_json({"c": Color.RED, "s": Size.BIG}) == '{"c":"red","s":3}'


def test_dataclass_hashes_as_its_fields() -> None:
    @dataclasses.dataclass
    class Order:
        order_id: str
        Amount: float

    assert canonical_json(Order("o-1", 2.0)) == '{"Amount":2,"order_id":"o-1"}'


def test_tuple_hashes_as_a_list() -> None:
    assert canonical_json({"t": (1, 2.0, "x")}) == '{"t":[1,2,"x"]}'


def test_deep_nesting_raises_payload_error_not_recursion_error() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(PayloadError, match=r"deeper than"):
        canonical_json(value)


def test_nesting_of_400_levels_works() -> None:
    assert MAX_DEPTH >= 400
    value: Any = []
    for _ in range(400):
        value = [value]
    assert canonical_json(value) == "[" * 401 + "]" * 401


def test_cyclic_dict_raises_payload_error() -> None:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    with pytest.raises(PayloadError):
        canonical_json(value)


def test_unknown_hash_algorithm_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"md5"):
        digest("x", "crc32")


def test_key_is_prefix_hash_digest() -> None:
    assert idempotency_key("", "abc") == "#abc"
    assert idempotency_key("orders", "abc") == "orders#abc"


# ------------------------------------------------------------------------------ fast path


def test_integral_floats_are_patched_in_a_copy_without_touching_the_input() -> None:
    items = [{"price": 1.5}, {"price": 132.0}, {"price": 2.25}, {"price": 1e-7}]
    payload = {"orders": [{"items": items, "total": 20.0}] * 8, "n": [1.0, 2.5]}
    before = json.dumps(payload)
    assert canonical_bytes(payload) == general(payload)
    assert b'"price":132}' in canonical_bytes(payload)
    assert json.dumps(payload) == before


def test_shared_references_are_hashed_at_every_occurrence() -> None:
    shared = {"v": 3.0, "w": 0.5}
    payload = {"a": [shared, shared, shared, shared, shared, shared, shared, shared], "b": shared}
    assert canonical_bytes(payload) == general(payload)


def test_mixed_case_keys_learned_in_other_calls_keep_typescript_order() -> None:
    assert canonical_json({"b": 1}) == '{"b":1}'
    assert canonical_json({"B": 1, "a": 2}) == '{"a":2,"B":1}'
    assert canonical_json([{"B": 1, "a": 2}] * 10) == "[" + ",".join(['{"a":2,"B":1}'] * 10) + "]"
    assert canonical_json({"1": 1, "0": 2}) == '{"0":2,"1":1}'
    assert canonical_json([{"10": 1, "9": 2}] * 10) == "[" + ",".join(['{"9":2,"10":1}'] * 10) + "]"


# ------------------------------------------------------------------------------ properties

KEYS = st.one_of(st.text(max_size=6), st.sampled_from(SPECIAL_KEYS))
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**6), 10**6).map(float),
    st.sampled_from(EDGE_FLOATS),
)
INTS = st.one_of(
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.sampled_from([2**53 - 1, 2**53, -(2**53) + 1, -(2**53), 2**64]),
    st.integers(-(2**63), 2**64),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, st.text(max_size=8))


def json_values(keys: st.SearchStrategy[str], scalars: st.SearchStrategy[Any]) -> Any:
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=8),
            st.dictionaries(keys, inner, max_size=8),
            # Many siblings of one shape: the key-order cache serves all but the first.
            st.builds(
                lambda d, n: [dict(d) for _ in range(n)],
                st.dictionaries(keys, inner, max_size=5),
                st.integers(6, 12),
            ),
        ),
        max_leaves=40,
    )


def _surrogate_free(text: str) -> bool:
    return not any("\ud800" <= char <= "\udfff" for char in text)


def _outcome(produce: Any, value: Any, **options: Any) -> Any:
    try:
        return produce(value, **options)
    except PayloadError as exc:
        return ("PayloadError", exc.path)


@settings(max_examples=400, deadline=None)
@given(json_values(KEYS.filter(_surrogate_free), SCALARS))
def test_fast_path_equals_general_path(value: Any) -> None:
    assert canonical_bytes(value) == general(value)


@settings(max_examples=200, deadline=None)
@given(json_values(KEYS, st.one_of(SCALARS, st.sampled_from([math.nan, math.inf, "\udc00"]))))
def test_fast_path_fails_exactly_where_the_general_path_does(value: Any) -> None:
    assert _outcome(canonical_bytes, value) == _outcome(general_bytes, value)
    strict = _outcome(canonical_bytes, value, strict_integers=True)
    assert strict == _outcome(general_bytes, value, strict_integers=True)


SAFE_KEYS = st.text(max_size=6).filter(lambda key: _surrogate_free(key) and key != "__proto__")
SAFE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    # Floats from 2**53 up are integral and print as integers JSON reads back as int.
    st.floats(-(2.0**53), 2.0**53, exclude_min=True, exclude_max=True),
    st.text(max_size=8).filter(_surrogate_free),
)


@settings(max_examples=200, deadline=None)
@given(json_values(SAFE_KEYS, SAFE_SCALARS))
def test_canonical_text_parses_back_to_an_equal_value(value: Any) -> None:
    assert json.loads(canonical_json(value)) == value


def _no_case_collisions(value: Any) -> bool:
    if isinstance(value, dict):
        lowered = [key.lower() for key in value]
        return len(set(lowered)) == len(lowered) and all(map(_no_case_collisions, value.values()))
    if isinstance(value, list):
        return all(map(_no_case_collisions, value))
    return True


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@settings(max_examples=200, deadline=None)
@given(json_values(SAFE_KEYS, SAFE_SCALARS).filter(_no_case_collisions), st.randoms())
def test_reordering_keys_never_changes_the_key(value: Any, rng: random.Random) -> None:
    assert canonical_json(_shuffled(value, rng)) == canonical_json(value)


@pytest.mark.parametrize(
    ("algorithm", "length"),
    [("md5", 24), ("sha1", 28), ("sha256", 44), ("sha384", 64), ("sha512", 88)],
)
@settings(max_examples=20, deadline=None)
@given(text=st.text())
def test_digest_length_per_algorithm(algorithm: str, length: int, text: str) -> None:
    assert len(digest(text.encode("utf-8", "surrogatepass"), algorithm)) == length


def test_payloads_with_ever_new_keys_stay_fast_and_exact() -> None:
    # Keys taken from data (ids, SKUs) differ on every call: what the fast path learns
    # about key orders must stay bounded and cheap, and never admit a wrong order.
    import time

    start = time.perf_counter()
    for n in range(3000):
        value = {f"sku-{n}": 1, f"SKU-{n}x": 2, f"Item{n}": {"Zeta": n, f"zeta{n}": n}}
        assert canonical_bytes(value) == general(value)
    assert time.perf_counter() - start < 5
    assert _orders.cache_size() <= _orders.CACHE_ENTRIES


@pytest.mark.parametrize("algorithm", ["md5", "sha256"])
def test_canonical_digester_is_the_digest_of_the_canonical_bytes(algorithm: str) -> None:
    values = [
        {"Tier": "gold", "id": "ord-1", "amount": 42.0},  # the fast path, a key reordered
        {"price": Decimal("1.10"), "when": (1, 2)},  # the general path
        [1, "two", None, {"b": 1, "a": [2.5e-6]}],
    ]
    hashed = canonical_digester(algorithm)
    for value in values:
        assert hashed(value) == digest_bytes(canonical_bytes(value), algorithm)
    with pytest.raises(PayloadError):
        hashed({"bad": math.nan})
    with pytest.raises(ConfigError):
        canonical_digester("crc32")


@pytest.mark.parametrize("algorithm", ["md5", "sha1", "sha256", "sha384", "sha512"])
def test_digests_are_hashlibs_on_both_sides_of_the_small_input_bound(algorithm: str) -> None:
    # Short texts may be hashed by CPython's own MD5 rather than OpenSSL's: the same digest.
    for size in (0, 1, 63, 64, SMALL_INPUT - 1, SMALL_INPUT, 3 * SMALL_INPUT):
        text = "é" * (size // 2) + "x" * (size % 2)
        data = json.dumps(text, ensure_ascii=False).encode()
        expected = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
        assert digest_bytes(data, algorithm) == expected
        assert canonical_digester(algorithm)(text) == expected
