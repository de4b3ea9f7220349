"""Key derivation: idempotency-async against aws-lambda-powertools (Python), in one process.

Run ``python benchmarks/bench_keys.py`` (``--smoke`` for a few-second check that still
verifies byte identity).  Each row hashes the *whole* payload on both sides:

* anchor: ``BasePersistenceLayer._get_hashed_idempotency_key`` (``json.dumps`` with
  ``sort_keys`` + md5 hex), configured without a JMESPath expression;
* ours: ``idempotency_key(prefix, digest_bytes(canonical_bytes(value)))``, the
  TypeScript-compatible key;
* floor: ``orjson.dumps`` + md5 + Base64 of the same value, no canonicalization at all.

Times are µs per key, the median of interleaved repeats (the machine is small and noisy,
so compare ratios, not absolute numbers).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from idempotency_async.canonical import _to_js, canonical_bytes, digest_bytes, idempotency_key

PREFIX = "process-order"
BUDGET = {"a": 2.0, "b": 3.0, "c": 2.0}


# ------------------------------------------------------------------------------ payloads


def api_gateway_event() -> dict[str, Any]:
    """(a) An API Gateway HTTP API (v2) event of about 1 KB with a JSON body string."""
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
    """(b) A batch of about 35 KB of orders: camelCase keys, float prices, some nulls."""
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
    """(c) About 100 bytes."""
    return {"orderId": "ord-000123", "customerId": "cus-000421", "amount": 42.5, "currency": "EUR"}


PAYLOADS: dict[str, tuple[str, Callable[[], Any]]] = {
    "a": ("API Gateway v2 event", api_gateway_event),
    "b": ("batch of orders", order_batch),
    "c": ("small payload", small_payload),
}


# ------------------------------------------------------------------------------ contenders


def anchor_key_function() -> Callable[[Any], Any]:
    from aws_lambda_powertools.utilities.idempotency.config import IdempotencyConfig
    from aws_lambda_powertools.utilities.idempotency.persistence.base import (
        BasePersistenceLayer,
    )

    class _KeyOnly(BasePersistenceLayer):  # type: ignore[misc]
        """Only the key derivation is used; the I/O methods are never called."""

        def _get_record(self, idempotency_key: str) -> Any:
            raise NotImplementedError

        def _put_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _update_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _delete_record(self, data_record: Any) -> None:
            raise NotImplementedError

    layer = _KeyOnly()
    layer.configure(IdempotencyConfig(), key_prefix=PREFIX)
    return layer._get_hashed_idempotency_key  # type: ignore[no-any-return]


def ours(value: Any) -> str:
    return idempotency_key(PREFIX, digest_bytes(canonical_bytes(value)))


def floor(value: Any) -> str:
    return base64.b64encode(hashlib.md5(orjson.dumps(value)).digest()).decode()


# ------------------------------------------------------------------------------ measuring


def per_call_us(function: Callable[[Any], Any], value: Any, loops: int) -> float:
    started = time.perf_counter()
    for _ in range(loops):
        function(value)
    return (time.perf_counter() - started) / loops * 1e6


def loops_for(function: Callable[[Any], Any], value: Any, target_s: float) -> int:
    loops = 1
    while True:
        started = time.perf_counter()
        for _ in range(loops):
            function(value)
        if time.perf_counter() - started >= target_s / 4:
            return max(1, int(loops * target_s / (time.perf_counter() - started)))
        loops *= 2


def check_identity(value: Any) -> None:
    fast = canonical_bytes(value)
    general = orjson.dumps(_to_js(value, None))
    if fast != general:
        raise SystemExit("canonical_bytes differs from the general path: the fast path is wrong")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds; checks identity")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    repeats = 3 if args.smoke else max(7, args.repeats)
    target_s = 0.02 if args.smoke else 0.15
    anchor = anchor_key_function()
    contenders = {"anchor": anchor, "ours": ours, "floor": floor}

    print(f"python {sys.version.split()[0]}, orjson {orjson.__version__}, {repeats} repeats")
    print(
        f"{'payload':<26}{'bytes':>7}{'anchor µs':>11}{'ours µs':>9}{'floor µs':>10}"
        f"{'anchor/ours':>13}{'budget':>8}"
    )
    failed = []
    for name, (label, make) in PAYLOADS.items():
        value = make()
        check_identity(value)
        size = len(canonical_bytes(value))
        loops = {who: loops_for(f, value, target_s) for who, f in contenders.items()}
        samples: dict[str, list[float]] = {who: [] for who in contenders}
        for _ in range(repeats):  # interleaved, so drift hits every contender alike
            for who, function in contenders.items():
                samples[who].append(per_call_us(function, value, loops[who]))
        median = {who: statistics.median(times) for who, times in samples.items()}
        ratio = median["anchor"] / median["ours"]
        met = ratio >= BUDGET[name]
        if not met:
            failed.append(name)
        print(
            f"({name}) {label:<22}{size:>7}{median['anchor']:>11.1f}{median['ours']:>9.1f}"
            f"{median['floor']:>10.1f}{ratio:>12.1f}x{'>=' if met else '<':>5}{BUDGET[name]:.0f}x"
        )
    if failed and not args.smoke:
        print(f"budget missed on: {', '.join(failed)}")
    # The smoke run only guards correctness: timings on a loaded CI machine are not meaningful.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
