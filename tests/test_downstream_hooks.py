"""The client hooks: httpx and aiohttp requests made while a callback runs carry downstream
keys, against a real loopback server that records what it received."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_async import Manager, MemoryStore, Options, downstream_key, errors
from idempotency_async.downstream import aiohttp_middleware, httpx_event_hook

# A client: send(method, url, headers) -> None, recording nothing itself.
Send = Callable[[str, str, dict[str, str]], Awaitable[None]]


@dataclass
class Received:
    """What the server saw: (method, path with query, Idempotency-Key or other header)."""

    header: str = "Idempotency-Key"
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def keys(self) -> list[str | None]:
        return [key for _, _, key in self.requests]


@asynccontextmanager
async def recording_server(received: Received) -> AsyncIterator[int]:
    async def record(request: web.Request) -> web.Response:
        received.requests.append(
            (request.method, request.path_qs, request.headers.get(received.header))
        )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        yield server.port
    finally:
        await server.close()


@asynccontextmanager
async def httpx_client(**hook: Any) -> AsyncIterator[Send]:
    async with httpx.AsyncClient(event_hooks={"request": [httpx_event_hook(**hook)]}) as client:

        async def send(method: str, url: str, headers: dict[str, str]) -> None:
            (await client.request(method, url, headers=headers)).raise_for_status()

        yield send


@asynccontextmanager
async def aiohttp_client(**hook: Any) -> AsyncIterator[Send]:
    async with aiohttp.ClientSession(middlewares=[aiohttp_middleware(**hook)]) as session:

        async def send(method: str, url: str, headers: dict[str, str]) -> None:
            async with session.request(method, url, headers=headers) as response:
                response.raise_for_status()

        yield send


CLIENTS = {"httpx": httpx_client, "aiohttp": aiohttp_client}


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return CLIENTS[request.param]


def manager(clock: list[float] | None = None) -> Manager:
    times = clock if clock is not None else [1_700_000_000.0]
    return Manager(
        MemoryStore(), Options(event_key_jmespath="id", expires_after=60, clock=lambda: times[0])
    )


async def run(
    manager: Manager, payload: Any, work: Callable[[], Awaitable[None]], *, call: bool = False
) -> None:
    async def callback() -> str:
        await work()
        return "done"

    if call:
        assert await manager.execute_call(payload, lambda _: callback(), timeout=5) == "done"
    else:
        assert await manager.execute(payload, callback, timeout=5) == "done"


async def test_requests_in_a_run_get_numbered_keys_the_same_in_every_run(
    client: Callable[..., Any],
) -> None:
    received = Received()
    clock = [1_700_000_000.0]
    runs = manager(clock)
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        base = f"http://127.0.0.1:{port}"

        async def work() -> None:
            await send("POST", f"{base}/charges", {})
            await send("POST", f"{base}/charges", {})  # a second charge: its own key
            await send("POST", f"{base}/refunds?order=1", {})
            await send("PUT", f"{base}/charges/1", {})
            await send("PATCH", f"{base}/charges/1", {})
            await send("DELETE", f"{base}/charges/1", {})
            await send("GET", f"{base}/charges/1", {})  # safe: no key

        await run(runs, {"id": 1}, work)
        first = received.keys()
        received.requests.clear()
        clock[0] += 3600  # the record expired: the work runs again
        await run(runs, {"id": 1}, work, call=True)  # through execute_call this time
        again = received.keys()
    assert first == again
    keyed = first[:6]
    assert all(key is not None and len(key) == 43 for key in keyed)
    assert len(set(keyed)) == 6  # every request its own key
    assert first[6] is None
    # Not the name-based keys: a hook key cannot collide with downstream_key(name).
    assert [method for method, _, _ in received.requests] == [
        "POST", "POST", "POST", "PUT", "PATCH", "DELETE", "GET"
    ]  # fmt: skip


async def test_other_keys_and_managers_get_other_keys(client: Callable[..., Any]) -> None:
    received = Received()
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        url = f"http://127.0.0.1:{port}/charges"

        async def work() -> None:
            await send("POST", url, {})

        await run(manager(), {"id": 1}, work)
        await run(manager(), {"id": 2}, work)
        await run(manager(), {"id": 1}, work)  # another process, the same key
    one, two, one_again = received.keys()
    assert one is not None and two is not None
    assert one != two
    assert one == one_again


async def test_only_allowed_hosts_get_keys(client: Callable[..., Any]) -> None:
    received = Received()
    async with recording_server(received) as port:
        async with client(hosts=["localhost", "api.example.com"]) as send:

            async def work() -> None:
                await send("POST", f"http://127.0.0.1:{port}/charges", {})
                await send("POST", f"http://localhost:{port}/charges", {})

            await run(manager(), {"id": 1}, work)
        async with client(hosts=[f"127.0.0.1:{port + 1}"]) as send:

            async def other_port() -> None:
                await send("POST", f"http://127.0.0.1:{port}/charges", {})

            await run(manager(), {"id": 1}, other_port)
    denied, allowed, wrong_port = received.keys()
    assert denied is None
    assert allowed is not None
    assert wrong_port is None


async def test_a_header_the_caller_set_wins_and_still_counts(client: Callable[..., Any]) -> None:
    received = Received()
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        url = f"http://127.0.0.1:{port}/charges"

        async def own_first() -> None:
            await send("POST", url, {"idempotency-key": "mine"})
            await send("POST", url, {})

        async def hooks_only() -> None:
            await send("POST", url, {})
            await send("POST", url, {})

        await run(manager(), {"id": 1}, own_first)
        await run(manager(), {"id": 1}, hooks_only)
    mine, second, hook_first, hook_second = received.keys()
    assert mine == "mine"
    assert hook_first not in (None, "mine")
    # The caller's request was the first POST to the URL: the next one is the second.
    assert second == hook_second
    assert second != hook_first


async def test_no_key_outside_a_call_or_without_an_idempotency_key(
    client: Callable[..., Any],
) -> None:
    received = Received()
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        url = f"http://127.0.0.1:{port}/charges"
        await send("POST", url, {})

        async def work() -> None:
            await send("POST", url, {})

        await run(manager(), {"no": "id"}, work)  # run without idempotency
    assert received.keys() == [None, None]


async def test_spawned_tasks_get_keys_while_the_call_runs_and_none_after(
    client: Callable[..., Any],
) -> None:
    received = Received()
    late = asyncio.Event()
    sent = asyncio.Event()
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        base = f"http://127.0.0.1:{port}"
        tasks: list[asyncio.Task[None]] = []

        async def in_background() -> None:
            await send("POST", f"{base}/inside", {})
            sent.set()
            await late.wait()  # the call ends meanwhile
            await send("POST", f"{base}/after", {})

        async def work() -> None:
            tasks.append(asyncio.create_task(in_background()))
            await sent.wait()

        await run(manager(), {"id": 1}, work)
        late.set()
        await tasks[0]
    (_, inside, inside_key), (_, after, after_key) = received.requests
    assert (inside, after) == ("/inside", "/after")
    assert inside_key is not None
    assert after_key is None


async def test_methods_and_header_are_configurable(client: Callable[..., Any]) -> None:
    received = Received(header="PayPal-Request-Id")
    async with (
        recording_server(received) as port,
        client(hosts=["127.0.0.1"], methods=["put"], header="PayPal-Request-Id") as send,
    ):
        url = f"http://127.0.0.1:{port}/orders/1"

        async def work() -> None:
            await send("POST", url, {})
            await send("PUT", url, {})

        await run(manager(), {"id": 1}, work)
    post, put = received.keys()
    assert post is None
    assert put is not None


async def test_hook_keys_never_equal_named_keys(client: Callable[..., Any]) -> None:
    received = Received()
    named: list[str] = []
    async with recording_server(received) as port, client(hosts=["127.0.0.1"]) as send:
        url = f"http://127.0.0.1:{port}/charges"

        async def work() -> None:
            named.append(downstream_key(f"1 POST {url}"))
            named.append(downstream_key(f"1 POST http://127.0.0.1:{port}/charges"))
            await send("POST", url, {})

        await run(manager(), {"id": 1}, work)
    assert received.keys()[0] not in named


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([], "allow-list of hosts"),
        ("api.example.com", "not a bare string"),
        (["api.example.com:http"], "not a port number"),
        (["api.example.com:0"], "not a port number"),
        (["*"], "cannot read the host"),
        (["https://api.example.com"], "cannot read the host"),
        (["[::1"], "cannot read the host"),
        ([""], "non-empty host names"),
        ([None], "non-empty host names"),
    ],
)
def test_bad_hosts_are_refused_at_construction(hosts: Any, message: str) -> None:
    for make in (httpx_event_hook, aiohttp_middleware):
        with pytest.raises(errors.ConfigError, match=message):
            make(hosts=hosts)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"methods": []}, "methods is empty"),
        ({"methods": "POST"}, "not a bare string"),
        ({"methods": ["PO ST"]}, "HTTP method names"),
        ({"header": "Idempotency Key"}, "HTTP header name"),
        ({"header": ""}, "HTTP header name"),
    ],
)
def test_bad_methods_and_headers_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        httpx_event_hook(hosts=["api.example.com"], **options)


def _keyed(hosts: Iterable[str], url: str) -> bool:
    """Whether the httpx hook adds a key to a POST to ``url`` inside a call."""
    hook = httpx_event_hook(hosts=hosts)
    request = httpx.Request("POST", url)

    async def work() -> str:
        await hook(request)
        return "done"

    asyncio.run(manager().execute({"id": 1}, work, timeout=5))
    return "idempotency-key" in request.headers


@pytest.mark.parametrize(
    ("hosts", "url", "keyed"),
    [
        (["*.example.com"], "https://api.example.com/charges", True),
        (["*.example.com"], "https://a.b.example.com/charges", True),
        (["*.example.com"], "https://example.com/charges", False),
        (["*.example.com"], "https://badexample.com/charges", False),
        (["API.Example.com."], "https://api.example.com/charges", True),
        (["api.example.com:443"], "https://api.example.com/charges", True),
        (["api.example.com:443"], "http://api.example.com/charges", False),
        (["api.example.com:8443"], "https://api.example.com:8443/x", True),
        (["*.example.com:8443"], "https://api.example.com/x", False),
        (["[::1]:8080"], "http://[::1]:8080/x", True),
        (["::1"], "http://[::1]:8080/x", True),
    ],
)
def test_host_matching(hosts: list[str], url: str, keyed: bool) -> None:
    assert _keyed(hosts, url) is keyed


_REQUESTS = st.lists(
    st.tuples(
        st.sampled_from(["POST", "PUT", "PATCH", "DELETE", "GET"]),
        st.sampled_from(["/charges", "/charges/1", "/refunds?order=1", "/refunds?order=2"]),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(requests=_REQUESTS, payload=st.integers(0, 5))
def test_property_every_run_numbers_its_requests_the_same_way(
    requests: list[tuple[str, str]], payload: int
) -> None:
    hook = httpx_event_hook(hosts=["api.example.com"])

    async def keys_of_one_run(runs: Manager) -> list[str | None]:
        sent = [
            httpx.Request(method, f"https://api.example.com{path}") for method, path in requests
        ]

        async def work() -> str:
            for request in sent:
                await hook(request)
            return "done"

        await runs.execute({"id": payload}, work, timeout=5)
        return [request.headers.get("idempotency-key") for request in sent]

    async def two_runs() -> tuple[list[str | None], list[str | None]]:
        clock = [1_700_000_000.0]
        runs = manager(clock)
        first = await keys_of_one_run(runs)
        clock[0] += 3600  # expired: the work runs again
        return first, await keys_of_one_run(runs)

    first, again = asyncio.run(two_runs())
    assert first == again
    for (method, _), key in zip(requests, first, strict=True):
        assert (key is None) == (method == "GET")
    keyed = [key for key in first if key is not None]
    assert len(set(keyed)) == len(keyed)  # no two requests of a run share a key


# ---------------------------------------------------------------------- redirects


@asynccontextmanager
async def redirecting_server(received: Received, status: int, target: str) -> AsyncIterator[int]:
    """A server recording each request, answering /start with a ``status`` redirect to
    ``target`` and anything else with 200."""

    async def handle(request: web.Request) -> web.Response:
        received.requests.append(
            (request.method, request.path_qs, request.headers.get(received.header))
        )
        if request.path == "/start":
            return web.Response(status=status, headers={"Location": target})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        yield server.port
    finally:
        await server.close()


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
@pytest.mark.parametrize("status", [307, 308])
async def test_a_redirect_off_the_allow_list_does_not_carry_the_key(
    client: str, status: int
) -> None:
    # 307 and 308 keep the method and the body, and httpx keeps the headers: the key the
    # hook added for the allowed host went to the host the redirect named.
    elsewhere, allowed = Received(), Received()
    async with recording_server(elsewhere) as other_port:
        target = f"http://127.0.0.1:{other_port}/sink"
        async with redirecting_server(allowed, status, target) as port:
            hosts = [f"127.0.0.1:{port}"]
            if client == "httpx":
                opened: Any = httpx.AsyncClient(
                    event_hooks={"request": [httpx_event_hook(hosts=hosts)]},
                    follow_redirects=True,
                )
            else:
                opened = aiohttp.ClientSession(middlewares=[aiohttp_middleware(hosts=hosts)])
            async with opened as session:

                async def pay() -> None:
                    if client == "httpx":
                        (await session.post(f"http://127.0.0.1:{port}/start")).raise_for_status()
                    else:
                        async with session.post(f"http://127.0.0.1:{port}/start") as answer:
                            answer.raise_for_status()

                await Manager(MemoryStore()).execute({"order": 1}, pay, timeout=10)
    assert allowed.keys()[0] is not None  # the allowed host got its key
    assert elsewhere.requests and elsewhere.keys() == [None]


async def test_a_redirect_within_the_allow_list_keeps_the_key() -> None:
    received = Received()
    async with redirecting_server(received, 307, "/next") as port:
        hook = httpx_event_hook(hosts=[f"127.0.0.1:{port}"])
        async with httpx.AsyncClient(
            event_hooks={"request": [hook]}, follow_redirects=True
        ) as client:

            async def pay() -> None:
                (await client.post(f"http://127.0.0.1:{port}/start")).raise_for_status()

            await Manager(MemoryStore()).execute({"order": 1}, pay, timeout=10)
    first, second = received.keys()
    assert first is not None and second == first  # the same request, redirected
