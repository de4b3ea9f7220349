"""Payload shapes for ``bench_keys.py``: what Lambda handlers and HTTP services hash.

Each builder returns one JSON value; the benchmark hashes a fresh copy of it per call.
Consistently cased shapes sort alike by code point and in TypeScript order; the others
exercise what differs: mixed-case keys, non-ASCII keys, array-index keys and floats that
JavaScript prints differently from orjson.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_EVENTS = Path(__file__).resolve().parent.parent / "tests" / "events"


def api_gateway_v2_event() -> dict[str, Any]:
    """An API Gateway HTTP API (v2) event of about 1.6 KB with a JSON body string."""
    body = {
        "orderId": "ord-7d1f0c2a",
        "customerId": "cus-000421",
        "items": [{"sku": "SKU-1042", "quantity": 2}, {"sku": "SKU-2210", "quantity": 1}],
        "totalAmount": 129.95,
        "currency": "EUR",
    }
    return {
        "version": "2.0",
        "routeKey": "POST /orders",
        "rawPath": "/orders",
        "rawQueryString": "dryRun=false&source=web",
        "cookies": ["session=8f1b2c3d4e5f", "theme=dark"],
        "headers": {
            "accept": "application/json",
            "accept-encoding": "gzip, deflate, br",
            "content-length": "173",
            "content-type": "application/json",
            "host": "a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com",
            "idempotency-key": "0b6f3e4a-2d9c-4b8e-9f51-7c2e1d3a4b5c",
            "user-agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
            "x-amzn-trace-id": "Root=1-65a1b2c3-4d5e6f708192a3b4c5d6e7f8",
            "x-forwarded-for": "203.0.113.42",
            "x-forwarded-port": "443",
            "x-forwarded-proto": "https",
        },
        "queryStringParameters": {"dryRun": "false", "source": "web"},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "a1b2c3d4e5",
            "authorizer": {
                "jwt": {
                    "claims": {
                        "iss": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Ab12Cd34E",
                        "sub": "5f2a9c1e-8b7d-4e3f-a6b5-c4d3e2f1a0b9",
                        "scope": "orders/write",
                        "exp": "1704070800",
                    },
                    "scopes": ["orders/write"],
                }
            },
            "domainName": "a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com",
            "domainPrefix": "a1b2c3d4e5",
            "http": {
                "method": "POST",
                "path": "/orders",
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.42",
                "userAgent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
            },
            "requestId": "Rq3kYgHxIAMEbXw=",
            "routeKey": "POST /orders",
            "stage": "$default",
            "time": "01/Jan/2024:00:00:00 +0000",
            "timeEpoch": 1704067200000,
        },
        "body": json.dumps(body, separators=(",", ":")),
        "pathParameters": None,
        "isBase64Encoded": False,
    }


def order_batch(count: int = 48, seed: int = 7) -> dict[str, Any]:
    """A batch of about 35 KB of orders: camelCase keys, float prices, some nulls."""
    rng = random.Random(seed)
    cities = ["Lisboa", "Berlin", "Zürich", "Kraków", "Dublin", "Paris", "Oslo", "Wien"]
    orders = []
    for number in range(count):
        items = []
        for line in range(rng.randint(2, 5)):
            unit_price = rng.randint(99, 49_999) / 100
            items.append(
                {
                    "lineId": line + 1,
                    "sku": f"SKU-{rng.randint(1000, 9999)}",
                    "productName": rng.choice(["Desk lamp", "Chair", "Notebook A5", "Kettle"]),
                    "quantity": rng.randint(1, 4),
                    "unitPrice": unit_price,
                    "taxRate": rng.choice([0.07, 0.19, 0.21, 0.23]),
                    "discountCode": rng.choice([None, None, "SPRING24"]),
                }
            )
        orders.append(
            {
                "orderId": f"ord-{number:06d}-{rng.getrandbits(32):08x}",
                "customerId": f"cus-{rng.randint(1, 99_999):06d}",
                "createdAt": f"2024-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:15:00Z",
                "status": rng.choice(["PENDING", "PAID", "SHIPPED"]),
                "currency": "EUR",
                "totalAmount": round(sum(i["unitPrice"] * i["quantity"] for i in items), 2),
                "couponValue": rng.choice([None, 5.5, 12.25]),
                "shippingAddress": {
                    "firstName": "Alex",
                    "lastName": "Müller",
                    "line1": f"{rng.randint(1, 200)} Example Street",
                    "line2": rng.choice([None, "Flat 2"]),
                    "city": rng.choice(cities),
                    "postalCode": f"{rng.randint(10000, 99999)}",
                    "countryCode": "DE",
                    "geo": {"lat": rng.uniform(35, 60), "lon": rng.uniform(-9, 25)},
                },
                "items": items,
                "tags": rng.sample(["gift", "express", "b2b", "repeat"], 2),
                "giftWrap": rng.random() < 0.2,
                "notes": None,
            }
        )
    return {"batchId": "batch-2024-01-01-0001", "source": "checkout", "orders": orders}


def small_payload() -> dict[str, Any]:
    """About 100 bytes."""
    return {"orderId": "ord-000123", "customerId": "cus-000421", "amount": 42.5, "currency": "EUR"}


def rest_v1_event() -> dict[str, Any]:
    """An API Gateway REST API (v1) event: PascalCase headers next to ``accept``, ``x-api-key``.

    ``tests/events/api_gateway_rest_v1.json`` plus the headers a browser or SDK client adds,
    as API Gateway passes them through: their case differs, so ``headers`` and
    ``multiValueHeaders`` sort differently by code point and in TypeScript order.
    """
    event: dict[str, Any] = json.loads((_EVENTS / "api_gateway_rest_v1.json").read_text())
    extra = {
        "accept": "application/json",
        "Accept-Encoding": "gzip, deflate, br",
        "CloudFront-Viewer-Country": "DE",
        "x-api-key": "Qm9vdHN0cmFwS2V5LTAwMDE",
        "Idempotency-Key": "5f0c1f0e-3b7a-4b7e-9a55-0f1b2c3d4e5f",
    }
    event["headers"].update(extra)
    event["multiValueHeaders"].update({name: [value] for name, value in extra.items()})
    return event


def sns_in_sqs_event(records: int = 3) -> dict[str, Any]:
    """An SQS event whose bodies are SNS notifications, decoded as an envelope hands them on.

    SQS keys are camelCase, SNS keys PascalCase, and the publisher's message attributes
    (``tenantId``, ``EventType``) mix both, as they do in practice.
    """
    out = []
    for number in range(records):
        message = {"orderId": f"ord-{1000 + number}", "amount": 4200 + number, "currency": "EUR"}
        notification = {
            "Type": "Notification",
            "MessageId": f"95df01b4-ee98-5cb9-9903-4c221d41eb5{number}",
            "TopicArn": "arn:aws:sns:eu-west-1:123456789012:orders",
            "Subject": None,
            "Message": json.dumps(message),
            "Timestamp": "2024-01-12T19:03:58.123Z",
            "SignatureVersion": "1",
            "Signature": "tcc6faL2yUC6dgZdmrwh1Y4cGa/ebXEkAi6RibDsvpi+tE/1+82j...LHXXXX==",
            "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService.pem",
            "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
            "MessageAttributes": {
                "tenantId": {"Type": "String", "Value": "tenant-42"},
                "EventType": {"Type": "String", "Value": "order.created"},
                "retries": {"Type": "Number", "Value": "0"},
            },
        }
        out.append(
            {
                "messageId": f"059f36b4-87a3-44ab-83d2-661975830a7{number}",
                "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a1Example==",
                "body": notification,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1705086238001",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1705086238101",
                },
                "messageAttributes": {},
                "md5OfBody": "5882ce776e4ca7d7ef6e89cdc03f4b09",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:orders",
                "awsRegion": "eu-west-1",
            }
        )
    return {"Records": out}


def mixed_case_object() -> dict[str, Any]:
    """A 5-field object as .NET and Java clients send it: ``Tier`` sorts before ``id`` only
    by code point."""
    return {"Tier": "gold", "id": "ord-000123", "Amount": 42.5, "currency": "EUR", "Qty": 3}


def mixed_case_dto() -> dict[str, Any]:
    """A flat object of about 1 KB: 30 fields, PascalCase and camelCase, every JSON scalar."""
    rng = random.Random(11)
    out: dict[str, Any] = {}
    for number in range(30):
        name = rng.choice(["Order", "customer", "Ship", "billing", "Line", "tax"])
        name += rng.choice(["Id", "Name", "Code", "Total", "Date", "Ref"]) + str(number)
        out[name] = rng.choice(
            [f"value-{number:04d}", rng.randint(0, 10**6), rng.randint(1, 99_999) / 100, None]
        )
    return out


def non_ascii_keys() -> dict[str, Any]:
    """A flat object keyed in German, Greek, Turkish, Japanese and emoji (astral) text."""
    return {
        "Straße": "Hauptstraße 1",
        "Größe": "XL",
        "ÖFFNUNGSZEITEN": "9-18",
        "İstanbul": "şube-3",
        "\u0131\u015f\u0131k": True,  # Turkish "light", dotless i
        "ΣΤΟΙΧΕΙΑ": "παραγγελία",
        "σύνολο": 129.95,
        "数量": 2,
        "注文番号": "ord-7d1f0c2a",
        "\U0001f600reaction": "like",
        "\uff5aenith": "fullwidth",
        "id": "ord-000123",
    }


def index_keys() -> dict[str, Any]:
    """A flat object keyed by numbers, as a JavaScript array-like object or a sparse map."""
    return {str(index): f"line-{index}" for index in (0, 1, 2, 3, 5, 8, 10, 13, 21, 34, 100, 1000)}


def javascript_floats() -> dict[str, Any]:
    """Floats JavaScript prints its own way: exponents, tiny and huge, integral, -0."""
    return {
        "avogadro": 6.02214076e23,
        "big": 1e21,
        "planck": 6.62607015e-34,
        "tiny": 5e-324,
        "micro": 1e-7,
        "fraction": 2.5e-6,
        "whole": 132.0,
        "large": 1e16,
        "huge": 1.7976931348623157e308,
        "negativeZero": -0.0,
        "price": 19.99,
        "rate": 0.0725,
    }


def mixed_case_batch(count: int = 60, seed: int = 3) -> dict[str, Any]:
    """About 30 KB of .NET-style orders: PascalCase fields next to ``id`` and ``etag``."""
    rng = random.Random(seed)
    orders = []
    for number in range(count):
        lines = [
            {
                "LineNo": line + 1,
                "Sku": f"SKU-{rng.randint(1000, 9999)}",
                "qty": rng.randint(1, 4),
                "UnitPrice": rng.randint(99, 49_999) / 100,
                "discount": rng.choice([None, 0.1, 0.15]),
            }
            for line in range(rng.randint(2, 5))
        ]
        orders.append(
            {
                "id": f"ord-{number:06d}",
                "etag": f'W/"{rng.getrandbits(40):010x}"',
                "CustomerId": f"cus-{rng.randint(1, 99_999):06d}",
                "Status": rng.choice(["Pending", "Paid", "Shipped"]),
                "createdAt": f"2024-01-{rng.randint(1, 28):02d}T10:15:00Z",
                "Total": round(sum(line["UnitPrice"] * line["qty"] for line in lines), 2),
                "Address": {
                    "Street": f"{rng.randint(1, 200)} Example Street",
                    "city": rng.choice(["Lisboa", "Berlin", "Zürich", "Oslo"]),
                    "Zip": f"{rng.randint(10000, 99999)}",
                    "country": "DE",
                },
                "Lines": lines,
                "tags": ["b2b"],
                "IsGift": rng.random() < 0.2,
            }
        )
    return {"BatchId": "batch-0001", "source": "erp", "Orders": orders, "count": count}


def varied_mixed_case_batch(count: int = 56, seed: int = 5) -> dict[str, Any]:
    """About 30 KB of .NET-style orders whose members vary from object to object.

    Every object mixes PascalCase and lower-case keys, as in :func:`mixed_case_batch`, but
    optional members are left out as serializers omit nulls and defaults, so nearly every
    object has a key set of its own: no two neighbours can share one key-order lookup.
    """
    rng = random.Random(seed)
    orders = []
    for number in range(count):
        lines = []
        for line in range(rng.randint(2, 5)):
            item: dict[str, Any] = {"LineNo": line + 1, "Sku": f"SKU-{rng.randint(1000, 9999)}"}
            item["qty"] = rng.randint(1, 4)
            item["UnitPrice"] = rng.randint(99, 49_999) / 100
            if rng.random() < 0.4:
                item["discount"] = rng.choice([0.1, 0.15])
            if rng.random() < 0.2:
                item["GiftNote"] = "Happy birthday"
            lines.append(item)
        order: dict[str, Any] = {"id": f"ord-{number:06d}"}
        optional = {
            "etag": f'W/"{rng.getrandbits(40):010x}"',
            "CustomerId": f"cus-{rng.randint(1, 99_999):06d}",
            "Status": rng.choice(["Pending", "Paid", "Shipped"]),
            "createdAt": f"2024-01-{rng.randint(1, 28):02d}T10:15:00Z",
            "Coupon": rng.choice(["SPRING24", "VIP"]),
            "IsGift": True,
            "tags": ["b2b"],
            "salesRep": f"rep-{rng.randint(1, 40)}",
        }
        order.update((name, value) for name, value in optional.items() if rng.random() < 0.6)
        order["Total"] = round(sum(item["UnitPrice"] * item["qty"] for item in lines), 2)
        address = {"Street": f"{rng.randint(1, 200)} Example Street", "city": "Berlin"}
        if rng.random() < 0.5:
            address["Zip"] = f"{rng.randint(10000, 99999)}"
        if rng.random() < 0.5:
            address["country"] = "DE"
        order["Address"] = address
        order["Lines"] = lines
        orders.append(order)
    return {"BatchId": "batch-0002", "source": "erp", "Orders": orders, "count": count}
