"""Recovery points across process crashes: a worker SIGKILLs itself at each step boundary
of a three-step call on a shared store, a retry worker resumes the key once its lease
ends, and a third worker replays the result.  An oracle counts the effects of each step.

The call (``tests/_steps_worker.py``): ``create_order`` (a row in the application's table
on Postgres, as a transactional step once ``step(..., connection=)`` exists; a ledger
line elsewhere), ``charge`` (a fake provider that honours ``Idempotency-Key``: a ledger
line per request, carrying the step's ``downstream_key("charge")``; a key it has seen
makes no new charge), ``send_receipt`` (a ledger line).  The ledger is append-only, one
``fsync`` per line: the SIGKILL loses nothing written.

Kill points (``Row``): inside a step's function after its effect, before its recovery
point (``effect:STEP``); right after ``await step(...)`` returned (``recorded:STEP``);
during the final completion, before it is sent and after it was written
(``completion-unsent``, ``completion-unanswered``); with renewal on, after the charge's
effect; twice in a row (the resumed call dies too); and on Postgres during the
transactional step's COMMIT.  Judged per row: the steps before the kill point ran once;
the interrupted step ran twice at the raw level and made one charge per downstream key at
the provider; a transactional step's row once; the retry got through with the first
claim it sent after the lease end, sent within ``MARGIN`` of it, and started nothing
before it (with renewal: one short lease after the kill, not the deadline); it replayed
the recorded steps and recorded the others; the final record is completed and holds no
steps, read raw; a third worker replays the result and runs nothing.

Every shared store with the ``RecordsSteps`` capability is in the matrix; a test pins
which shared stores lack it, so a store gains its rows when it gains the capability.
The rows of every store run at once, forked from one server process per store (a fork
costs milliseconds where a fresh interpreter costs a second of CPU), once per session
(under pytest-xdist too).  ``STEPS_CRASH_DYNAMODB=aioboto3`` runs the DynamoDB workers on
aioboto3 instead of the light transport (same requests, more CPU per worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import json
import os
import sys
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _moto import fresh_table, open_client
from _postgres import fresh_table_name

from idempotency_async import step
from idempotency_async.stores.base import RecordsSteps
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.postgres import PostgresStore, create_table
from idempotency_async.stores.redis import RedisStore

WORKER = Path(__file__).with_name("_steps_worker.py")
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [
            str(Path(__file__).parent),
            str(Path(__file__).parents[1]),
            os.environ.get("PYTHONPATH", ""),
        ]
    ),
}

SHARED_STORES: dict[str, type[Any]] = {
    "dynamodb": DynamoDBStore,
    "postgres": PostgresStore,
    "redis": RedisStore,
    "redis-cluster": RedisStore,
}
"""The stores several processes share (MemoryStore is one process's), as deployed."""
WITHOUT_STEPS: frozenset[str] = frozenset()
"""The shared stores expected to lack ``RecordsSteps`` today: remove a store from here
when its branch lands, and its rows run."""
STEP_STORES = [name for name, cls in SHARED_STORES.items() if issubclass(cls, RecordsSteps)]
MARKS = {
    "dynamodb": pytest.mark.dynamodb,
    "postgres": pytest.mark.postgres,
    "redis": pytest.mark.redis,
    "redis-cluster": pytest.mark.redis,
}

DYNAMODB_TRANSPORT = os.environ.get("STEPS_CRASH_DYNAMODB", "light")
"""The DynamoDB transport of the workers: both send the same requests (the store suites
run both); the light one costs a worker less CPU."""

STEPS = ("create_order", "charge", "send_receipt")
LEASE = 6.0
"""The killed worker's deadline, and so its lease, without renewal (seconds): on a 2-core
machine at a load average of 15, a moto server takes up to a second per write, and three
steps and a completion must fit before the cutoff."""
RENEW = 6.0
"""The short lease with renewal on (the deadline is then ``RENEWED_DEADLINE``): renewed
every 2 s, so a renewal a loaded moto leaves unanswered is survived by the next."""
RENEWED_DEADLINE = 30.0
HOLD = RENEW + 0.5
"""How long the renewed row's charge waits before its effect: its key outlives the first
short lease, renewed."""
MARGIN = 0.75
"""How long after the lease end (or after it started, if later) the retry may send the
claim that gets through: it sleeps the ``retry_after`` each refusal says, on a loaded
2-core machine."""
SETUPS = 3
"""How many times a row is run at most while its dying worker is cut off before its kill
point (``run_row``)."""
_CUT_OFF = "DeadlineExceededError: the call for key"
EARLY = 0.02
"""Clock granularity: the stores write lease ends in milliseconds."""


@dataclass(frozen=True)
class Row:
    kill: str
    renew: float | None = None
    then: str | None = None
    """Where the worker that resumes dies in turn (a second crash), if it does."""

    @property
    def name(self) -> str:
        return (
            self.kill + ("+renewal" if self.renew else "") + (f"+{self.then}" if self.then else "")
        )

    @property
    def kills(self) -> list[str]:
        return [self.kill] if self.then is None else [self.kill, self.then]

    @property
    def recorded(self) -> tuple[str, ...]:
        """The steps on the record when the last worker died."""
        where, _, name = self.kills[-1].partition(":")
        if where == "effect":
            return STEPS[: STEPS.index(name)]
        if where in ("recorded", "commit"):
            return STEPS[: STEPS.index(name) + 1]
        return STEPS

    @property
    def interrupted(self) -> Counter[str]:
        """The steps whose effect happened without their recovery point, per crash."""
        return Counter(kill.partition(":")[2] for kill in self.kills if kill.startswith("effect:"))


ROWS = [
    *(Row(f"effect:{name}") for name in STEPS),
    *(Row(f"recorded:{name}") for name in STEPS),
    Row("completion-unsent"),
    Row("completion-unanswered"),
    Row("effect:charge", renew=RENEW),
    # A resumed call dies too: the next one resumes what both recorded.
    Row("recorded:create_order", then="effect:send_receipt"),
]
TRANSACTIONAL = "connection" in inspect.signature(step).parameters
"""Whether transactional steps exist (``step(..., connection=conn)``): then on Postgres
``create_order`` is one, and a row kills the worker during its COMMIT."""


def rows_of(store: str) -> list[Row]:
    if store == "postgres" and TRANSACTIONAL:
        return [*ROWS, Row("commit:create_order")]
    return ROWS


@dataclass
class Outcome:
    """One row's run: the workers' exit codes, reports and logs, and the effects."""

    codes: list[int] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    orders: list[dict[str, Any]] = field(default_factory=list)
    """Postgres: the order rows (id, worker)."""
    final: set[str] = field(default_factory=set)
    """The fields of the stored record once every worker ended, read raw."""
    setups: int = 1
    """How many times the row was run (``run_row``: a dying worker cut off first)."""
    committed: float | None = None
    """Postgres: when the COMMIT that kills its worker went on past its 2 s trigger."""

    def explain(self) -> str:
        return "\n".join(
            ["--- ledger", *map(json.dumps, self.ledger), "--- orders", *map(str, self.orders)]
            + [
                f"--- worker {n} (exit {c})\n{log[-3000:]}"
                for n, (c, log) in enumerate(zip(self.codes, self.logs, strict=True))
            ]
        )


class Forks:
    """The worker server of one store: jobs in, "started"/"exited" lines out."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.exits: dict[str, asyncio.Future[int]] = {}
        self.ready = asyncio.get_running_loop().create_future()
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            word, *rest = line.decode().split()
            if word == "ready":
                self.ready.set_result(None)
            elif word == "exited":
                self.exits[rest[0]].set_result(int(rest[1]))
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("the worker server ended before it was ready"))

    async def run(self, job: dict[str, Any]) -> int:
        """Fork a worker for ``job`` and wait for its exit code."""
        exited = self.exits[job["id"]] = asyncio.get_running_loop().create_future()
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(job).encode() + b"\n")
        await self.process.stdin.drain()
        return await exited


@contextlib.asynccontextmanager
async def forks(kind: str) -> Any:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        "serve",
        kind,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=ENV,
    )
    server = Forks(process)
    try:
        await asyncio.wait_for(server.ready, timeout=60)
        yield server
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()
        await server.reader


async def run_row(server: Forks, spec: dict[str, Any], row: Row, directory: Path) -> Outcome:
    """The row, run again with a new key (at most ``SETUPS`` times in all) while a worker
    meant to die at its kill point was cut off before it: a machine too loaded to run the
    steps within the lease sets nothing up.  Anything else is judged as it ran."""
    for setup in range(1, SETUPS + 1):
        outcome = await run_row_once(server, spec, row, directory / f"{setup}")
        outcome.setups = setup
        dying = zip(outcome.codes[: len(row.kills)], outcome.logs, strict=False)
        if not any(code == 1 and _CUT_OFF in log for code, log in dying):
            break
    return outcome


async def run_row_once(server: Forks, spec: dict[str, Any], row: Row, directory: Path) -> Outcome:
    """The row's workers, one after the other: the one that dies (and the one that
    resumes and dies in turn, if the row says so), the retry, the replay."""
    os.makedirs(directory, exist_ok=True)
    slug = row.name.replace(":", "-").replace("+", "-")
    order = f"{slug}-{uuid.uuid4().hex[:8]}"
    ledger = directory / f"{slug}.ledger"
    outcome = Outcome()
    dying = dict(zip(("first", "second"), row.kills, strict=False))
    for role in [*dying, "retry", "replay"]:
        job = {
            "id": f"{directory.name}.{slug}.{role}",
            "store": spec,
            "order": order,
            "ledger": str(ledger),
            "report": str(directory / f"{slug}.{role}.json"),
            "log": str(directory / f"{slug}.{role}.log"),
            "role": role,
            "kill": dying.get(role, "none"),
            "timeout": (RENEWED_DEADLINE if row.renew else LEASE) if role == "first" else 10.0,
            "renew": row.renew if role == "first" else None,
            "hold": HOLD if row.renew and role == "first" else 0.0,
        }
        outcome.codes.append(await server.run(job))
        outcome.logs.append(read(job["log"]))
        report = read(job["report"])
        outcome.reports.append(json.loads(report) if report else {})
        if role in dying and outcome.codes[-1] != -9:
            break  # it did not die where it should: judged (or set up again) as it is
    outcome.ledger = [json.loads(line) for line in read(str(ledger)).splitlines() if line]
    outcome.orders = [{"order": order}]  # the key; the rows are read once every row ended
    return outcome


def read(path: str) -> str:
    """A worker's file, or "" when it wrote none (a worker that died first)."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except FileNotFoundError:
        return ""


@dataclass(frozen=True)
class Unavailable:
    """A store whose server could not start (outside CI: with CI=true that fails)."""

    reason: str


SERVERS = {
    "dynamodb": "moto_endpoint",
    "postgres": "postgres_server",
    "redis": "redis_server",
    "redis-cluster": "redis_cluster",
}
"""The session fixture that starts each store's server (tests/conftest.py)."""


async def prepare(kind: str, server: Any) -> dict[str, Any]:
    """Where the workers find the store: a table, or a key prefix, of this run's own."""
    if kind in ("redis", "redis-cluster"):
        return {"kind": kind, "port": server.port, "prefix": f"c{uuid.uuid4().hex[:8]}:"}
    if kind == "postgres":
        import asyncpg

        table = fresh_table_name()
        connection = await asyncpg.connect(server.dsn)
        try:
            await create_table(connection, table=table)
            await connection.execute(
                f"CREATE TABLE {table}_orders (order_key text NOT NULL, id text NOT NULL, "
                "worker text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
            # The COMMIT of the row that kills its worker during one takes 2 s: a deferred
            # trigger, run by the COMMIT itself, which then notes when it went on.
            await connection.execute(
                f"CREATE TABLE {table}_commits (order_key text NOT NULL, at float8 NOT NULL)"
            )
            await connection.execute(
                f"CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.order_key LIKE 'commit-%' AND NEW.worker = 'first' THEN "
                f"PERFORM pg_sleep(2); INSERT INTO {table}_commits VALUES (NEW.order_key, "
                "extract(epoch FROM clock_timestamp())); END IF; RETURN NULL; END $$"
            )
            await connection.execute(
                f"CREATE CONSTRAINT TRIGGER {table}_slow AFTER INSERT ON {table}_orders "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {table}_slow()"
            )
        finally:
            await connection.close()
        return {"kind": kind, "dsn": server.dsn, "table": table, "transactional": TRANSACTIONAL}
    async with open_client(server) as client:
        table = await fresh_table(client)
    return {"kind": kind, "endpoint": server, "table": table, "transport": DYNAMODB_TRANSPORT}


async def orders_of(spec: dict[str, Any], outcomes: list[Outcome]) -> None:
    """The orders each row created: rows of the orders table on Postgres, else lines."""
    if spec["kind"] != "postgres":
        for outcome in outcomes:
            outcome.orders = [
                {"id": line["id"], "worker": line["w"]}
                for line in outcome.ledger
                if line.get("effect") == "create_order"
            ]
        return
    import asyncpg

    connection = await asyncpg.connect(spec["dsn"])
    try:
        for outcome in outcomes:
            key = outcome.orders[0]["order"]
            rows = await connection.fetch(
                f"SELECT id, worker FROM {spec['table']}_orders WHERE order_key = $1 ORDER BY at",
                key,
            )
            outcome.orders = [dict(row) for row in rows]
            outcome.committed = await connection.fetchval(
                f"SELECT at FROM {spec['table']}_commits WHERE order_key = $1", key
            )
    finally:
        await connection.close()


async def raw_fields(spec: dict[str, Any], key: str) -> set[str]:
    """The fields the stored record of ``key`` holds a value in, read past the store's
    own reader (which may not show what it does not expect): Redis's JSON members,
    Postgres's non-null columns, DynamoDB's attributes."""
    if spec["kind"] in ("redis", "redis-cluster"):
        import redis.asyncio as redis_asyncio

        cluster = spec["kind"] == "redis-cluster"
        connect = redis_asyncio.RedisCluster if cluster else redis_asyncio.Redis
        async with connect(host="127.0.0.1", port=spec["port"]) as client:
            raw = await client.get(spec["prefix"] + key)
        return set() if raw is None else {k for k, v in json.loads(raw).items() if v is not None}
    if spec["kind"] == "postgres":
        import asyncpg

        connection = await asyncpg.connect(spec["dsn"])
        try:
            row = await connection.fetchrow(f"SELECT * FROM {spec['table']} WHERE key = $1", key)
        finally:
            await connection.close()
        return set() if row is None else {k for k, v in row.items() if v is not None}
    async with open_client(spec["endpoint"]) as client:
        item = await client.get_item(
            TableName=spec["table"], Key={"id": {"S": key}}, ConsistentRead=True
        )
    return set(item.get("Item", {}))


async def run_matrix(kind: str, server: Any, directory: Path) -> dict[str, Outcome]:
    """Every row of one store, at once."""
    spec = await prepare(kind, server)
    async with forks(f"{kind}:{DYNAMODB_TRANSPORT}" if kind == "dynamodb" else kind) as workers:
        outcomes = await asyncio.gather(
            *(run_row(workers, spec, row, directory / kind) for row in rows_of(kind))
        )
    await orders_of(spec, outcomes)
    for outcome in outcomes:
        if outcome.reports[-1]:
            outcome.final = await raw_fields(spec, outcome.reports[-1]["key"])
    return {row.name: outcome for row, outcome in zip(rows_of(kind), outcomes, strict=True)}


async def run_all(servers: dict[str, Any], directory: Path) -> dict[str, Any]:
    """Every store's matrix at once: the rows mostly wait for leases to end."""
    kinds = [kind for kind, server in servers.items() if not isinstance(server, Unavailable)]
    for kind in kinds:
        (directory / kind).mkdir()
    matrices = await asyncio.wait_for(
        asyncio.gather(*(run_matrix(kind, servers[kind], directory) for kind in kinds)),
        timeout=180,
    )
    return {**servers, **dict(zip(kinds, matrices, strict=True))}


@pytest.fixture(scope="module")
def crashes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The rows of every store this session selected, run at once: for each store, its
    outcomes by row name, or why its server could not start (outside CI).

    Run once per session, also under pytest-xdist: the first worker to get here runs the
    matrix and leaves the outcomes in the run's shared temporary directory, where the
    others, waiting on a lock, read them (the matrix twice at once would load the machine
    its timings are judged on)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    with open(shared / "steps-crash.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = shared / "steps-crash.json"
        if saved.exists():
            return load(saved.read_text())
        selected = set()
        for item in request.session.items:
            callspec = getattr(item, "callspec", None)
            if item.path == request.path and callspec is not None and "store" in callspec.params:
                selected.add(callspec.params["store"])
        servers: dict[str, Any] = {}
        for kind in sorted(selected):
            try:
                servers[kind] = request.getfixturevalue(SERVERS[kind])
            except pytest.skip.Exception as exc:  # CI=true fails instead (tests/_redis.py)
                servers[kind] = Unavailable(str(exc))
        outcomes = asyncio.run(run_all(servers, tmp_path_factory.mktemp("steps-crash")))
        saved.write_text(dump(outcomes))
        return outcomes


def dump(outcomes: dict[str, Any]) -> str:
    return json.dumps(
        {
            store: {"unavailable": rows.reason}
            if isinstance(rows, Unavailable)
            else {name: {**asdict(o), "final": sorted(o.final)} for name, o in rows.items()}
            for store, rows in outcomes.items()
        }
    )


def load(text: str) -> dict[str, Any]:
    return {
        store: Unavailable(rows["unavailable"])
        if "unavailable" in rows
        else {name: Outcome(**{**o, "final": set(o["final"])}) for name, o in rows.items()}
        for store, rows in json.loads(text).items()
    }


def test_the_shared_stores_without_recovery_points_are_the_expected_ones() -> None:
    # A store gains its rows in the matrix by gaining the capability: this pins which
    # shared stores have not, so that losing it (or gaining it unnoticed) is a failure.
    lacking = {name for name, cls in SHARED_STORES.items() if not issubclass(cls, RecordsSteps)}
    assert lacking == WITHOUT_STEPS


@pytest.mark.parametrize(
    ("store", "row"),
    [
        pytest.param(store, row, marks=MARKS[store], id=f"{store}-{row.name}")
        for store in STEP_STORES
        for row in rows_of(store)
    ],
)
def test_a_crash_at_a_step_boundary_resumes_once(
    crashes: dict[str, Any], store: str, row: Row
) -> None:
    if isinstance(crashes[store], Unavailable):
        pytest.skip(crashes[store].reason)
    outcome = crashes[store][row.name]
    why = outcome.explain()
    assert outcome.codes == [-9] * len(row.kills) + [0, 0], why
    *dead, retry, replay = outcome.reports
    assert dead == [{}] * len(row.kills), why  # they died before reporting
    kills = [line for line in outcome.ledger if "kill" in line]
    assert [line["kill"] for line in kills] == row.kills, why
    killed = kills[-1]

    # The effects: once each, the interrupted step twice at the raw level.
    runs = Counter(line["effect"] for line in outcome.ledger if "effect" in line)
    runs["create_order"] = len(outcome.orders)
    expected = Counter(STEPS) + row.interrupted
    if store == "postgres" and TRANSACTIONAL:
        # A transactional step's row commits with its recovery point or not at all
        # (test_a_transactional_step_commits_its_row_once_across_a_kill).
        expected["create_order"] = 1
    assert runs == expected, why
    charges = [line for line in outcome.ledger if line.get("effect") == "charge"]
    assert len({line["downstream"] for line in charges}) == 1, why
    assert sum(line["new"] for line in charges) == 1, why  # one charge at the provider
    assert all(line["w"] != "replay" for line in outcome.ledger if "effect" in line), why
    assert all(order["worker"] != "replay" for order in outcome.orders), why

    # What the retry found, when it was admitted, what it replayed and recorded.
    before = retry["before"]
    assert before is not None, why
    expected_result = {
        "order": outcome.orders[-1]["id"],
        "charge": charges[0]["id"],
        "receipt": [line["id"] for line in outcome.ledger if line.get("effect") == "send_receipt"][
            -1
        ],
    }
    assert retry["result"] == expected_result, why
    if row.kill == "completion-unanswered":
        assert before["status"] == "COMPLETED" and before["steps"] is None, why
        assert retry["admitted"] == [] and len(retry["attempts"]) == 1, why
        assert retry["events"] == {"replayed": 1}, why
    else:
        assert before["status"] == "INPROGRESS", why
        assert tuple(before["steps"] or ()) == row.recorded, why
        # Admitted by the first claim sent after the lease end (every claim sent before
        # it refused), sent promptly, and not before the lease end.
        [admitted] = retry["admitted"]
        lease_end = before["lease_end"]
        *refused, through = retry["attempts"]
        assert all(sent < lease_end for sent in refused), (lease_end, retry["attempts"], why)
        assert through <= max(lease_end, retry["attempts"][0]) + MARGIN, (
            through - lease_end,
            why,
        )
        assert admitted >= lease_end - EARLY, (admitted - lease_end, why)
        if row.renew:
            # One short lease after the kill, not the deadline.
            assert lease_end <= killed["t"] + row.renew + EARLY, (lease_end - killed["t"], why)
        recorded = len(row.recorded)
        events = {"step_replayed": recorded, "step_recorded": 3 - recorded, "claimed": 1}
        assert {kind: retry["events"].get(kind, 0) for kind in events} == events, why
        assert retry["events"].get("completed") == 1, why
    assert retry["after"]["status"] == "COMPLETED" and retry["after"]["steps"] is None, why
    assert retry["after"]["response"] == expected_result, why
    # Read past the store's reader: the completion dropped the steps from the stored record.
    assert outcome.final and not outcome.final & {"steps", "step_count"}, (outcome.final, why)

    # A third worker replays the result and runs nothing.
    assert replay["before"]["status"] == "COMPLETED" and replay["before"]["steps"] is None, why
    assert replay["result"] == expected_result, why
    assert replay["admitted"] == [] and len(replay["attempts"]) == 1, why
    assert replay["events"] == {"replayed": 1}, why


@pytest.mark.postgres
@pytest.mark.skipif(not TRANSACTIONAL, reason="transactional steps are not built")
@pytest.mark.parametrize("row", rows_of("postgres"), ids=[row.name for row in rows_of("postgres")])
@pytest.mark.parametrize("store", ["postgres"])
def test_a_transactional_step_commits_its_row_once_across_a_kill(
    crashes: dict[str, Any], store: str, row: Row
) -> None:
    # create_order is a transactional step on Postgres: killed in its function (before
    # its COMMIT was sent) the row rolled back with the transaction, and the retry made it;
    # killed during its COMMIT, the row committed with its recovery point and the retry
    # replayed it; anywhere else it committed once.  Never two rows, never a row without
    # its recovery point.
    if isinstance(crashes[store], Unavailable):
        pytest.skip(crashes[store].reason)
    outcome = crashes[store][row.name]
    why = outcome.explain()
    [order] = outcome.orders
    retry = outcome.reports[-2]
    made_by = "retry" if row.kill == "effect:create_order" else "first"
    assert order["worker"] == made_by, why
    assert retry["result"]["order"] == order["id"], why
    if row.kill.startswith("commit:"):
        # The kill came while the COMMIT ran (before the trigger inside it let it go on).
        [killed] = [line for line in outcome.ledger if "kill" in line]
        assert outcome.committed is not None and killed["t"] < outcome.committed, why
        assert retry["before"]["steps"] == ["create_order"], why
