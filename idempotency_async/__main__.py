"""``python -m idempotency_async``: the operator's command-line tool."""

from idempotency_async.cli import main

raise SystemExit(main())
