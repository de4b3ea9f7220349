"""Pytest fixtures for Redis tests: real ``redis-server`` processes on free loopback ports.

One standalone server and one 3-master cluster per test session, both without
persistence; each test gets a store with a key prefix of its own instead of a flush.
Without the ``redis-server`` binary the tests skip loudly, and fail when ``CI=true``.
Import the fixtures with ``from _redis import *``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis_asyncio

from idempotency_async.stores.redis import RedisStore

__all__ = [
    "RedisServer",
    "fresh_redis_store",
    "redis_cluster",
    "redis_server",
    "start_cluster",
    "start_redis",
    "start_sentinel",
    "stop_redis",
]

_STARTUP_SECONDS = 15.0
_PORT_ATTEMPTS = 3


@dataclass
class RedisServer:
    """A running redis-server (or several, for a cluster) started by the harness."""

    ports: list[int]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    directory: str = ""

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **options: Any) -> redis_asyncio.Redis:
        return redis_asyncio.Redis(host="127.0.0.1", port=self.port, **options)

    def cluster_client(self, **options: Any) -> redis_asyncio.RedisCluster:
        return redis_asyncio.RedisCluster(host="127.0.0.1", port=self.port, **options)

    def cli(self, *args: str, port: int | None = None) -> str:
        """Run ``redis-cli`` against one node and return its output."""
        command = ["redis-cli", "-p", str(port or self.port), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        _give_up(
            "redis-server is not installed (apt-get install -y redis-server; .ci/run installs it)"
        )
    assert binary is not None
    return binary


def start_redis(*extra: str, directory: str | None = None) -> RedisServer:
    """Start one redis-server on a free loopback port, without persistence."""
    directory = directory or tempfile.mkdtemp(prefix="idem-redis-")
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        server = _start_redis_on(_free_port(), extra, directory, last=attempt == _PORT_ATTEMPTS)
        if server is not None:
            return server
    raise AssertionError("unreachable: the last attempt gives up")


def _start_redis_on(
    port: int, extra: tuple[str, ...], directory: str, *, last: bool
) -> RedisServer | None:
    """The server on ``port``; ``None`` if another socket took the port first."""
    binary = redis_binary()
    log = Path(directory, f"redis-{port}.log")
    options = {
        "port": str(port),
        "bind": "127.0.0.1",
        "save": "",
        "appendonly": "no",
        # A replica's first sync otherwise waits 5 s for more replicas to join.
        "repl-diskless-sync-delay": "0",
        "dir": directory,
        "logfile": str(log),
    }
    arguments = [part for name, value in options.items() for part in (f"--{name}", value)]
    process = subprocess.Popen(
        [binary, *arguments, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    server = RedisServer([port], [process], directory)
    problem = _wait_until_answering(port, process)
    if problem is not None:
        stop_redis(RedisServer([port], [process]))  # keeps the directory (and the log)
        output = log.read_text()[-3000:] if log.exists() else ""
        # The port was free when probed; another socket can bind it before the server does.
        if "address already in use" in output.lower() and not last:
            return None
        shutil.rmtree(directory, ignore_errors=True)
        _give_up(f"{problem}\n--- server log ---\n{output}")
    return server


def stop_redis(server: RedisServer) -> None:
    for process in server.processes:
        process.terminate()
    for process in server.processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if server.directory:
        shutil.rmtree(server.directory, ignore_errors=True)


def start_cluster(masters: int = 3) -> RedisServer:
    """Start ``masters`` cluster-enabled servers and join them into one cluster."""
    directory = tempfile.mkdtemp(prefix="idem-redis-cluster-")
    nodes: list[RedisServer] = []
    try:
        for index in range(masters):
            cluster_options = {
                "cluster-enabled": "yes",
                "cluster-config-file": f"nodes-{index}.conf",
                "cluster-port": str(_free_port()),
                "cluster-node-timeout": "2000",
            }
            arguments = [
                part for name, value in cluster_options.items() for part in (f"--{name}", value)
            ]
            nodes.append(start_redis(*arguments, directory=directory))
        cluster = RedisServer(
            [node.port for node in nodes], [p for n in nodes for p in n.processes], directory
        )
        addresses = [f"127.0.0.1:{port}" for port in cluster.ports]
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise RuntimeError(created.stdout[-2000:] + created.stderr[-2000:])
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not all(
            "cluster_state:ok" in cluster.cli("cluster", "info", port=port)
            for port in cluster.ports
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
    except Exception as exc:
        stop_redis(RedisServer([], [p for n in nodes for p in n.processes], directory))
        _give_up(f"cannot start a {masters}-master Redis cluster: {exc}")
    return cluster


def start_sentinel(master: RedisServer, name: str = "mymaster") -> RedisServer:
    """Start one sentinel monitoring ``master`` (quorum 1, fast failure detection)."""
    binary = redis_binary()
    directory = tempfile.mkdtemp(prefix="idem-redis-sentinel-")
    port = _free_port()
    config = Path(directory, "sentinel.conf")
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\nlogfile {directory}/sentinel.log\n"
        f"sentinel monitor {name} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {name} 1000\n"
        f"sentinel failover-timeout {name} 5000\n"
    )
    process = subprocess.Popen(
        [binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    sentinel = RedisServer([port], [process], directory)
    problem = _wait_until_answering(port, process)
    if problem is not None:
        stop_redis(sentinel)
        _give_up(f"sentinel: {problem}")
    return sentinel


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone redis-server for the whole test session."""
    server = start_redis()
    try:
        yield server
    finally:
        stop_redis(server)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisServer]:
    """One 3-master Redis cluster for the whole test session."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_redis(cluster)


@contextlib.asynccontextmanager
async def fresh_redis_store(
    server: RedisServer, *, cluster: bool = False, **options: Any
) -> AsyncIterator[RedisStore]:
    """A store on its own client and a key prefix no other test uses."""
    client = server.cluster_client() if cluster else server.client()
    options.setdefault("key_prefix", f"t{uuid.uuid4().hex[:10]}:")
    store = RedisStore(client, **options)
    try:
        # Connected, slot map and scripts loaded: a test's first call does not pay for them
        # (a fresh cluster client takes ~60 ms to initialise), as at a service's start-up.
        await store.load_scripts()
        yield store
    finally:
        await store.aclose()
        await client.aclose()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_until_answering(port: int, process: subprocess.Popen[bytes]) -> str | None:
    deadline = time.monotonic() + _STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"redis-server exited with code {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
                connection.sendall(b"PING\r\n")
                if connection.recv(64).startswith(b"+PONG"):
                    return None
        except OSError:
            pass
        time.sleep(0.02)
    return f"redis-server did not answer within {_STARTUP_SECONDS:.0f} s"


def _give_up(reason: str) -> None:
    message = f"cannot start redis-server for Redis tests: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT PASSED: {message}")
