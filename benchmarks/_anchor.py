"""The anchor for side-by-side runs: aws-lambda-powertools' sync idempotency on an in-memory layer.

The layer mirrors MemoryStore: a dict, a conditional put that raises the "already exists"
error carrying the old record (as the DynamoDB layer does), update and delete.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import (
    BasePersistenceLayer,
    DataRecord,
)


class AnchorMemoryLayer(BasePersistenceLayer):  # type: ignore[misc]
    def __init__(self, latency: float = 0.0) -> None:
        super().__init__()
        self._records: dict[str, DataRecord] = {}
        self._lock = threading.Lock()
        self._latency = latency

    def _wait(self) -> None:
        if self._latency:
            time.sleep(self._latency)

    def _get_record(self, idempotency_key: str) -> DataRecord:
        self._wait()
        try:
            return self._records[idempotency_key]
        except KeyError:
            raise IdempotencyItemNotFoundError from None

    def _put_record(self, data_record: DataRecord) -> None:
        self._wait()
        now = time.time()
        with self._lock:
            old = self._records.get(data_record.idempotency_key)
            claimable = (
                old is None
                or old.expiry_timestamp < now
                or (
                    old.status == "INPROGRESS"
                    and old.in_progress_expiry_timestamp is not None
                    and old.in_progress_expiry_timestamp < now * 1000
                )
            )
            if not claimable:
                raise IdempotencyItemAlreadyExistsError(old_data_record=old)
            self._records[data_record.idempotency_key] = data_record

    def _update_record(self, data_record: DataRecord) -> None:
        self._wait()
        with self._lock:
            self._records[data_record.idempotency_key] = data_record

    def _delete_record(self, data_record: DataRecord) -> None:
        self._wait()
        with self._lock:
            self._records.pop(data_record.idempotency_key, None)


class FakeLambdaContext:
    """What a Lambda context gives the anchor: time left, which becomes its in-progress lease."""

    def __init__(self, seconds: float) -> None:
        self._millis = int(seconds * 1000)

    def get_remaining_time_in_millis(self) -> int:
        return self._millis


def anchor_function(layer: AnchorMemoryLayer, *, deadline_s: float | None = 10.0) -> Any:
    """The anchor's decorated function; with ``deadline_s`` each call has a Lambda deadline."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

    config = IdempotencyConfig(expires_after_seconds=3600)
    if deadline_s is not None:
        config.register_lambda_context(FakeLambdaContext(deadline_s))

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
    )
    def process(order: dict[str, Any]) -> dict[str, Any]:
        return {"order": order["id"], "status": "charged"}

    return process
