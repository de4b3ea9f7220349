"""Payload selection: JMESPath compilation, Powertools functions, missing-key rules."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import jmespath
import pytest
from jmespath.functions import signature

from idempotency_async.errors import ConfigError, PayloadError
from idempotency_async.selection import (
    PowertoolsFunctions,
    Selector,
    compile_expression,
    is_missing,
)


def select(expression: str, payload: Any, functions: PowertoolsFunctions | None = None) -> Any:
    compiled = compile_expression(expression, option="event_key_jmespath")
    return Selector(compiled, functions or PowertoolsFunctions()).select(payload)


def test_powertools_json_decodes_a_body_string() -> None:
    event = {"body": json.dumps({"user": "u-1", "amount": 5})}
    assert select("powertools_json(body).user", event) == "u-1"


def test_powertools_json_rejects_invalid_json() -> None:
    with pytest.raises(PayloadError, match=r"invalid JSON"):
        select("powertools_json(body)", {"body": "{not json"})


def test_powertools_json_rejects_duplicate_members() -> None:
    with pytest.raises(PayloadError, match=r"twice"):
        select("powertools_json(body)", {"body": '{"a":1,"a":2}'})


def test_powertools_base64_decodes_text() -> None:
    event = {"data": base64.b64encode(b'{"id":"x-1"}').decode()}
    assert select("powertools_json(powertools_base64(data)).id", event) == "x-1"


def test_powertools_base64_rejects_bad_base64() -> None:
    with pytest.raises(PayloadError, match=r"Base64"):
        select("powertools_base64(data)", {"data": "***"})


def test_powertools_base64_gzip_decodes_compressed_text() -> None:
    event = {"data": base64.b64encode(gzip.compress(b'{"id":"g-1"}')).decode()}
    assert select("powertools_json(powertools_base64_gzip(data)).id", event) == "g-1"


def test_powertools_base64_gzip_rejects_non_gzip_data() -> None:
    with pytest.raises(PayloadError, match=r"gzip"):
        select("powertools_base64_gzip(data)", {"data": base64.b64encode(b"plain").decode()})


def test_custom_function_via_subclass() -> None:
    class Functions(PowertoolsFunctions):
        @signature({"types": ["string"]})
        def _func_lower(self, value: str) -> str:
            return value.lower()

    assert select("lower(id)", {"id": "ABC"}, Functions()) == "abc"


def test_compiled_expression_is_accepted() -> None:
    compiled = jmespath.compile("a.b")
    assert compile_expression(compiled, option="event_key_jmespath") is compiled
    assert Selector(compiled, PowertoolsFunctions()).select({"a": {"b": 2}}) == 2


def test_no_expression_selects_the_whole_payload() -> None:
    payload = {"a": 1}
    assert compile_expression(None, option="event_key_jmespath") is None
    assert Selector(None, PowertoolsFunctions()).select(payload) is payload


@pytest.mark.parametrize("expression", ["a[", "", "   ", 42])
def test_bad_expression_is_a_config_error(expression: Any) -> None:
    with pytest.raises(ConfigError, match=r"event_key_jmespath"):
        compile_expression(expression, option="event_key_jmespath")


@pytest.mark.parametrize("selected", [None, [None, None], {"a": None, "b": None}])
def test_missing_selections(selected: Any) -> None:
    assert is_missing(selected, strict=False)
    assert is_missing(selected, strict=True)


@pytest.mark.parametrize("selected", ["", [], {}])
def test_empty_values_count_as_keys_unless_strict(selected: Any) -> None:
    assert not is_missing(selected, strict=False)
    assert is_missing(selected, strict=True)


@pytest.mark.parametrize("selected", [False, 0, "x", [None, 1], {"a": None, "b": 0}, 0.0])
def test_falsy_and_partial_values_are_keys(selected: Any) -> None:
    assert not is_missing(selected, strict=False)
    assert not is_missing(selected, strict=True)
