"""Translation of botocore / aiohttp failures into the library's PersistenceError family.

Every call the DynamoDB store makes runs inside :func:`translate_errors`, so callers catch
one family of errors (``idempotency_async.errors``) with ``raise … from exc``, whatever
the client raised.  A failed conditional write is not an error for the store: it becomes
:class:`ConditionFailed`, carrying the item that blocked it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Final

import aiohttp
import botocore.exceptions

from idempotency_async.errors import (
    PersistenceError,
    StoreAccessDeniedError,
    StoreThrottledError,
    StoreUnavailableError,
    StoreValidationError,
)

__all__ = ["ConditionFailed", "is_invalid_value", "is_item_too_large", "translate_errors"]

_THROTTLED: Final = frozenset(
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
_NETWORK_ERRORS: Final = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)
_NO_CREDENTIALS: Final = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
)


class ConditionFailed(Exception):
    """A conditional write did not apply; ``item`` is the record that blocked it."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


@contextlib.contextmanager
def translate_errors(operation: str, table_name: str) -> Iterator[None]:
    """Turn botocore / aiohttp failures into the library's PersistenceError family."""
    try:
        yield
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ConditionalCheckFailedException":
            raise ConditionFailed(exc.response.get("Item")) from exc
        raise _client_error(exc, operation, table_name) from exc
    except _NETWORK_ERRORS as exc:
        raise StoreUnavailableError(
            f"DynamoDB could not be reached to {operation} ({type(exc).__name__}: {exc}); "
            "check the endpoint and network, or raise connect_timeout, read_timeout and "
            "retries in the client's AioConfig"
        ) from exc
    except _NO_CREDENTIALS as exc:
        raise StoreAccessDeniedError(
            f"no AWS credentials to {operation} on table {table_name!r} ({exc}); configure "
            "credentials for the session that creates the DynamoDB client"
        ) from exc
    except botocore.exceptions.ParamValidationError as exc:
        raise StoreValidationError(
            f"botocore refused the request to {operation} on table {table_name!r}: {exc}"
        ) from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise PersistenceError(f"DynamoDB failed to {operation}: {exc}") from exc


def _client_error(
    exc: botocore.exceptions.ClientError, operation: str, table_name: str
) -> PersistenceError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    detail = f"{code}: {error.get('Message', '')}"
    where = f"to {operation} on table {table_name!r}"
    if code in _THROTTLED:
        return StoreThrottledError(
            f"DynamoDB throttled the request {where} after botocore's retries ({detail}); "
            "use on-demand billing or raise the table's capacity, or allow more retries "
            "with AioConfig(retries={'mode': 'adaptive', 'total_max_attempts': 10})"
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
            f"DynamoDB failed {where} ({detail}) after botocore's retries; retry later"
        )
    return PersistenceError(f"DynamoDB failed {where} ({detail})")


def is_item_too_large(exc: StoreValidationError) -> bool:
    """Whether DynamoDB refused the write because the item exceeds 400 KB."""
    return "maximum allowed size" in str(exc)


def is_invalid_value(exc: StoreValidationError) -> bool:
    """Whether DynamoDB refused the request as malformed (``ValidationException``: a
    number out of range, an invalid string), rather than a missing table."""
    cause = exc.__cause__
    if not isinstance(cause, botocore.exceptions.ClientError):
        return False
    code: object = cause.response.get("Error", {}).get("Code")
    return code == "ValidationException"
