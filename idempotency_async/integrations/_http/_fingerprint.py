"""What a request is validated by: its fingerprint, and the limits on the body it reads.

::

    body (≤ max_body_bytes) ──> fingerprint {path, query, media type, body}

Reusing a key with a different fingerprint is answered 422 (see :mod:`._exchange`).  The
body is its canonical JSON for JSON media types (nested at most ``max_body_depth``) and
Base64 of its bytes otherwise; the query pairs are stably sorted by name.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from idempotency_async._json import loads_strict, nesting_depth
from idempotency_async.canonical import HASH_ALGORITHMS, canonical_bytes, digest_bytes
from idempotency_async.errors import PayloadError
from idempotency_async.integrations._http._responses import HttpResponse, Rejection, problem

__all__ = ["check_length", "fingerprint", "too_large"]

_MAX_SAFE_INTEGER: Final = 2**53 - 1
# JSON bodies nested deeper than this are canonicalized in slices of this depth, so every
# slice stays on the canonicalizer's fast path (it hands deeper values to a slower one).
_SLICE_DEPTH: Final = 128
_LONG_NUMBER: Final = re.compile(rb"[0-9]{16}")


def check_length(content_length: str | None, limit: int) -> None:
    """Reject a declared body over ``limit`` before reading it (413)."""
    if content_length is None:
        return
    try:
        declared = int(content_length)
    except ValueError:
        raise Rejection(problem(400, "Bad Request", "Content-Length is not a number")) from None
    if declared > limit:
        raise Rejection(too_large(limit))


def too_large(limit: int) -> HttpResponse:
    """The answer to a request body over ``limit`` bytes (413)."""
    return problem(
        413, "Request body too large", f"idempotent requests may carry at most {limit} bytes"
    )


def fingerprint(
    *,
    path: str,
    query: Iterable[tuple[str, str]],
    content_type: str | None,
    body: bytes,
    max_depth: int,
    hash_function: str,
) -> str:
    """The digest of a request's concrete path, query pairs, media type and body.

    ``query`` is the pairs as the application decodes them (each framework decodes its
    raw query once; decoding them again would make ``?x=%2541`` the same as ``?x=A``).

    Raises :class:`Rejection` (400) for a JSON body that is unreadable or nested deeper
    than ``max_depth``.
    """
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    body_material, depth = _body_material(media_type, body, max_depth)
    material = {
        "path": path,
        # Lists, not tuples: same canonical JSON, but they keep the canonicalizer on
        # its fast path.
        # Sorted by name only, stably: a repeated name keeps the order its values were
        # sent in (``?a=1&a=2`` and ``?a=2&a=1`` differ to an app reading the last one).
        "query": [list(pair) for pair in sorted(query, key=_name)],
        "media_type": media_type,
        "body": body_material,
    }
    algorithm = hash_function
    if algorithm not in HASH_ALGORITHMS:
        # A Powertools (Python) hash such as sha3_256: the fingerprint is only hashed
        # again into the validation hash, so any digest serves.
        algorithm = "sha256"
    try:
        text = canonical_bytes(material) if depth < _SLICE_DEPTH else _sliced(material)
        return digest_bytes(text, algorithm)
    except PayloadError as exc:
        raise Rejection(problem(400, "Unreadable request body", str(exc))) from exc


def _body_material(media_type: str, body: bytes, limit: int) -> tuple[dict[str, Any], int]:
    """What of the body is fingerprinted, and how deeply it nests."""
    if not body or not (media_type == "application/json" or media_type.endswith("+json")):
        return {"base64": base64.b64encode(body).decode("ascii")}, 0
    text: str | bytes = body
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        # The parser accepts UTF-16 and UTF-32 too: the nesting is counted on the text
        # it will parse, not on bytes read as if they were UTF-8.
        try:
            text = body.decode(encoding, "surrogatepass")
        except UnicodeDecodeError as exc:
            raise Rejection(
                problem(400, "Invalid JSON body", f"not valid {encoding.upper()}: {exc}")
            ) from exc
    depth = nesting_depth(text)
    if depth > limit:
        raise Rejection(
            problem(
                400,
                "Request body nested too deeply",
                f"JSON request bodies may nest arrays and objects at most {limit} levels "
                f"deep; this one nests {depth}",
            )
        )
    try:
        value = loads_strict(text, max_depth=None)
    except PayloadError as exc:
        raise Rejection(problem(400, "Invalid JSON body", str(exc))) from exc
    except UnicodeDecodeError as exc:
        raise Rejection(problem(400, "Invalid JSON body", f"not UTF-8: {exc}")) from exc
    if _exact_as_double(value, body):
        return {"json": value}, depth
    # JSON holding integers a double cannot tell apart hashes as bytes.
    return {"base64": base64.b64encode(body).decode("ascii")}, 0


def _sliced(value: Any) -> bytes:
    """``canonical_bytes(value)`` for parsed JSON of any depth, in time linear in its size.

    ``value`` is changed: only pass a value parsed for this purpose.

    Containers at ``_SLICE_DEPTH`` are canonicalized on their own (sliced again when they
    are deeper still) and stand in the rest as placeholder strings carrying a random
    nonce, which the request cannot contain; the placeholders' canonical text is then
    replaced by the slices' (canonical JSON of a value is the same wherever it sits).
    """
    nonce = secrets.token_hex(16)
    return _Slicer(nonce, re.compile(b'"%s:([0-9]+)"' % nonce.encode())).canonical(value)


@dataclass(frozen=True, slots=True)
class _Slicer:
    nonce: str
    placeholder: re.Pattern[bytes]

    def canonical(self, value: Any) -> bytes:
        slices: list[bytes] = []
        self.cut(value, slices)
        text = canonical_bytes(value)
        if not slices:
            return text
        return self.placeholder.sub(lambda match: slices[int(match[1])], text)

    def cut(self, value: Any, slices: list[bytes]) -> None:
        """Replace, in place, the containers at ``_SLICE_DEPTH`` with placeholders."""
        level = [value]
        for _ in range(_SLICE_DEPTH - 1):
            level = [
                child
                for node in level
                for child in (node.values() if type(node) is dict else node)
                if type(child) is dict or type(child) is list
            ]
            if not level:
                return
        for node in level:
            slots = node.items() if type(node) is dict else enumerate(node)
            deep = [(slot, child) for slot, child in slots if type(child) in (dict, list)]
            for slot, child in deep:
                node[slot] = f"{self.nonce}:{len(slices)}"
                slices.append(self.canonical(child))


def _exact_as_double(value: Any, text: bytes) -> bool:
    if _LONG_NUMBER.search(text) is None:
        return True  # every integer has at most 15 digits
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if isinstance(node, int) and not -_MAX_SAFE_INTEGER <= node <= _MAX_SAFE_INTEGER:
            return False
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def _name(pair: tuple[str, str]) -> str:
    return pair[0]
