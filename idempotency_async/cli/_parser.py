"""The command line: subcommands, options and their help (argparse)."""

from __future__ import annotations

import argparse
import os
from importlib import metadata
from typing import Any

from idempotency_async.canonical import HASH_ALGORITHMS
from idempotency_async.record import Status

__all__ = ["PROG", "STORE_ENV", "build_parser"]

PROG = "idempotency-async"
STORE_ENV = "IDEMPOTENCY_ASYNC_STORE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate idempotency records: which key, what state, unstick it.",
        epilog="Exit codes: 0 done, 1 error, 2 usage, 3 no record for the key. See docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_key(commands)
    store = _store_options()
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON for scripts")

    get = commands.add_parser(
        "get",
        parents=[store, output],
        help="show the record of a key",
        description=(
            "Show the record of KEY: status, lease end and expiry, owner, validation hash."
        ),
    )
    get.add_argument("key", metavar="KEY", help="the full key, e.g. from the key command")
    get.add_argument(
        "--show-response",
        action="store_true",
        help="also print the stored response (it may hold personal data)",
    )

    listing = commands.add_parser(
        "list",
        parents=[store, output],
        help="list records, optionally by status",
        description=(
            "List records, page by page as they are read. DynamoDB: a Query in sort-key "
            "mode, a Scan of the table otherwise. Redis: a SCAN of the keys under the URL's "
            "key_prefix. Postgres: the table in key order. A summary on stderr says how many "
            "were listed, and with --limit whether more remain."
        ),
    )
    listing.add_argument(
        "--status", choices=[status.value for status in Status], help="only records in it"
    )
    listing.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        help="show at most N records, reading little more than they need (default: all)",
    )
    listing.add_argument(
        "--page-size",
        metavar="N",
        type=_positive_int,
        help="records read per request to the store: DynamoDB's Limit (default: as many as "
        "fit in 1 MB), Redis's SCAN COUNT (default 100), Postgres rows per statement "
        "(default 1000). With --limit N the default reads N+1 at most (DynamoDB and Redis: "
        "only without --status, as they filter after reading)",
    )
    listing.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr after every page (default: on a terminal, after 1 s)",
    )

    release = commands.add_parser(
        "release",
        parents=[store, output],
        help="delete the record of a key, whatever its state",
        description=(
            "Delete the record of KEY whatever its state, so the next call runs again. "
            "If the call holding the key is still running, a retry runs it a second time."
        ),
    )
    release.add_argument("key", metavar="KEY")
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    create = commands.add_parser(
        "create-table",
        parents=[store],
        help="create the table for the store URL (DynamoDB, Postgres)",
        description=(
            "Create the DynamoDB table the store URL names (on-demand billing, TTL on the "
            "expiry attribute); sort-key mode when the URL sets sort_key_attr. For "
            "postgres:// the table, its expiry index and its transactional parts (the guard "
            "trigger, the claim function), if missing."
        ),
    )
    create.add_argument(
        "--print-sql",
        action="store_true",
        help="postgres:// only: print the SQL for a migration instead of running it",
    )
    migrate = commands.add_parser(
        "migrate",
        parents=[store],
        help="bring a postgres:// table to the library's schema version",
        description=(
            "Add to a postgres:// table created by an earlier version what this version needs "
            "(for transactional calls: the guard trigger that refuses to commit an unfinished "
            "claim, and the claim function). Idempotent; run it as the table's owner."
        ),
    )
    migrate.add_argument(
        "--print-sql",
        action="store_true",
        help="print the SQL for a migration tool (or a DBA) instead of running it",
    )
    _add_vacuum(commands, store)
    return parser


def _add_vacuum(commands: Any, store: argparse.ArgumentParser) -> None:
    vacuum = commands.add_parser(
        "vacuum",
        parents=[store],
        help="delete expired records (postgres://)",
        description=(
            "Delete expired records from a postgres:// store, BATCH rows per statement "
            "(each its own short transaction), until none is left or MAX batches ran. "
            "When it stops at MAX with the last batch full, it says more may remain: run it "
            "again to continue."
        ),
    )
    vacuum.add_argument(
        "--batch-size",
        metavar="BATCH",
        type=_positive_int,
        default=1000,
        help="rows deleted per statement (default 1000)",
    )
    vacuum.add_argument(
        "--max-batches",
        metavar="MAX",
        type=_positive_int,
        help="stop after MAX statements, at most BATCH x MAX rows (default: until none is left)",
    )


def _add_key(commands: Any) -> None:
    key = commands.add_parser(
        "key",
        help="print the key of a JSON payload or an HTTP request",
        description=(
            "Print the idempotency key the service derives for a JSON payload (a file, or "
            "stdin), or with --http for a request to the Idempotency-Key middleware."
        ),
    )
    key.add_argument("payload", nargs="?", metavar="PAYLOAD", help="JSON file ('-': stdin)")
    key.add_argument("--prefix", metavar="P", help="key_prefix (default: as the service)")
    key.add_argument(
        "--jmespath", metavar="E", help="event_key_jmespath (default: the whole payload)"
    )
    key.add_argument(
        "--validation-jmespath",
        metavar="E",
        help="payload_validation_jmespath: also print the validation hash",
    )
    key.add_argument(
        "--hash",
        default="md5",
        metavar="NAME",
        help=f"hash_function (md5; {', '.join(sorted(HASH_ALGORITHMS))}, and with "
        "--key-format powertools-python the hashes Powertools accepts)",
    )
    key.add_argument(
        "--key-format",
        default="typescript",
        choices=("typescript", "powertools-python"),
        help="key_format: typescript (default), or powertools-python for keys "
        "aws-lambda-powertools (Python) derives",
    )
    key.add_argument(
        "--powertools-version",
        metavar="3.X",
        help="with --key-format powertools-python: the Powertools release whose rules to follow",
    )
    key.add_argument(
        "--integer-precision",
        default="strict",
        choices=("strict", "float64"),
        help="integer_precision (strict)",
    )
    key.add_argument(
        "--function",
        metavar="MODULE:QUALNAME",
        help="the key of an @idempotent_function (its per-function prefix)",
    )
    key.add_argument(
        "--http",
        nargs=3,
        metavar=("METHOD", "ROUTE", "KEY"),
        help="the key of an HTTP request: method, route template, Idempotency-Key value",
    )
    key.add_argument(
        "--caller", metavar="SCOPE", help="with --http: what the app's caller_scope returned"
    )
    key.add_argument("--json", action="store_true", help="print JSON for scripts")


def _store_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get(STORE_ENV),
        help=f"dynamodb://TABLE?region=…, redis://HOST:PORT/DB or "
        f"postgres://USER@HOST/DB?table=NAME, with record_format=… for Powertools (Python) "
        f"records (default: ${STORE_ENV})",
    )
    options.add_argument("--profile", help="AWS profile (default: AWS_PROFILE or default)")
    options.add_argument("--region", help="AWS region (default: the URL's, then AWS_REGION)")
    return options


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _version() -> str:
    try:
        return metadata.version("idempotency-async")
    except metadata.PackageNotFoundError:
        return "unknown"
