"""The modules behind :mod:`idempotency_async.integrations.aws_lambda`, one idea each.

``context`` (when an invocation ends) ← ``handler`` (the idempotent handler decorator);
``entrypoint`` (the synchronous function Lambda calls, on the process's one loop);
``events`` (the event sources a batch can come from) ← ``records`` (one record's run)
← ``batch`` (a batch in its order).  Users import from ``aws_lambda``; nothing here
imports upwards.
"""
