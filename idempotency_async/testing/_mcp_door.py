"""The MCP door: a tool call of an ``idempotent_tool`` on the official SDK's ``MCPServer``.

Each process serves one tool, decorated once (one derived manager: one in-flight table and
cache per process, as a server has).  A call goes through ``MCPServer.call_tool`` — the
SDK's argument validation, context injection and result conversion — and an exception
becomes the tool error the SDK's request handler answers (``isError``, its text), as it
does for a client.  The SDK's in-process ``Client`` runs under the virtual loop too, but
is not used: a client reads an exception of the tool only as "Error executing tool ...",
so the oracle could not tell its callback's exception from a store's or a deadline's; and
the JSON-RPC session is not the door (measured per call: 0.016 ms through ``call_tool``,
0.16 ms through one client session, 0.94 ms with a session per call).  A client that
gives up (``notifications/cancelled``) is ``tests/test_mcp.py``'s.
Nor is ``server.tool()``: the SDK's registration of a tool (its argument model and JSON
schema, built by pydantic: some 5 ms, a whole scenario's CPU) is made once per interpreter
from the first decorated tool, and each server gets a copy holding its own decorated
function (every one has the same signature).

The tool's deadline is the caller's (ambient): ``timeout=`` is fixed per tool.  What the
client sees is translated into what a plain call would have got (a tool error with retry
advice is ``AlreadyInProgressError``...), so the oracle judges every door the same way;
``Outcome.answer`` keeps the result and the exception behind it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from idempotency_async import errors
from idempotency_async.integrations.mcp import idempotent_tool
from idempotency_async.manager import Manager
from idempotency_async.testing._doors import Bounds, handled_callback
from idempotency_async.testing._plans import CallPlan
from idempotency_async.testing._trace import Outcome, Trace

__all__ = ["TOOL", "McpAnswer", "mcp_arguments", "mcp_door", "mcp_key", "mcp_meaning"]

TOOL = "charge"

_RUN: contextvars.ContextVar[Callable[[], Awaitable[Any]]] = contextvars.ContextVar("_RUN")
"""The simulated callback of the call the tool runs for (the task's own)."""


@dataclasses.dataclass(frozen=True, slots=True)
class McpAnswer:
    """A tool call as its client received it, and the exception the server turned into
    the tool error (None for a result)."""

    result: CallToolResult
    raised: BaseException | None

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.result.content if isinstance(b, TextContent))


def mcp_arguments(plan: CallPlan) -> dict[str, Any]:
    """The tool call's arguments: the key (the tool's ``key=``) and the validated amount."""
    return {"id": plan.key, "amount": plan.amount}


def _plain_options(manager: Manager) -> Manager:
    """The process's manager as the decorator takes it (it keys and validates itself)."""
    options = dataclasses.replace(
        manager.options, event_key_jmespath=None, payload_validation_jmespath=None
    )
    return Manager(manager.store, options)


_REGISTERED: list[Tool] = []
"""The SDK's registration of the first decorated tool (the template of the others)."""


def _server_of(trace: Trace, index: int, manager: Manager) -> MCPServer:
    """One server with one decorated tool per process."""
    server: MCPServer | None = trace.peers.get(("mcp", index))
    if server is None:

        @idempotent_tool(_plain_options(manager), key="id")
        async def charge(id: int, amount: int) -> Any:
            return await _RUN.get()()

        if not _REGISTERED:
            _REGISTERED.append(Tool.from_function(charge, name=TOOL))
        tool = _REGISTERED[0].model_copy(update={"fn": charge})
        server = MCPServer(f"process-{index}", tools=[tool])
        trace.peers[("mcp", index)] = server
    return server


def mcp_key(manager: Manager, plan: CallPlan) -> str | None:
    """The store key of the call: its tool, no caller (no authenticated principal), the
    key selected from its arguments — under the process's prefix."""
    options = dataclasses.replace(
        manager.options, event_key_jmespath="scope", payload_validation_jmespath=None
    )
    scope = {"tool": TOOL, "caller": None, "source": "arguments", "key": plan.key}
    return Manager(manager.store, options).key_for({"scope": scope})


def mcp_door(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome, manager: Manager
) -> Callable[[Bounds], Awaitable[Any]]:
    server = _server_of(trace, plan.manager, manager)
    callback = handled_callback(trace, index, plan, outcome)

    async def call(bounds: Bounds) -> McpAnswer:
        token = _RUN.set(lambda: callback(None))
        try:
            result = await server.call_tool(TOOL, mcp_arguments(plan))
        except MCPError:
            raise
        except Exception as exc:  # as the SDK's request handler answers it
            text = TextContent(type="text", text=str(exc))
            return McpAnswer(CallToolResult(content=[text], is_error=True), exc)
        finally:
            _RUN.reset(token)
        assert isinstance(result, CallToolResult)
        return McpAnswer(result, None)

    return call


_WAIT = re.compile(r"retry this same call .* in (\d+) seconds")

ADVICE = {
    "in_progress": "still in progress",
    "mismatch": "already used with different arguments",
    "not_stored": "its result was not stored",
}
"""What each tool error the decorator answers instead of the tool says (docs/agents.md)."""


def mcp_meaning(answer: McpAnswer, outcome: Outcome) -> tuple[Any, BaseException | None]:
    """What the client's result means, as a plain call's value or error: a result is the
    tool's (its own run's, or a replay); a tool error is a duplicate's answer when its
    text says so, else the exception behind it (its callback's, a store's...)."""
    text = answer.text
    if not answer.result.is_error:
        value = json.loads(text) if text else None
        for run in reversed(outcome.runs):
            if run.returned and run.value == value:
                return run.value, None  # its own result
        return value, None
    if ADVICE["in_progress"] in text:
        wait = _WAIT.search(text)
        after = None if wait is None else float(wait.group(1))
        return None, errors.AlreadyInProgressError("tool error", key="", retry_after=after)
    if ADVICE["mismatch"] in text:
        return None, errors.PayloadValidationError("tool error", key="")
    if ADVICE["not_stored"] in text:
        return None, errors.ResponseNotStoredError("tool error", key="")
    raised = answer.raised
    if raised is not None and raised.__cause__ is not None:
        return None, raised.__cause__  # the SDK wraps what the tool raised
    return None, raised or errors.IdempotencyError(f"tool error: {text}")
