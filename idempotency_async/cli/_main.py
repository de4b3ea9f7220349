"""The entry point: each subcommand is one ``run_*`` function; errors become one line."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from idempotency_async.cli._errors import EXIT_ERROR, CliError, one_line
from idempotency_async.cli._parser import PROG, build_parser
from idempotency_async.errors import IdempotencyError, PersistenceError, StoreUnavailableError

__all__ = ["main"]

# botocore's connection failures, reported without the library's client-tuning advice.
_UNREACHABLE = frozenset(
    {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"}
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "key":
            from idempotency_async.cli._key import run_key

            return run_key(args)
        from idempotency_async.cli import _records

        command = {
            "get": _records.run_get,
            "list": _records.run_list,
            "release": _records.run_release,
            "create-table": _records.run_create_table,
            "vacuum": _records.run_vacuum,
        }[args.command]
        return asyncio.run(command(args))
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except IdempotencyError as exc:
        return _fail(_explain(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining
        # about the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:
        if type(exc).__module__.partition(".")[0] in ("botocore", "aiobotocore", "boto3"):
            return _fail(f"{type(exc).__name__}: {exc}")
        raise


def _fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
    return code


def _explain(exc: IdempotencyError) -> str:
    cause = exc.__cause__
    if isinstance(exc, PersistenceError) and type(cause).__name__ in (
        "NoCredentialsError",
        "PartialCredentialsError",
    ):
        return (
            f"no AWS credentials ({cause}): pass --profile, set AWS_PROFILE, or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(exc, StoreUnavailableError) and type(cause).__name__ in _UNREACHABLE:
        return f"{cause}: check the endpoint and region in the store URL, and the network"
    return str(exc)
