"""``get``, ``list``, ``release``, ``create-table`` and ``migrate``: the store side of the
tool."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import aclosing
from typing import Any, TextIO

from idempotency_async.cli._errors import EXIT_NOT_FOUND, CliError
from idempotency_async.cli._postgres import PostgresTarget
from idempotency_async.cli._render import ROW_HEADER, record_json, record_lines, record_row
from idempotency_async.cli._schemes import parse_target
from idempotency_async.cli._targets import AwsSettings, Listing, Target
from idempotency_async.cli._terminal import printable
from idempotency_async.errors import InconsistentStateError
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
        if args.yes:
            deleted = await store.force_release(args.key)
            if deleted is None:
                raise _no_record(args.key)
        else:
            deleted = await _release_what_was_shown(store, args.key)
    now = time.time()
    if args.json:
        print(json.dumps({"deleted": record_json(deleted, now, show_response=False)}))
    else:
        print("deleted:")
        print("\n".join(f"  {line}" for line in record_lines(deleted, now)))
    return 0


async def _release_what_was_shown(store: Any, key: str) -> Record:
    """Show the record, ask, and delete exactly that record: if the key holds another one
    by then (a new call claimed it, the holder completed it, renewed its lease or recorded a
    step), the operator never saw it and nothing is deleted."""
    now = time.time()
    try:
        record: Record | None = (await store.get(key, now=now)).record
    except InconsistentStateError as exc:
        raise CliError(
            f"{exc}; the record cannot be shown, so there is nothing to confirm: pass --yes "
            "to delete whatever the key holds"
        ) from exc
    if record is None:
        raise _no_record(key)
    _confirm(record, now)
    if not await store.release_exactly(record):
        raise CliError(
            f"not released: the record of key {key!r} changed (or was deleted) since it was "
            "shown, so the one now there was never confirmed; run release again to see it"
        )
    return record


def _confirm(record: Record, now: float) -> None:
    err = sys.stderr
    print("\n".join(record_lines(record, now)), file=err)
    if record.status is Status.INPROGRESS and not record.is_claimable(now):
        print(
            "warning: the call holding this key may still be running; after the release a "
            "retry runs the side effect a second time",
            file=err,
        )
    if record.status is Status.INPROGRESS and record.steps is not None:
        print(
            "warning: the record holds recovery points (steps); after the release a retry "
            "runs every step again from the first (downstream keys derived in them stay the "
            "same)",
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
    limit: int | None = args.limit
    progress = _Progress(sys.stderr, forced=args.progress)
    shown = scanned = 0
    more: bool | None = False  # records past the limit; None: the pages read cannot tell
    now = time.time()
    header = not args.json
    # Reading one record past the limit tells whether more remain.
    wanted = None if limit is None else limit + 1
    pages = target.pages(store, status=status, page_size=args.page_size, limit=wanted)
    async with aclosing(store), aclosing(pages):
        async for page in pages:
            if header:  # after the first answer: an error is then the only output
                print(ROW_HEADER)
                header = False
            scanned += page.scanned
            if page.records:
                progress.clear()
            for record in page.records:
                if limit is not None and shown >= limit:
                    more = True
                    break
                shown += 1
                print(
                    json.dumps(record_json(record, now)) if args.json else record_row(record, now)
                )
            sys.stdout.flush()
            if more is not False:
                break  # a record past the limit, or the page read past it held none
            if limit is not None and shown >= limit:
                # The limit fell on a page's end: one more page tells whether any is left.
                # (Sized by the limit, the page that held the limit's records was short
                # when they were all: the listing then ends without another request.)
                more = None
            progress.update(scanned, shown)
        else:
            more = False  # read to the end
    progress.done()
    print(_list_summary(shown, scanned, limit, more), file=sys.stderr)
    return 0


def _list_summary(shown: int, scanned: int, limit: int | None, more: bool | None) -> str:
    what = "record" if shown == 1 else "records"
    read = f"read {scanned} items"
    if more is False:
        return f"{shown} {what} ({read})"
    rest = "more remain" if more else "there may be more"
    return f"{shown} {what} shown, stopped at --limit {limit}: {rest} ({read})"


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
    batch_size, max_batches = args.batch_size, args.max_batches
    deleted = await target.vacuum(batch_size=batch_size, max_batches=max_batches)
    what = "record" if deleted == 1 else "records"
    print(f"deleted {deleted} expired {what} from {target.table}")
    # Each batch deletes at most batch_size rows and only a full one is followed by
    # another, so this total means --max-batches stopped it after a full batch.
    if max_batches is not None and deleted == batch_size * max_batches:
        print(
            f"stopped after --max-batches {max_batches} with the last batch full: more "
            "expired records may remain; run the command again to continue (each run deletes "
            f"at most {deleted}), or leave out --max-batches to delete them all"
        )
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
