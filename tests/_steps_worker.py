"""Worker processes of the recovery-points crash matrix (tests/test_steps_crash.py).

One worker is one process running one idempotent call of three steps on a shared store
(``Manager`` + ``step``): create the order (a row in ``<table>_orders`` on Postgres, else a
ledger line), charge it at a fake provider (a ledger line carrying the step's
``downstream_key("charge")``), send the receipt (a ledger line).  The ledger is an
append-only file written with ``O_APPEND`` and one ``fsync`` per line, so a SIGKILL never
loses a line that was written.  A worker told to die kills itself with SIGKILL at its kill
point and writes a ``kill`` line first; the others write a JSON report when they finish.

Usage:
  python _steps_worker.py serve KIND
      (KIND: redis, redis-cluster, postgres, dynamodb:aioboto3, dynamodb:light)
      the forking server the matrix uses: imports the store's modules once, prints
      "ready", then reads one job (JSON) per line on stdin and forks one worker process
      per job, printing "started ID PID" and, when the worker ends, "exited ID CODE"
      (CODE as ``os.waitstatus_to_exitcode``: -9 for a SIGKILL).  A fork costs
      milliseconds where starting Python and importing a store's client costs a second of
      CPU: the whole matrix fits its time budget on two cores.  Stdin closed: it kills the
      workers still running and exits.
  python _steps_worker.py run JOB
      one worker in this process (a row replayed by hand).

A job: ``id``; ``store`` (``kind``: redis | redis-cluster | postgres | dynamodb, and where
it is);
``order`` (the payload's order id: the key); ``ledger``, ``report`` and ``log`` (paths);
``role`` (first | retry | replay: only ledger lines and reports tell them apart); ``kill``
(none; ``effect:STEP``: inside the step's function after its effect, before its recovery
point; ``commit:create_order``: during the COMMIT of the transactional step, on Postgres
with ``store.transactional``; ``recorded:STEP``: right after ``await step(...)`` returned;
``completion-unsent``: the callback returned, before the completion is sent;
``completion-unanswered``: the completion was written, before its answer reaches the
manager); ``timeout`` (the call's
deadline: its lease without renewal); ``renew`` (``Renewal(lease=...)`` or null); ``hold``
(seconds the charge step waits before its effect, so renewals happen first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

STEPS = ("create_order", "charge", "send_receipt")
"""The steps of the call, in order."""


class Ledger:
    """The append-only ledger: one JSON line per effect, synced before the effect returns."""

    def __init__(self, path: str, role: str) -> None:
        self.descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.path = path
        self.role = role

    def write(self, **line: Any) -> None:
        # One write of the whole line: O_APPEND makes it atomic across processes, fsync
        # makes it survive the SIGKILL that may follow.
        os.write(self.descriptor, (json.dumps({"w": self.role, **line}) + "\n").encode())
        os.fsync(self.descriptor)

    def lines(self) -> list[dict[str, Any]]:
        with open(self.path, encoding="utf-8") as ledger:
            return [json.loads(line) for line in ledger if line.strip()]


def record_summary(record: Any) -> dict[str, Any] | None:
    """What the report says of a record read back from the store."""
    if record is None:
        return None
    steps = None if record.steps is None else [entry[0] for entry in json.loads(record.steps)]
    return {
        "status": str(record.status),
        "lease_end": record.lease_end,
        "owner": record.owner,
        "steps": steps,
        "response": record.response,
    }


@contextlib.asynccontextmanager
async def open_store(spec: dict[str, Any]) -> AsyncIterator[Any]:
    kind = spec["kind"]
    if kind in ("redis", "redis-cluster"):
        import redis.asyncio as redis_asyncio

        from idempotency_async.stores.redis import RedisStore

        connect = redis_asyncio.RedisCluster if kind == "redis-cluster" else redis_asyncio.Redis
        async with connect(host="127.0.0.1", port=spec["port"]) as client:
            yield RedisStore(client, key_prefix=spec["prefix"])
    elif kind == "postgres":
        from idempotency_async.stores.postgres import PostgresStore

        async with PostgresStore.from_url(spec["dsn"], table=spec["table"]) as store:
            yield store
    elif kind == "dynamodb":
        from idempotency_async.stores.dynamodb import DynamoDBStore

        async with DynamoDBStore(
            client_factory=lambda: dynamodb_client(spec), table_name=spec["table"]
        ) as store:
            yield store
    else:
        raise ValueError(f"no store kind {kind!r}")


def dynamodb_client(spec: dict[str, Any]) -> Any:
    """The DynamoDB client of ``spec["transport"]``: the light one is built here, so that a
    worker on it never imports aioboto3."""
    if spec["transport"] == "aioboto3":
        from _moto import open_client

        return open_client(spec["endpoint"])
    from idempotency_async.stores.dynamodb_light import LightDynamoDBClient

    return LightDynamoDBClient(
        region="us-east-1",
        endpoint_url=spec["endpoint"],
        access_key_id="testing",
        secret_access_key="testing",
        session_token="testing",
        max_attempts=2,
        connect_timeout=5,
        read_timeout=30,
    )


class Orders:
    """Where ``create_order`` creates the order: a committed row on Postgres (the
    application's own database), else a ledger line."""

    def __init__(self, job: dict[str, Any], ledger: Ledger, connection: Any) -> None:
        self.job = job
        self.ledger = ledger
        self.connection = connection

    async def create(self) -> dict[str, Any]:
        order_id = uuid.uuid4().hex
        if self.connection is None:
            self.ledger.write(effect="create_order", id=order_id, t=time.time())
        else:
            await self.connection.execute(
                f"INSERT INTO {self.job['store']['table']}_orders (order_key, id, worker) "
                "VALUES ($1, $2, $3)",
                self.job["order"],
                order_id,
                self.job["role"],
            )
        return {"id": order_id}


async def work(job: dict[str, Any]) -> dict[str, Any]:
    from idempotency_async import Manager, Options, Renewal, downstream_key, errors, step

    kill = job["kill"]
    ledger = Ledger(job["ledger"], job["role"])
    events: Counter[str] = Counter()
    admitted: list[float] = []

    def note(event: Any) -> None:
        events.update([event.kind])
        print(f"{time.time():.3f} {event.kind} {event.error!r}", file=sys.stderr, flush=True)

    def die(point: str) -> None:
        if kill == point:
            ledger.write(kill=point, t=time.time())
            os.kill(os.getpid(), signal.SIGKILL)

    ledger.write(started=time.time())
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(job["store"]))
        connection = None
        if job["store"]["kind"] == "postgres":
            import asyncpg

            connection = await asyncpg.connect(job["store"]["dsn"])
            stack.push_async_callback(connection.close)
        orders = Orders(job, ledger, connection)
        if kill.startswith("completion-"):
            complete = store.complete

            async def completing(completion: Any) -> Any:
                die("completion-unsent")
                written = await complete(completion)
                die("completion-unanswered")
                return written

            store.complete = completing
        renew = job["renew"]
        options = Options(
            key_prefix="crash",
            event_key_jmespath="order",
            renewal=None if renew is None else Renewal(lease=renew),
            on_event=lambda event: note(event),
        )
        manager = Manager(store, options)
        payload = {"order": job["order"], "items": ["book", "lamp"]}
        key = manager.key_for(payload)
        assert key is not None

        async def charge(order: dict[str, Any]) -> dict[str, Any]:
            # The provider honours Idempotency-Key: a request with a key it has seen is
            # answered with the first charge and makes no new one (still a ledger line:
            # the raw level counts requests).
            await asyncio.sleep(job["hold"])
            sent = downstream_key("charge")
            seen = [
                line
                for line in ledger.lines()
                if line.get("effect") == "charge" and line["downstream"] == sent
            ]
            charge_id = seen[0]["id"] if seen else uuid.uuid4().hex
            ledger.write(
                effect="charge",
                id=charge_id,
                downstream=sent,
                order=order["id"],
                new=not seen,
                t=time.time(),
            )
            return {"id": charge_id}

        async def receipt(order: dict[str, Any], paid: dict[str, Any]) -> dict[str, Any]:
            receipt_id = uuid.uuid4().hex
            ledger.write(
                effect="send_receipt",
                id=receipt_id,
                order=order["id"],
                charge=paid["id"],
                t=time.time(),
            )
            return {"id": receipt_id}

        def effect(
            name: str,
            fn: Callable[[], Awaitable[dict[str, Any]]],
            then: Callable[[], None] = lambda: None,
        ) -> Any:
            async def run() -> dict[str, Any]:
                result = await fn()
                die(f"effect:{name}")
                then()
                return result

            return run

        async def place_order() -> dict[str, Any]:
            admitted.append(time.time())
            ledger.write(admitted=admitted[-1])
            if job["store"].get("transactional"):
                # A transactional step: the row commits with its recovery point, or not at
                # all.  Killed during its COMMIT (which a deferred trigger on the orders
                # table makes last 2 s), 0.5 s after the function returned.
                def during_commit() -> None:
                    asyncio.get_running_loop().call_later(0.5, die, "commit:create_order")

                order = await step(
                    "create_order",
                    effect("create_order", orders.create, then=during_commit),
                    connection=connection,
                )
            else:
                order = await step("create_order", effect("create_order", orders.create))
            die("recorded:create_order")
            paid = await step("charge", effect("charge", lambda: charge(order)))
            die("recorded:charge")
            sent = await step("send_receipt", effect("send_receipt", lambda: receipt(order, paid)))
            die("recorded:send_receipt")
            return {"order": order["id"], "charge": paid["id"], "receipt": sent["id"]}

        attempts: list[float] = []  # when it went for each claim (the last got through)
        while True:
            # What the call that gets through resumes: read before each attempt (a killed
            # worker's transaction may still be committing when the first one goes out).
            attempts.append(time.time())
            before = await store.get(key, now=time.time())
            sent = time.time()
            try:
                result = await manager.execute(payload, place_order, timeout=job["timeout"])
                break
            except errors.AlreadyInProgressError as exc:
                # Claim again when the store says the lease ends: retry_after counts from
                # when the claim was sent (the error's lease_end, from when it was raised,
                # is later by the claim's round trip).
                end = sent + (exc.retry_after if exc.retry_after is not None else 0.05)
                await asyncio.sleep(max(end - time.time(), 0.0) + 0.01)
        finished = time.time()
        after = await store.get(key, now=time.time())
    return {
        "role": job["role"],
        "key": key,
        "before": record_summary(before.record),
        "attempts": attempts,
        "admitted": admitted,
        "result": result,
        "finished": finished,
        "events": dict(events),
        "after": record_summary(after.record),
    }


def run(job: dict[str, Any]) -> int:
    """Run one worker in this process; its report goes to ``job["report"]``."""
    try:
        report = asyncio.run(work(job))
    except BaseException:
        traceback.print_exc()
        return 1
    with open(job["report"] + ".part", "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(job["report"] + ".part", job["report"])
    return 0


def warm(kind: str) -> None:
    """Import what a worker on ``kind`` imports, once, before any fork."""
    import idempotency_async

    if kind in ("redis", "redis-cluster"):
        import redis.asyncio  # noqa: F401

        import idempotency_async.stores.redis
    elif kind == "postgres":
        import asyncpg  # noqa: F401

        import idempotency_async.stores.postgres
    else:
        import idempotency_async.stores.dynamodb
        import idempotency_async.stores.dynamodb_light  # noqa: F401

        async def client() -> None:
            # aioboto3's session and botocore's service model (a second of CPU) are built
            # once, here, instead of in every worker; nothing is sent.
            async with dynamodb_client({"transport": "aioboto3", "endpoint": "http://127.0.0.1:9"}):
                pass

        if kind == "dynamodb:aioboto3":
            asyncio.run(client())


def serve(kind: str) -> None:
    """Fork one worker per job read on stdin; report starts and exits on stdout.

    Single-threaded (``select`` on stdin, ``waitpid`` without blocking), and no event loop
    before a fork: each child starts its own."""
    warm(kind)
    print("ready", flush=True)
    children: dict[int, str] = {}
    pending = b""
    open_input = True
    while open_input or children:
        if open_input and select.select([0], [], [], 0.005)[0]:
            data = os.read(0, 1 << 16)
            if not data:
                open_input = False
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                job = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    child(job)
                children[pid] = job["id"]
                print(f"started {job['id']} {pid}", flush=True)
        elif not open_input:
            time.sleep(0.005)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(f"exited {children.pop(pid)} {os.waitstatus_to_exitcode(status)}", flush=True)


def child(job: dict[str, Any]) -> None:
    """A forked worker: its own output file, its own event loop; never returns."""
    code = 1
    try:
        output = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        code = run(job)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(run(json.loads(sys.argv[2])))
