"""Selecting the parts of a payload that identify a request and that must match on replay."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError
from jmespath.functions import Functions, signature
from jmespath.parser import ParsedResult

from idempotency_async._json import loads_strict
from idempotency_async.errors import ConfigError, PayloadError

__all__ = [
    "Expression",
    "PowertoolsFunctions",
    "PowertoolsPythonFunctions",
    "Selector",
    "compile_expression",
    "is_missing",
]

Expression = str | ParsedResult
"""A JMESPath expression: its text, or the result of ``jmespath.compile``."""


class PowertoolsFunctions(Functions):
    """JMESPath functions always available in expressions, as in the Powertools ports.

    Subclass it to add your own functions; pass an instance as
    ``Options(jmespath_functions=...)``.
    """

    @signature({"types": ["string"]})
    def _func_powertools_json(self, value: str) -> Any:
        return loads_strict(value)

    @signature({"types": ["string"]})
    def _func_powertools_base64(self, value: str) -> str:
        return _b64decode(value).decode()

    @signature({"types": ["string"]})
    def _func_powertools_base64_gzip(self, value: str) -> str:
        import gzip  # here, not at the top: the library's import stays small

        try:
            return gzip.decompress(_b64decode(value)).decode()
        except (OSError, EOFError) as exc:
            raise PayloadError(f"powertools_base64_gzip: not gzip data ({exc})") from exc


def _b64decode(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise PayloadError(f"not valid Base64 ({exc}): check the field's encoding") from exc


class PowertoolsPythonFunctions(PowertoolsFunctions):
    """The JMESPath functions as Powertools (Python) defines them.

    ``powertools_json`` is ``json.loads`` (a repeated member: the last one wins) and the
    Base64 functions skip characters outside the alphabet, so selections match
    Powertools' on any payload it accepts.  Subclass it to add functions in this mode.
    """

    @signature({"types": ["string"]})
    def _func_powertools_json(self, value: str) -> Any:
        try:
            return json.loads(value)
        except ValueError as exc:
            raise PayloadError(f"powertools_json: invalid JSON text ({exc})") from exc

    @signature({"types": ["string"]})
    def _func_powertools_base64(self, value: str) -> str:
        return _text(_b64_lenient(value), "powertools_base64")

    @signature({"types": ["string"]})
    def _func_powertools_base64_gzip(self, value: str) -> str:
        import gzip  # here, not at the top: the library's import stays small

        try:
            data = gzip.decompress(_b64_lenient(value))
        except (OSError, EOFError) as exc:
            raise PayloadError(f"powertools_base64_gzip: not gzip data ({exc})") from exc
        return _text(data, "powertools_base64_gzip")


def _b64_lenient(value: str) -> bytes:
    try:
        return base64.b64decode(value)
    except (binascii.Error, ValueError) as exc:
        raise PayloadError(f"not valid Base64 ({exc}): check the field's encoding") from exc


def _text(data: bytes, function: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{function}: the decoded bytes are not UTF-8 ({exc})") from exc


def compile_expression(expression: Expression | None, *, option: str) -> ParsedResult | None:
    """Compile once at configuration time; a bad expression is a ConfigError, not a 500 later."""
    if expression is None or isinstance(expression, ParsedResult):
        return expression
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigError(f"{option} must be a non-empty JMESPath string or compiled expression")
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        raise ConfigError(f"{option}={expression!r} is not valid JMESPath: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled expression plus the functions it may call."""

    expression: ParsedResult | None
    functions: Functions

    def select(self, payload: Any) -> Any:
        if self.expression is None:
            return payload
        try:
            options = jmespath.Options(custom_functions=self.functions)
            return self.expression.search(payload, options=options)
        except PayloadError:
            raise
        except JMESPathError as exc:
            raise PayloadError(f"selecting from the payload failed: {exc}") from exc


def is_missing(selected: Any, *, strict: bool) -> bool:
    """Whether a selection yields no key.

    Always missing: ``None``, and a multi-select whose every member is ``None``.
    With ``strict``, the reference ports' wider set too: ``""``, ``[]`` and ``{}``.
    """
    if selected is None:
        return True
    if isinstance(selected, dict):
        values: Any = selected.values()
    elif isinstance(selected, list | tuple):
        values = selected
    else:
        return strict and selected == ""
    if not values:
        return strict
    for value in values:  # noqa: SIM110 (a plain loop: no generator on every call)
        if value is not None:
            return False
    return True
