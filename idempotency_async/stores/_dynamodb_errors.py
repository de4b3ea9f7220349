"""Translation of DynamoDB client failures into the library's PersistenceError family.

Every call the DynamoDB store makes runs inside :func:`translate_errors`, so callers catch
one family of errors (``idempotency_async.errors``) with ``raise … from exc``, whatever
the client raised.  A failed conditional write is not an error for the store: it becomes
:class:`ConditionFailed`, carrying the item that blocked it.

Two clients are understood: aioboto3 (botocore and aiohttp exceptions) and the light
client (:class:`ServiceError` and ``OSError``).  botocore and aiohttp are never imported
here: an exception can only be one of theirs if its module is already loaded, so the light
client's cold start does not pay for them.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final

from idempotency_async._redact import redact
from idempotency_async.errors import (
    PersistenceError,
    StoreAccessDeniedError,
    StoreThrottledError,
    StoreUnavailableError,
    StoreValidationError,
)

__all__ = [
    "THROTTLED",
    "ConditionFailed",
    "ServiceError",
    "is_invalid_value",
    "is_item_too_large",
    "safe_message",
    "translate_errors",
]

THROTTLED: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
    }
)
_DENIED: Final = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
    }
)
_INVALID: Final = frozenset(
    {"ValidationException", "ResourceNotFoundException", "SerializationException"}
)
_SERVER_FAULTS: Final = frozenset({"InternalServerError", "ServiceUnavailable"})
# A signature error quotes the canonical request and the string to sign, which hold the
# session token (x-amz-security-token) of temporary credentials: cut there.
_QUOTED_REQUEST: Final = re.compile(r"(?:\bThe\s+)?(?:canonical|string[\s-]to[\s-]sign)", re.I)


def safe_message(code: str, message: str) -> str:
    """DynamoDB's error ``message``, fit to quote: for a denied request without the
    request AWS quotes back, and never with a session token."""
    if code in _DENIED:
        marker = _QUOTED_REQUEST.search(message)
        if marker is not None:
            message = message[: marker.start()].rstrip() + " (the request AWS quoted is left out)"
    return redact(message)


class ServiceError(Exception):
    """DynamoDB answered with an error; ``response`` is shaped like botocore's
    ``ClientError.response`` (``Error.Code``, ``Error.Message``, and ``Item`` when a
    conditional check failed with ``ReturnValuesOnConditionCheckFailure``)."""

    def __init__(self, response: Mapping[str, Any]) -> None:
        error = response.get("Error", {})
        code = str(error.get("Code", ""))
        super().__init__(f"{code}: {safe_message(code, str(error.get('Message', '')))}")
        self.response = response


class ConditionFailed(Exception):
    """A conditional write did not apply; ``item`` is the record that blocked it."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


@contextlib.contextmanager
def translate_errors(operation: str, table_name: str) -> Iterator[None]:
    """Turn the client's failures into the library's PersistenceError family."""
    try:
        yield
    except ServiceError as exc:
        raise _from_response(exc.response, operation, table_name) from exc
    except Exception as exc:
        translated = _translate(exc, operation, table_name)
        if translated is None:
            raise
        raise translated from exc


def _translate(exc: Exception, operation: str, table_name: str) -> Exception | None:
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.ClientError):
        return _from_response(exc.response, operation, table_name)
    if _is_network_error(exc, botocore):
        return StoreUnavailableError(
            f"DynamoDB could not be reached to {operation} ({type(exc).__name__}: {exc}); "
            "check the endpoint and network, or raise the client's timeouts and retries "
            "(connect_timeout, read_timeout and retries in aioboto3's AioConfig, or the "
            "light client's options)"
        )
    if botocore is None:
        return None
    if isinstance(exc, botocore.NoCredentialsError | botocore.PartialCredentialsError):
        return StoreAccessDeniedError(
            f"no AWS credentials to {operation} on table {table_name!r} ({exc}); configure "
            "credentials for the session that creates the DynamoDB client"
        )
    if isinstance(exc, botocore.ParamValidationError):
        return StoreValidationError(
            f"botocore refused the request to {operation} on table {table_name!r}: {exc}"
        )
    if isinstance(exc, botocore.BotoCoreError):
        return PersistenceError(f"DynamoDB failed to {operation}: {exc}")
    return None


def _is_network_error(exc: Exception, botocore: Any) -> bool:
    if isinstance(exc, OSError | TimeoutError):
        return True
    if botocore is not None and isinstance(
        exc, botocore.HTTPClientError | botocore.ConnectionError
    ):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _from_response(response: Mapping[str, Any], operation: str, table_name: str) -> Exception:
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    if code == "ConditionalCheckFailedException":
        return ConditionFailed(response.get("Item"))
    detail = f"{code}: {safe_message(code, str(error.get('Message', '')))}"
    where = f"to {operation} on table {table_name!r}"
    if code in THROTTLED:
        return StoreThrottledError(
            f"DynamoDB throttled the request {where} after the client's retries ({detail}); "
            "use on-demand billing or raise the table's capacity, or allow more retries "
            "with AioConfig(retries={'mode': 'adaptive', 'total_max_attempts': 10}) "
            "(light client: max_attempts=)"
        )
    if code in _DENIED:
        return StoreAccessDeniedError(
            f"DynamoDB denied the request {where} ({detail}); grant dynamodb:PutItem, "
            "GetItem, UpdateItem and DeleteItem on the table to the credentials in use"
        )
    if code in _INVALID:
        return StoreValidationError(
            f"DynamoDB rejected the request {where} ({detail}); check that the table "
            "exists in the client's region and that its key schema matches key_attr "
            "(and sort_key_attr)"
        )
    if code in _SERVER_FAULTS:
        return StoreUnavailableError(
            f"DynamoDB failed {where} ({detail}) after the client's retries; retry later"
        )
    return PersistenceError(f"DynamoDB failed {where} ({detail})")


def is_item_too_large(exc: StoreValidationError) -> bool:
    """Whether DynamoDB refused the write because the item exceeds 400 KB."""
    return "maximum allowed size" in str(exc)


def is_invalid_value(exc: StoreValidationError) -> bool:
    """Whether DynamoDB refused the request as malformed (``ValidationException``: a
    number out of range, an invalid string), rather than a missing table."""
    # botocore's ClientError and the light client's ServiceError both carry the answer.
    response = getattr(exc.__cause__, "response", None)
    if not isinstance(response, Mapping):
        return False
    error = response.get("Error")
    return isinstance(error, Mapping) and error.get("Code") == "ValidationException"
