"""idempotent_tool: MCP tool calls through the SDK's own client and server, in process."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest
from mcp import Client
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from idempotency_async import Manager, MemoryStore, Options, errors
from idempotency_async.integrations.mcp import CONTEXT_PARAMETER, META_KEY, idempotent_tool


class Receipt(pydantic.BaseModel):
    charge: str


def _text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def _payments(manager: Manager, runs: list[dict[str, Any]], **kwargs: Any) -> MCPServer:
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(manager, **kwargs)
    async def charge(order_id: str, amount: int, note: str = "") -> dict[str, Any]:
        runs.append({"order_id": order_id, "amount": amount})
        return {"charge": f"ch_{len(runs)}", "amount": amount}

    return server


async def _call_as(
    server: MCPServer, token: AccessToken, arguments: dict[str, Any]
) -> CallToolResult:
    """A call from a client whose in-process server task sees ``token`` as the
    authenticated user, as the SDK's auth middleware sets it for an HTTP request."""

    async def call() -> CallToolResult:
        auth_context_var.set(AuthenticatedUser(token))  # this task's context only
        async with Client(server) as client:
            return await client.call_tool("charge", arguments)

    return await asyncio.create_task(call())


async def test_a_duplicate_call_replays_without_running_the_tool() -> None:
    runs: list[dict[str, Any]] = []
    server = _payments(Manager(MemoryStore(), Options()), runs, key="order_id")
    async with Client(server) as client:
        first = await client.call_tool("charge", {"order_id": "o1", "amount": 5})
        again = await client.call_tool("charge", {"order_id": "o1", "amount": 5})
        other = await client.call_tool("charge", {"order_id": "o2", "amount": 5})
    assert not first.is_error and not again.is_error and not other.is_error
    assert first.structured_content == again.structured_content == {"charge": "ch_1", "amount": 5}
    assert other.structured_content == {"charge": "ch_2", "amount": 5}
    assert len(runs) == 2


async def test_the_default_key_is_all_the_arguments_with_defaults_filled_in() -> None:
    runs: list[dict[str, Any]] = []
    server = _payments(Manager(MemoryStore(), Options()), runs)
    async with Client(server) as client:
        await client.call_tool("charge", {"order_id": "o1", "amount": 5})
        await client.call_tool("charge", {"order_id": "o1", "amount": 5, "note": ""})
        await client.call_tool("charge", {"order_id": "o1", "amount": 6})
    assert runs == [{"order_id": "o1", "amount": 5}, {"order_id": "o1", "amount": 6}]


async def test_the_same_key_with_other_arguments_is_a_tool_error_that_says_what_to_do() -> None:
    runs: list[dict[str, Any]] = []
    server = _payments(Manager(MemoryStore(), Options()), runs, key="order_id")
    async with Client(server) as client:
        await client.call_tool("charge", {"order_id": "o1", "amount": 5})
        refused = await client.call_tool("charge", {"order_id": "o1", "amount": 9})
    assert refused.is_error
    assert "already used with different arguments" in _text(refused)
    assert "use a new key" in _text(refused)
    assert len(runs) == 1


async def test_a_call_in_progress_is_a_tool_error_with_retry_advice_then_replays() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[str] = []
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()), key="order_id", timeout=30)
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        started.set()
        await release.wait()
        return "charged"

    async with Client(server) as first_client, Client(server) as second_client:
        first = asyncio.create_task(first_client.call_tool("charge", {"order_id": "o1"}))
        await asyncio.wait_for(started.wait(), 5)
        busy = await second_client.call_tool("charge", {"order_id": "o1"})
        release.set()
        done = await first
        replay = await second_client.call_tool("charge", {"order_id": "o1"})
    assert busy.is_error
    assert "still in progress" in _text(busy)
    assert "retry this same call" in _text(busy)
    assert "30 seconds" in _text(busy)
    assert not done.is_error and not replay.is_error
    assert _text(done) == _text(replay) == "charged"
    assert runs == ["o1"]


async def test_a_failing_tool_releases_the_key_so_a_retry_runs_it() -> None:
    attempts: list[int] = []
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def charge(order_id: str) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ToolError("card declined, try again")
        return "charged"

    async with Client(server) as client:
        failed = await client.call_tool("charge", {"order_id": "o1"})
        retried = await client.call_tool("charge", {"order_id": "o1"})
    assert failed.is_error and "card declined" in _text(failed)
    assert not retried.is_error and _text(retried) == "charged"
    assert len(attempts) == 2


async def test_a_meta_key_identifies_the_call_and_the_arguments_must_match() -> None:
    runs: list[dict[str, Any]] = []
    server = _payments(Manager(MemoryStore(), Options()), runs, meta_key=META_KEY)
    arguments = {"order_id": "o1", "amount": 5}
    async with Client(server) as client:
        first = await client.call_tool("charge", arguments, meta={META_KEY: "k-1"})
        again = await client.call_tool("charge", arguments, meta={META_KEY: "k-1"})
        other = await client.call_tool("charge", {**arguments, "amount": 6}, meta={META_KEY: "k-1"})
        fresh = await client.call_tool("charge", arguments, meta={META_KEY: "k-2"})
        bad = await client.call_tool("charge", arguments, meta={META_KEY: ""})
        # Without a _meta key the arguments are the key: a call of its own.
        plain = await client.call_tool("charge", arguments)
    assert first.structured_content == again.structured_content
    assert other.is_error and "different arguments" in _text(other)
    assert not fresh.is_error and fresh.structured_content != first.structured_content
    assert bad.is_error and f"_meta.{META_KEY}" in _text(bad)
    assert not plain.is_error
    assert len(runs) == 3


def _token(subject: str) -> AccessToken:
    return AccessToken(token=f"t-{subject}", client_id="agent", scopes=[], subject=subject)


async def test_callers_are_told_apart_by_their_authenticated_principal() -> None:
    runs: list[dict[str, Any]] = []
    server = _payments(Manager(MemoryStore(), Options()), runs, key="order_id")
    arguments = {"order_id": "o1", "amount": 5}
    first = await _call_as(server, _token("alice"), arguments)
    other = await _call_as(server, _token("bob"), arguments)
    replay = await _call_as(server, _token("alice"), arguments)
    assert first.structured_content == replay.structured_content
    assert other.structured_content != first.structured_content
    assert len(runs) == 2


async def test_a_caller_scope_names_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[dict[str, Any]] = []

    async def tenant(ctx: Context) -> str | None:
        params = ctx.session.client_params
        return None if params is None else params.client_info.name

    server = _payments(Manager(MemoryStore(), Options()), runs, caller_scope=tenant)
    arguments = {"order_id": "o1", "amount": 5}
    async with Client(server) as client:
        await client.call_tool("charge", arguments)
        await client.call_tool("charge", arguments)
    assert len(runs) == 1
    assert "no caller identity" not in caplog.text


async def test_no_caller_identity_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    server = _payments(Manager(MemoryStore(), Options()), [])
    async with Client(server) as client:
        await client.call_tool("charge", {"order_id": "o1", "amount": 5})
        await client.call_tool("charge", {"order_id": "o2", "amount": 5})
    assert caplog.text.count("no caller identity") == 1


async def test_a_tool_with_its_own_context_keeps_it_and_the_schema_is_unchanged() -> None:
    server = MCPServer("payments")
    seen: list[str] = []

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def with_context(order_id: str, ctx: Context) -> str:
        seen.append(ctx.request_id)
        return order_id

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def without_context(order_id: str) -> str:
        return order_id

    async with Client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = await client.call_tool("with_context", {"order_id": "o1"})
    for tool in tools.values():
        assert set(tool.input_schema["properties"]) == {"order_id"}
        assert CONTEXT_PARAMETER not in str(tool.input_schema)
    assert not result.is_error and len(seen) == 1


async def test_a_result_that_was_not_stored_answers_do_not_retry() -> None:
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def charge(order_id: str) -> Receipt:
        return Receipt(charge="ch_1")

    async with Client(server) as client:
        first = await client.call_tool("charge", {"order_id": "o1"})
        again = await client.call_tool("charge", {"order_id": "o1"})
    assert first.structured_content == {"charge": "ch_1"}
    assert again.is_error and "Do not retry it" in _text(again)


async def test_a_pydantic_result_replays_with_the_manager_codec() -> None:
    from idempotency_async.codecs import PydanticCodec

    runs: list[str] = []
    server = MCPServer("payments")
    manager = Manager(MemoryStore(), Options(response_codec=PydanticCodec(Receipt)))

    @server.tool()
    @idempotent_tool(manager)
    async def charge(order_id: str) -> Receipt:
        runs.append(order_id)
        return Receipt(charge="ch_1")

    async with Client(server) as client:
        first = await client.call_tool("charge", {"order_id": "o1"})
        again = await client.call_tool("charge", {"order_id": "o1"})
    assert first.structured_content == again.structured_content == {"charge": "ch_1"}
    assert runs == ["o1"]


async def test_no_key_with_raise_on_no_key_is_a_tool_error() -> None:
    runs: list[dict[str, Any]] = []
    manager = Manager(MemoryStore(), Options(raise_on_no_key=True))
    server = _payments(manager, runs, key="missing")
    async with Client(server) as client:
        refused = await client.call_tool("charge", {"order_id": "o1", "amount": 5})
    assert refused.is_error and "carries no idempotency key" in _text(refused)
    assert runs == []


def test_configuration_is_checked_at_decoration() -> None:
    manager = Manager(MemoryStore(), Options())
    with pytest.raises(errors.ConfigError):
        idempotent_tool(manager, key="order_id[")
    with pytest.raises(errors.ConfigError):
        idempotent_tool(manager, meta_key="")
    with pytest.raises(errors.ConfigError, match="sets event_key_jmespath"):
        idempotent_tool(Manager(MemoryStore(), Options(event_key_jmespath="id")))

    def plain(order_id: str) -> str:
        return order_id

    with pytest.raises(errors.ConfigError, match="async def"):
        idempotent_tool(manager)(plain)  # type: ignore[arg-type]


async def test_an_idempotency_error_the_tool_itself_raises_is_not_answered_as_ours() -> None:
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def charge(order_id: str) -> str:
        raise errors.PayloadValidationError("from a call the tool made", key="k")

    async with Client(server) as client:
        failed = await client.call_tool("charge", {"order_id": "o1"})
    assert failed.is_error
    assert "different arguments" not in _text(failed)  # the SDK's answer for a crash


async def test_a_call_the_client_gave_up_on_stays_in_progress_until_its_lease_ends() -> None:
    from mcp import MCPError

    started: list[str] = []
    cancelled_after: list[float] = []
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()), timeout=1.5)
    async def charge(order_id: str) -> str:
        started.append(order_id)
        if len(started) == 1:
            begun = asyncio.get_running_loop().time()
            try:
                await asyncio.sleep(60)  # the client stops waiting: notifications/cancelled
            except asyncio.CancelledError:
                cancelled_after.append(asyncio.get_running_loop().time() - begun)
                raise
        return "charged"

    async with Client(server) as client:
        with pytest.raises(MCPError):
            await client.call_tool("charge", {"order_id": "o1"}, read_timeout_seconds=0.3)
        busy = await client.call_tool("charge", {"order_id": "o1"})
        await asyncio.sleep(1.5)  # the first call's lease ends
        retried = await client.call_tool("charge", {"order_id": "o1"})
    assert busy.is_error and "still in progress" in _text(busy)
    assert not retried.is_error and _text(retried) == "charged"
    assert started == ["o1", "o1"]
    # Cancelled by the client's notifications/cancelled, well before the cutoff (1.5 s
    # less its reserve) would have stopped it.
    assert len(cancelled_after) == 1 and cancelled_after[0] < 1.0


def _renamed(manager: Manager, runs: list[str], **kwargs: Any) -> MCPServer:
    """A tool registered under another name than its function's."""
    server = MCPServer("payments")

    @server.tool(name="charge_card")
    @idempotent_tool(manager, meta_key=META_KEY, **kwargs)
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id} ({len(runs)})"

    return server


async def test_a_meta_key_of_a_tool_registered_under_another_name_fails_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[str] = []
    server = _renamed(Manager(MemoryStore(), Options()), runs)
    async with Client(server) as client:
        sent = await client.call_tool("charge_card", {"order_id": "o1"}, meta={META_KEY: "k-1"})
        plain = await client.call_tool("charge_card", {"order_id": "o1"})
    assert sent.is_error and runs == ["o1"]  # only the call without a _meta key ran
    assert "charge_card" in _text(sent)  # the SDK hides the message: the log has it
    assert not plain.is_error
    assert "idempotent_tool(manager, name='charge_card'" in caplog.text


async def test_a_meta_key_follows_the_name_given_for_a_renamed_tool() -> None:
    runs: list[str] = []
    server = _renamed(Manager(MemoryStore(), Options()), runs, name="charge_card")
    async with Client(server) as client:
        first = await client.call_tool("charge_card", {"order_id": "o1"}, meta={META_KEY: "k-1"})
        again = await client.call_tool("charge_card", {"order_id": "o1"}, meta={META_KEY: "k-1"})
        fresh = await client.call_tool("charge_card", {"order_id": "o1"}, meta={META_KEY: "k-2"})
    assert _text(first) == _text(again) == "charged o1 (1)"
    assert _text(fresh) == "charged o1 (2)"  # the _meta key, not the arguments, is the key
    assert runs == ["o1", "o1"]


async def test_a_nested_call_ignores_the_outer_calls_meta_key() -> None:
    runs: list[str] = []
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()), meta_key=META_KEY, key="order_id")
    async def charge(order_id: str, ctx: Context) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    @server.tool()
    async def checkout(orders: list[str], ctx: Context) -> list[str]:
        return [await charge(order_id, ctx) for order_id in orders]

    async with Client(server) as client:
        result = await client.call_tool("checkout", {"orders": ["o1", "o2"]}, meta={META_KEY: "k"})
    assert not result.is_error
    assert runs == ["o1", "o2"]  # each keyed by its order, not both by the outer "k"


async def test_a_direct_call_keys_as_the_sdk_call_does() -> None:
    runs: list[str] = []
    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(Manager(MemoryStore(), Options()))
    async def charge(order_id: str, amount: int = 5) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    async with Client(server) as client:
        first = await client.call_tool("charge", {"order_id": "o1"})
    assert await charge("o1") == await charge(order_id="o1", amount=5) == _text(first)
    assert runs == ["o1"]
