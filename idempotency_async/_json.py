"""JSON encoding of stored responses, bounded decoding of stored JSON, and strict decoding of
raw JSON text."""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any, Final

import orjson

from idempotency_async.canonical import MAX_DEPTH
from idempotency_async.errors import PayloadError, ResponseEncodingError

__all__ = [
    "MAX_STORED_DEPTH",
    "StoredDataError",
    "decode_json",
    "decode_stored",
    "encode_json",
    "loads_strict",
    "nesting_depth",
    "utf8_text",
]

_ENCODE_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
# Integers beyond 64 bits and strings holding lone surrogates are outside orjson's range.
# Such responses are written by the stdlib encoder (ASCII, so a lone surrogate becomes the
# escape ``\ud800``, which every JSON reader turns back into the same string) behind one
# leading space, which marks them for the stdlib decoder (orjson would read wide integers
# back as floats, and refuses the escapes).
_WIDE_MARK = b" "
# orjson also stops at 254 levels; the stdlib encoder goes on to MAX_STORED_DEPTH.
_STDLIB_ONLY = ("64-bit", "Integer", "surrogates", "Recursion limit")

MAX_STORED_DEPTH: Final = 512
"""How deeply a stored response may nest arrays and objects; deeper ones are not stored
(writing) or not replayed (reading a record another writer made)."""


def encode_json(value: Any) -> bytes:
    """Encode a response as JSON bytes; raise ResponseEncodingError if it is not JSON."""
    try:
        encoded = orjson.dumps(value, option=_ENCODE_OPTIONS)
    except orjson.JSONEncodeError as exc:
        if not any(marker in str(exc) for marker in _STDLIB_ONLY):
            raise _not_json(value, exc) from exc
        try:
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as wide_exc:
            raise _not_json(value, wide_exc) from wide_exc
        if _openers(text) > MAX_STORED_DEPTH and nesting_depth(text) > MAX_STORED_DEPTH:
            too_deep = ValueError(f"nested deeper than {MAX_STORED_DEPTH} levels")
            raise _not_json(value, too_deep) from None
        return _WIDE_MARK + text.encode()
    # ``bytes.partition``, not ``in`` (it first tries its operand as an integer: an exception
    # raised and cleared in C) nor ``find`` (its arguments parsed from a tuple): a one-
    # argument method, half the cost of ``find`` on every completion.
    if encoded.partition(b"null")[1]:
        _reject_non_finite(value)
    return encoded


def decode_json(data: bytes) -> Any:
    """Decode what :func:`encode_json` wrote (trusted: this process encoded it)."""
    if data[:1] == _WIDE_MARK:
        return json.loads(data)
    return orjson.loads(data)


def utf8_text(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes, so that it encodes as
    UTF-8 (a reason kept on a record may quote anything, a callback's error included)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


class StoredDataError(ValueError):
    """Stored JSON that cannot be read within the decoding bounds (too deep, a number that
    is not finite, not JSON)."""


def decode_stored(data: bytes | str, *, exact: bool = False) -> Any:
    """Decode JSON read back from a shared store, where other writers (the Powertools ports,
    an operator, an attacker with write access) may have put anything.

    Bounded: nesting at most :data:`MAX_STORED_DEPTH` levels (checked before parsing, in
    linear time), finite numbers only (``NaN``, ``Infinity``, ``1e999`` are refused).
    ``exact``: integers of any size stay exact (the stdlib parser); otherwise orjson reads
    it, and the stdlib parser only what orjson refuses (this library's wide integers and
    lone surrogates, marked by a leading space, or escapes other writers produce).
    Raises :class:`StoredDataError`.
    """
    if _openers(data) > MAX_STORED_DEPTH and _stored_depth(data) > MAX_STORED_DEPTH:
        raise StoredDataError(
            f"nested {nesting_depth(data)} levels deep, more than the {MAX_STORED_DEPTH} accepted"
        )
    if not exact and data[:1] not in (b" ", " "):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # a wide integer or a lone surrogate (stdlib below), or not JSON at all
    try:
        return json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except StoredDataError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StoredDataError(f"not JSON ({exc})") from None


# Everything but the quotes and brackets, deleted by bytes.translate.
_NOT_STRUCTURE: Final = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_PAIRS: Final = re.compile(rb"\[\]|\{\}")
_QUICK_PASSES: Final = 8


def _stored_depth(data: bytes | str) -> int:
    """:func:`nesting_depth` for stored responses, where most text is inside strings and
    most nesting is shallow: the same answer for valid JSON, several times faster on a
    large response (a replay reads one on every duplicate)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.find(b"\\") != -1:  # (find: see encode_json)
        raw = _ESCAPE.sub(b"", raw)
    structure = raw.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    # Removing two adjacent quotes keeps every other quote's role (opening or closing)
    # and changes nothing outside strings; what is left of the strings holds brackets.
    if b'"' in structure:
        structure = b"".join(structure.split(b'"')[::2])
    # Each pass removes the innermost pairs: one level.  Wide, shallow text (the usual
    # case) empties in a few passes, each shrinking it a lot; deep or narrow text is
    # measured in one linear pass.
    depth = 0
    while structure:
        if depth == _QUICK_PASSES:
            break
        shorter = _PAIRS.sub(b"", structure)
        if len(shorter) == len(structure):
            break  # not JSON: no innermost pair
        depth += 1
        if 4 * len(shorter) > 3 * len(structure):
            structure = shorter
            break
        structure = shorter
    return depth + max(max(accumulate(map(_STEP.__getitem__, structure)), default=0), 0)


def _refuse_constant(name: str) -> Any:
    raise StoredDataError(f"holds {name}, which is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StoredDataError(f"holds the number {text[:40]}, beyond the range of a float")
    return value


def loads_strict(text: str | bytes, *, max_depth: int | None = MAX_DEPTH) -> Any:
    """Parse JSON text, rejecting duplicate object members and non-finite numbers.

    Used wherever a payload arrives as raw text (``powertools_json``, HTTP bodies):
    ``{"a":1,"a":2}`` means different things to different parsers, so it cannot be hashed.
    Text nested deeper than ``max_depth`` is refused before it is parsed (the parser
    recurses; ``None``: the caller checked :func:`nesting_depth` already).
    """
    if max_depth is not None and _openers(text) > max_depth:
        depth = nesting_depth(text)
        if depth > max_depth:
            raise PayloadError(
                f"JSON text is nested {depth} levels deep, more than the {max_depth} accepted: "
                "flatten it"
            )
    try:
        return json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant)
    except RecursionError:
        # Only reachable with max_depth=None, or a caller already deep in its own stack.
        raise PayloadError("JSON text is nested too deeply to parse: flatten it") from None
    except ValueError as exc:
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"invalid JSON text: {exc}") from exc


# Escapes first (so an escaped quote cannot end a string), then whole strings, go before
# the brackets are counted; all three passes run in C, so counting stays linear and cheap.
_ESCAPE: Final = re.compile(rb"\\.", re.DOTALL)
_STRING: Final = re.compile(rb'"[^"]*"')
_NOT_BRACKET: Final = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP: Final = tuple(1 if byte in b"[{" else -1 if byte in b"]}" else 0 for byte in range(256))


def nesting_depth(text: str | bytes) -> int:
    """How deeply JSON text nests arrays and objects (0 for a scalar), without parsing it.

    Exact for valid JSON; for invalid text, exact up to the point a parser would reject it.
    """
    if _openers(text) <= 1:
        return _openers(text)
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.find(b"\\") != -1:  # (find: see encode_json)
        data = _ESCAPE.sub(b"", data)
    if data.find(b'"') != -1:
        data = _STRING.sub(b"", data)
    brackets = data.translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _openers(text: str | bytes) -> int:
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise PayloadError(
                    f"JSON text has the member {key!r} twice in one object; parsers disagree on "
                    "which one wins, so it cannot be hashed: send each member once"
                )
            seen.add(key)
    return result


def _no_constant(name: str) -> Any:
    raise PayloadError(f"JSON text contains {name}, which is not a JSON number")


def _reject_non_finite(value: Any) -> None:
    # orjson writes NaN and Infinity as null; a replay would then differ from the result.
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                raise ResponseEncodingError(
                    f"the result contains {node}, which JSON cannot represent: return None "
                    "or a string instead"
                )
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)


def _not_json(value: Any, exc: Exception) -> ResponseEncodingError:
    return ResponseEncodingError(
        f"the result ({type(value).__name__}) cannot be stored as JSON: {exc}. Return JSON "
        "values (dict, list, str, int, float, bool, None) or configure a response serializer "
        "(Options(response_serializer=...))"
    )
