"""``get``, ``list``, ``release``, ``create-table`` and ``migrate``: the store side of the
tool."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import aclosing
from typing import TextIO

from idempotency_async.cli._errors import EXIT_NOT_FOUND, CliError
from idempotency_async.cli._postgres import PostgresTarget
from idempotency_async.cli._render import ROW_HEADER, record_json, record_lines, record_row
from idempotency_async.cli._schemes import parse_target
from idempotency_async.cli._targets import AwsSettings, Listing, Target
from idempotency_async.cli._terminal import printable
from idempotency_async.record import Record, Status

__all__ = ["run_create_table", "run_get", "run_list", "run_migrate", "run_release", "run_vacuum"]


def _aws(args: argparse.Namespace) -> AwsSettings:
    return AwsSettings(profile=args.profile, region=args.region)


def _target(args: argparse.Namespace) -> Target:
    return parse_target(args.store)


async def run_get(args: argparse.Namespace) -> int:
    store = _target(args).store(_aws(args))
    async with aclosing(store):
        now = time.time()
        record = (await store.get(args.key, now=now)).record
    if record is None:
        raise _no_record(args.key)
    if args.json:
        print(json.dumps(record_json(record, now, show_response=args.show_response)))
    else:
        print("\n".join(record_lines(record, now, show_response=args.show_response)))
    return 0


async def run_release(args: argparse.Namespace) -> int:
    if not args.yes and not _can_ask():
        raise CliError(
            "not released: stdin is closed, so the confirmation cannot be asked; "
            "pass --yes to release without asking"
        )
    store = _target(args).store(_aws(args))
    async with aclosing(store):
        if not args.yes:
            now = time.time()
            record = (await store.get(args.key, now=now)).record
            if record is None:
                raise _no_record(args.key)
            _confirm(record, now)
        deleted = await store.force_release(args.key)
    if deleted is None:
        raise _no_record(args.key)
    now = time.time()
    if args.json:
        print(json.dumps({"deleted": record_json(deleted, now, show_response=False)}))
    else:
        print("deleted:")
        print("\n".join(f"  {line}" for line in record_lines(deleted, now)))
    return 0


def _confirm(record: Record, now: float) -> None:
    err = sys.stderr
    print("\n".join(record_lines(record, now)), file=err)
    if record.status is Status.INPROGRESS and not record.is_claimable(now):
        print(
            "warning: the call holding this key may still be running; after the release a "
            "retry runs the side effect a second time",
            file=err,
        )
    print("Delete this record? [y/N] ", end="", file=err, flush=True)
    try:
        answer = sys.stdin.readline().strip().lower()
        tty = sys.stdin.isatty()
    except (OSError, ValueError) as exc:  # closed or unreadable since _can_ask
        raise CliError(f"not released: cannot read the answer ({exc}); pass --yes") from exc
    if not tty:
        print(printable(answer), file=err)  # a terminal echoes it; keep piped transcripts readable
    if answer not in ("y", "yes"):
        raise CliError("not released (answer y to confirm, or pass --yes)")


def _can_ask() -> bool:
    """Whether stdin can carry an answer (Python sets it to None when fd 0 is closed)."""
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        return False
    try:
        stdin.fileno()
    except (OSError, ValueError):
        return False
    return True


async def run_list(args: argparse.Namespace) -> int:
    target = _target(args)
    if not isinstance(target, Listing):
        raise CliError(f"list is not supported for {args.store.split(':', 1)[0]}:// stores")
    store = target.store(_aws(args))
    status = None if args.status is None else Status(args.status)
    progress = _Progress(sys.stderr, forced=args.progress)
    shown = scanned = 0
    now = time.time()
    header = not args.json
    async with (
        aclosing(store),
        aclosing(target.pages(store, status=status, page_size=args.page_size)) as pages,
    ):
        async for page in pages:
            if header:  # after the first answer: an error is then the only output
                print(ROW_HEADER)
                header = False
            scanned += page.scanned
            if page.records:
                progress.clear()
            for record in page.records:
                if args.limit is not None and shown >= args.limit:
                    break
                shown += 1
                print(
                    json.dumps(record_json(record, now)) if args.json else record_row(record, now)
                )
            sys.stdout.flush()
            if args.limit is not None and shown >= args.limit:
                break
            progress.update(scanned, shown)
    progress.done()
    what = "record" if shown == 1 else "records"
    print(f"{shown} {what} (read {scanned} items)", file=sys.stderr)
    return 0


async def run_create_table(args: argparse.Namespace) -> int:
    from idempotency_async.cli._dynamodb import DynamoDBTarget

    target = _target(args)
    if isinstance(target, PostgresTarget):
        return await _create_sql_table(target, print_sql=args.print_sql)
    if args.print_sql:
        raise CliError("--print-sql is for postgres:// stores")
    if not isinstance(target, DynamoDBTarget):
        raise CliError(
            "create-table is for dynamodb:// and postgres:// stores (Redis needs no table)"
        )
    await target.create_table(_aws(args))
    sort_key = target.options.get("sort_key_attr")
    mode = f", sort key {sort_key!r}" if sort_key else ""
    expiry = target.options.get("expiry_attr", "expiration")
    print(f"created table {target.table!r}{mode}, TTL on {expiry!r}")
    return 0


async def run_migrate(args: argparse.Namespace) -> int:
    target = _target(args)
    if not isinstance(target, PostgresTarget):
        raise CliError("migrate is for postgres:// stores (DynamoDB and Redis need none)")
    if args.print_sql:
        print(target.migration_sql(), end="")
        return 0
    await target.migrate()
    print(f"table {target.table!r} is at schema version {target.schema_version()}")
    return 0


async def run_vacuum(args: argparse.Namespace) -> int:
    target = _target(args)
    if not isinstance(target, PostgresTarget):
        raise CliError(
            "vacuum is for postgres:// stores (DynamoDB and Redis delete expired records "
            "themselves, by TTL)"
        )
    deleted = await target.vacuum(batch_size=args.batch_size, max_batches=args.max_batches)
    what = "record" if deleted == 1 else "records"
    print(f"deleted {deleted} expired {what} from {target.table}")
    return 0


async def _create_sql_table(target: PostgresTarget, *, print_sql: bool) -> int:
    if print_sql:
        print(target.sql(), end="")
        return 0
    await target.create_table()
    print(
        f"created table {target.table!r}, its expiry index and its transactional parts "
        f"(schema version {target.schema_version()}), or they existed"
    )
    return 0


def _no_record(key: str) -> CliError:
    return CliError(
        f"no record for key {key!r} (never claimed, released, or deleted by the TTL)",
        code=EXIT_NOT_FOUND,
    )


class _Progress:
    """``N items read, M listed…`` on stderr during long scans.

    Shown when stderr is a terminal and the scan takes over a second (redrawn in place), or
    on every page with ``--progress`` (one line per page when stderr is not a terminal).
    """

    def __init__(self, stream: TextIO, *, forced: bool) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._enabled = forced or self._tty
        self._every = 0.0 if forced else 1.0
        self._next = time.monotonic() + self._every
        self._drawn = False

    def update(self, scanned: int, matched: int) -> None:
        if not self._enabled or time.monotonic() < self._next:
            return
        end = "\r" if self._tty else "\n"
        print(f"{scanned} items read, {matched} listed…", end=end, file=self._stream, flush=True)
        self._drawn = True
        self._next = time.monotonic() + self._every

    def clear(self) -> None:
        """Erase the progress line before rows go to the same terminal."""
        if self._drawn and self._tty:
            print("\r\x1b[K", end="", file=self._stream, flush=True)
            self._drawn = False

    def done(self) -> None:
        if self._drawn and self._tty:
            print(file=self._stream)
