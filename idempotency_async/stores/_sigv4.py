"""AWS Signature Version 4 for the light DynamoDB client, on the standard library alone.

Only what a JSON ``POST /`` to DynamoDB needs: no query string, no path to normalise, no
chunked payloads.  Every header passed in is signed except ``user-agent`` (botocore leaves
it out too: proxies may rewrite it).  Tested against botocore's ``SigV4Auth`` on generated
requests and against published vectors of AWS's SigV4 test suite
(``tests/test_dynamodb_light.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["Credentials", "sign"]

_ALGORITHM = "AWS4-HMAC-SHA256"
_UNSIGNED = frozenset({"user-agent", "expect", "transfer-encoding", "x-amzn-trace-id"})


class Credentials(NamedTuple):
    """An access key pair, with the session token of temporary credentials (Lambda's)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never print the secret or the token
        return f"Credentials(access_key_id={self.access_key_id!r}, ...)"


def sign(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Credentials,
    region: str,
    service: str,
    now: float | None = None,
) -> dict[str, str]:
    """The request's headers (lower-case names) with ``x-amz-date``, the session token and
    ``authorization`` added.  ``headers`` must include ``host``; ``now`` is Unix time."""
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    signed = {name.lower(): value for name, value in headers.items()}
    signed["x-amz-date"] = amz_date
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    names = sorted(name for name in signed if name not in _UNSIGNED)
    canonical_headers = "".join(f"{name}:{' '.join(signed[name].split())}\n" for name in names)
    signed_names = ";".join(names)
    canonical_request = "\n".join(
        (method, path, "", canonical_headers, signed_names, hashlib.sha256(body).hexdigest())
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        (_ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest())
    )
    key = _signing_key(credentials.secret_access_key, amz_date[:8], region, service)
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"{_ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    return signed


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key
