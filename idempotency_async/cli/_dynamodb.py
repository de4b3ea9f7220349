"""``dynamodb://TABLE?…`` URLs: a DynamoDBStore, or a new table, on AWS configuration the
command loads itself (stores never load it)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult

from idempotency_async._redact import redact_url
from idempotency_async.cli._errors import CliError
from idempotency_async.cli._targets import AwsSettings, query_params, record_format
from idempotency_async.errors import PersistenceError
from idempotency_async.record import Status

__all__ = ["DynamoDBTarget", "parse"]

# DynamoDBStore's own keyword names, so the URL reads like the Python configuration.
_STORE_OPTIONS: Final = (
    "key_attr",
    "sort_key_attr",
    "static_pk_value",
    "status_attr",
    "expiry_attr",
    "in_progress_expiry_attr",
    "data_attr",
    "validation_attr",
    "owner_attr",
    "data_format_attr",
    "steps_attr",
    "step_count_attr",
    "record_format",
)
_CONNECTION: Final = ("region", "endpoint")
_TABLE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{3,255}")


@dataclass(frozen=True, slots=True)
class DynamoDBTarget:
    table: str
    region: str | None = None
    endpoint: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def store(self, aws: AwsSettings) -> Any:
        factory = self._client_factory(aws)
        dynamodb = _dynamodb_module()
        return dynamodb.DynamoDBStore(client_factory=factory, table_name=self.table, **self.options)

    def pages(
        self,
        store: Any,
        *,
        status: Status | None,
        page_size: int | None,
        limit: int | None = None,
    ) -> AsyncGenerator[Any, None]:
        """A ``Query`` of the partition in sort-key mode, a ``Scan`` of the table otherwise.

        DynamoDB's ``Limit`` counts the items a request reads before the status filter, so
        only an unfiltered listing sizes its requests by ``limit``; a filtered one reads
        1 MB pages (a page of ``limit`` items might hold no match at all).
        """
        if page_size is None and status is None:
            page_size = limit
        pages: AsyncGenerator[Any, None] = store.pages(status=status, page_size=page_size)
        return pages

    async def create_table(self, aws: AwsSettings) -> None:
        """Create the table the URL names, in sort-key mode when it sets ``sort_key_attr``."""
        create_table = _dynamodb_module().create_table
        schema = {
            name: self.options[name]
            for name in ("key_attr", "sort_key_attr", "expiry_attr")
            if name in self.options
        }
        async with self._client_factory(aws)() as client:
            try:
                await create_table(
                    client, self.table, sort_key="sort_key_attr" in self.options, **schema
                )
            except PersistenceError as exc:
                if "ResourceInUseException" in str(exc):
                    raise CliError(f"table {self.table!r} already exists") from exc
                raise

    def _client_factory(self, aws: AwsSettings) -> Any:
        _dynamodb_module()  # the extra is installed
        import aioboto3
        import botocore.exceptions
        from aiobotocore.config import AioConfig

        try:
            session = aioboto3.Session(
                profile_name=aws.profile, region_name=self.region or aws.region
            )
        except botocore.exceptions.ProfileNotFound as exc:
            raise CliError(f"{exc}: check --profile / AWS_PROFILE and ~/.aws/config") from exc
        if session.region_name is None:
            raise CliError(
                "no AWS region: add ?region=… to the store URL, pass --region, or set AWS_REGION"
            )
        retries = {"mode": "standard", "total_max_attempts": 3}
        if os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE"):
            retries = {}  # the operator's own retry settings win
        config = AioConfig(connect_timeout=5, read_timeout=30, retries=retries)

        def open_client() -> Any:
            return session.client("dynamodb", endpoint_url=self.endpoint, config=config)

        return open_client


def _dynamodb_module() -> Any:
    try:
        import aioboto3  # noqa: F401  (the store's clients come from it here)

        from idempotency_async.stores import dynamodb
    except ImportError as exc:
        raise CliError(
            f"DynamoDB support is not installed ({exc}): pip install 'idempotency-async[dynamodb]' "
            "(from a checkout: pip install -e '.[dynamodb]')"
        ) from exc
    return dynamodb


def parse(parts: SplitResult) -> DynamoDBTarget:
    table = parts.netloc
    if not table or parts.path not in ("", "/"):
        raise CliError(
            f"bad store URL {redact_url(parts.geturl())!r}: write dynamodb://TABLE?region=… "
            "(the table name right after dynamodb://)"
        )
    if not _TABLE_NAME.fullmatch(table):
        raise CliError(
            f"bad table name {table!r}: DynamoDB table names are 3-255 characters of "
            "letters, digits, '_', '-' and '.'"
        )
    params = query_params(parts, (*_CONNECTION, *_STORE_OPTIONS))
    region = params.pop("region", None) or None
    endpoint = params.pop("endpoint", None) or None
    for name, value in params.items():
        if not value:
            raise CliError(f"parameter {name!r} in the store URL is empty")
    if "record_format" in params:
        record_format(params["record_format"])
    return DynamoDBTarget(table, region, endpoint, params)
