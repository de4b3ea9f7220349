"""Pytest fixtures for Postgres tests: a real ``postgres`` server on a free loopback port.

One server per test session, started from Debian's PostgreSQL binaries (``initdb`` into a
temporary directory, fsync off: nothing here measures durability); each test gets a table
of its own instead of a truncate.  PostgreSQL refuses to run as root, so under root (CI)
the server runs as the ``postgres`` system user.  Without the binaries the tests skip
loudly, and fail when ``CI=true``.  Import the fixtures with ``from _postgres import *``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "PgBouncer",
    "PostgresServer",
    "fresh_postgres_store",
    "fresh_table_name",
    "pgbouncer",
    "postgres_binaries",
    "postgres_server",
    "start_postgres",
    "stop_postgres",
]

_STARTUP_SECONDS = 30.0
_PORT_ATTEMPTS = 3
_FAST = ("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")


@dataclass
class PostgresServer:
    """A running postgres started by the harness (database ``postgres``, trust auth)."""

    port: int
    directory: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> str:
        return str(Path(self.directory, "data"))

    async def connect(self, **options: Any) -> Any:
        import asyncpg

        return await asyncpg.connect(self.dsn, **options)

    async def pool(self, **options: Any) -> Any:
        import asyncpg

        options.setdefault("min_size", 1)
        options.setdefault("max_size", 10)
        return await asyncpg.create_pool(self.dsn, **options)


def postgres_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres`` (Debian's layout, newest first)."""
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(directory, "initdb").exists():
            return Path(directory)
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    _give_up(
        "the PostgreSQL server binaries are not installed (apt-get install -y postgresql; "
        ".ci/run installs it)"
    )
    raise AssertionError("unreachable")


def _as_server_user() -> dict[str, Any]:
    """Popen options that drop root: PostgreSQL refuses to run as root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def start_postgres(*extra: str) -> PostgresServer:
    """``initdb`` a fresh cluster and start it on a free loopback port."""
    binaries = postgres_binaries()
    directory = tempfile.mkdtemp(prefix="idem-postgres-")
    drop = _as_server_user()
    if drop:
        shutil.chown(directory, "postgres", "postgres")
    data = str(Path(directory, "data"))
    initdb = subprocess.run(
        [
            str(binaries / "initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        capture_output=True,
        timeout=120,
        cwd=directory,
        **drop,
    )
    if initdb.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        _give_up(f"initdb failed: {initdb.stderr.decode()[-2000:]}")
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        server = PostgresServer(_free_port(), directory)
        if launch(server, *extra, last=attempt == _PORT_ATTEMPTS):
            return server
    raise AssertionError("unreachable: the last attempt gives up")


def launch(server: PostgresServer, *extra: str, last: bool = True) -> bool:
    """Start (or restart) the postmaster of ``server``'s data directory on its port.

    ``False`` when another socket took the port first and ``last`` is false.
    """
    log = Path(server.directory, f"postgres-{server.port}.log")
    with open(log, "ab") as output:
        if _as_server_user():
            shutil.chown(log, "postgres", "postgres")
        server.process = subprocess.Popen(
            [
                str(postgres_binaries() / "postgres"),
                "-D",
                server.data,
                "-p",
                str(server.port),
                "-h",
                "127.0.0.1",
                "-k",
                server.directory,
                "-c",
                "max_connections=200",
                *_FAST,
                *extra,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=server.directory,
            **_as_server_user(),
        )
    try:
        problem = _wait_until_answering(server)
    except BaseException:
        _terminate(server)
        raise
    if problem is None:
        return True
    _terminate(server)
    text = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    if "address already in use" in text.lower() and not last:
        return False
    shutil.rmtree(server.directory, ignore_errors=True)
    _give_up(f"{problem}\n--- server log ---\n{text}")
    return False


def stop_postgres(server: PostgresServer, *, remove: bool = True) -> None:
    """Stop the server (a fast shutdown); ``remove`` deletes its data directory too."""
    _terminate(server)
    if remove:
        shutil.rmtree(server.directory, ignore_errors=True)


def _terminate(server: PostgresServer) -> None:
    process = server.process
    if process is None:
        return
    # SIGINT is PostgreSQL's fast shutdown: it ends open sessions instead of waiting for
    # them (SIGTERM, the smart shutdown, would wait for every pool to close).
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    server.process = None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One postgres for the whole test session."""
    server = start_postgres()
    try:
        yield server
    finally:
        stop_postgres(server)


@dataclass
class PgBouncer:
    """A PgBouncer in transaction pooling mode in front of a test server."""

    port: int
    directory: str
    process: subprocess.Popen[bytes]

    @property
    def dsn(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"


def start_pgbouncer(server: PostgresServer) -> PgBouncer:
    """PgBouncer (Debian's ``pgbouncer``) on a free loopback port, ``pool_mode =
    transaction`` and few server connections, so clients share them statement by
    statement."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        _give_up("pgbouncer is not installed (apt-get install -y pgbouncer; .ci/run installs it)")
    assert binary is not None
    directory = tempfile.mkdtemp(prefix="idem-pgbouncer-")
    port = _free_port()
    Path(directory, "users.txt").write_text('"postgres" ""\n')
    Path(directory, "pgbouncer.ini").write_text(
        "[databases]\n"
        f"postgres = host=127.0.0.1 port={server.port} dbname=postgres user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory}/users.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {directory}/pgbouncer.log\n"
    )
    if _as_server_user():
        for name in ("", "users.txt", "pgbouncer.ini"):
            shutil.chown(Path(directory, name), "postgres", "postgres")
    process = subprocess.Popen(
        [binary, f"{directory}/pgbouncer.ini"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        cwd=directory,
        **_as_server_user(),
    )
    bouncer = PgBouncer(port, directory, process)
    deadline = time.monotonic() + _STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return bouncer
        time.sleep(0.05)
    stop_pgbouncer(bouncer)
    _give_up(f"pgbouncer did not listen on port {port}")
    return bouncer


def stop_pgbouncer(bouncer: PgBouncer) -> None:
    bouncer.process.terminate()
    try:
        bouncer.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        bouncer.process.kill()
        bouncer.process.wait()
    shutil.rmtree(bouncer.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """One PgBouncer (transaction pooling) in front of the session's postgres."""
    bouncer = start_pgbouncer(postgres_server)
    try:
        yield bouncer
    finally:
        stop_pgbouncer(bouncer)


def fresh_table_name() -> str:
    return f"idem_{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def fresh_postgres_store(server: PostgresServer, **options: Any) -> AsyncIterator[Any]:
    """A store on a pool of its own, over a table no other test uses."""
    from idempotency_async.stores.postgres import PostgresStore, create_table

    pool = await server.pool()
    options.setdefault("table", fresh_table_name())
    try:
        await create_table(pool, table=options["table"])
        store = PostgresStore(pool, **options)
        try:
            yield store
        finally:
            await store.aclose()
    finally:
        await pool.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_until_answering(server: PostgresServer) -> str | None:
    """``None`` once the server accepts connections (``pg_isready``), else the problem."""
    isready = str(postgres_binaries() / "pg_isready")
    deadline = time.monotonic() + _STARTUP_SECONDS
    while time.monotonic() < deadline:
        assert server.process is not None
        if server.process.poll() is not None:
            return f"postgres exited with code {server.process.returncode}"
        answer = subprocess.run(
            [isready, "-q", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"],
            capture_output=True,
            timeout=10,
        )
        if answer.returncode == 0:
            return None
        time.sleep(0.05)
    return f"postgres did not accept connections within {_STARTUP_SECONDS:.0f} s"


def _give_up(reason: str) -> None:
    message = f"cannot start postgres for Postgres tests: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT PASSED: {message}")
