"""The ``idempotency-async`` command: which key a payload gets, what state its record is in,
and how to unstick it.  See ``docs/cli.md``."""

from idempotency_async.cli._main import main

__all__ = ["main"]
