"""AWS Lambda: idempotent async handlers, a warm event loop, and partial-batch processing.

* :func:`idempotent_handler` makes ``async def handler(event, context)`` run once per key
  and replay its return value; the Lambda deadline becomes the record's lease.
* :func:`lambda_entrypoint` turns an async handler into the synchronous function Lambda
  calls, keeping one event loop per process (and so one set of aioboto3 clients) for the
  life of the execution environment.
* :func:`process_batch` processes SQS (standard and FIFO), Kinesis and DynamoDB stream
  batches record by record and returns ``{"batchItemFailures": [...]}``.
"""

from __future__ import annotations

from idempotency_async.integrations._lambda.batch import BatchResponse, process_batch
from idempotency_async.integrations._lambda.entrypoint import LambdaEntrypoint, lambda_entrypoint
from idempotency_async.integrations._lambda.events import EventType
from idempotency_async.integrations._lambda.handler import idempotent_handler

__all__ = [
    "BatchResponse",
    "EventType",
    "LambdaEntrypoint",
    "idempotent_handler",
    "lambda_entrypoint",
    "process_batch",
]
