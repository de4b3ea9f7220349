"""Creating an idempotency table: for tests, examples and operators (production tables
usually come from infrastructure code, see ``docs/dynamodb.md``)."""

from __future__ import annotations

from typing import Any

from idempotency_async.stores._dynamodb_errors import translate_errors

__all__ = ["create_table"]


async def create_table(
    client: Any,
    table_name: str,
    *,
    sort_key: bool = False,
    key_attr: str = "id",
    sort_key_attr: str = "sk",
    expiry_attr: str = "expiration",
) -> None:
    """Create an idempotency table (on-demand billing, TTL on ``expiry_attr``).

    Waits until the table is ACTIVE.  With ``sort_key`` the table has a composite key
    ``(key_attr, sort_key_attr)`` for ``DynamoDBStore(sort_key_attr=...)``.  Meant for
    tests, examples and operators; production tables usually come from infrastructure
    code (see ``docs/dynamodb.md``).
    """
    schema = [{"AttributeName": key_attr, "KeyType": "HASH"}]
    if sort_key:
        schema.append({"AttributeName": sort_key_attr, "KeyType": "RANGE"})
    with translate_errors("create the table", table_name):
        await client.create_table(
            TableName=table_name,
            KeySchema=schema,
            AttributeDefinitions=[
                {"AttributeName": entry["AttributeName"], "AttributeType": "S"} for entry in schema
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        waiter = client.get_waiter("table_exists")
        await waiter.wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        await client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": expiry_attr},
        )
