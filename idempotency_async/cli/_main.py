"""The entry point: each subcommand is one ``run_*`` function; errors become one line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from idempotency_async._redact import redact, secrets_in
from idempotency_async.cli._errors import EXIT_ERROR, CliError, one_line
from idempotency_async.cli._parser import PROG, build_parser
from idempotency_async.cli._terminal import printable
from idempotency_async.errors import IdempotencyError, PersistenceError, StoreUnavailableError

__all__ = ["main"]

# The clients behind the stores; their exceptions become one line when a store lets one
# through.
_CLIENT_PACKAGES = frozenset({"botocore", "aiobotocore", "boto3", "redis", "valkey"})
# botocore's connection failures, reported without the library's client-tuning advice.
_UNREACHABLE = frozenset(
    {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"}
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args = build_parser().parse_args(argv)
    # Whatever an error quotes, the store URL's password is not shown.
    secrets = secrets_in(getattr(args, "store", None) or "")
    try:
        return _run(args)
    except CliError as exc:
        return _fail(str(exc), secrets, exc.code)
    except IdempotencyError as exc:
        return _fail(_explain(exc), secrets)
    except KeyboardInterrupt:
        return _fail("interrupted", secrets, 130)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining
        # about the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:
        if type(exc).__module__.partition(".")[0] in _CLIENT_PACKAGES:
            # A client error the store did not translate: still one line, not a traceback.
            return _fail(f"{type(exc).__name__}: {exc}", secrets)
        raise


def _run(args: argparse.Namespace) -> int:
    if args.command == "key":
        from idempotency_async.cli._key import run_key

        return run_key(args)
    from idempotency_async.cli import _records

    command = {
        "get": _records.run_get,
        "list": _records.run_list,
        "release": _records.run_release,
        "create-table": _records.run_create_table,
        "migrate": _records.run_migrate,
        "vacuum": _records.run_vacuum,
    }[args.command]
    return asyncio.run(command(args))


def _fail(message: str, secrets: tuple[str, ...], code: int = EXIT_ERROR) -> int:
    text = printable(redact(one_line(message), secrets))
    print(f"{PROG}: error: {text}", file=sys.stderr)
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
