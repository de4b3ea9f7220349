"""Pins the types of the MCP tool decorator and the Powertools route middleware: only
type-checked (``mypy --strict tests/typing``), never run.

A decorated tool keeps its signature and result type; the middleware fits where
Powertools takes route middlewares.
"""

from __future__ import annotations

from typing import Any, assert_type

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from mcp.server.mcpserver import Context, MCPServer

from idempotency_async import Manager, MemoryStore, Options, Redaction
from idempotency_async.integrations.mcp import idempotent_tool
from idempotency_async.integrations.powertools import idempotent_route

manager = Manager(MemoryStore(), Options())
server = MCPServer("payments")


def tenant(ctx: Context[Any, Any]) -> str | None:
    return None


@server.tool()
@idempotent_tool(manager, key="order_id", caller_scope=tenant, timeout=30)
async def charge(order_id: str, amount: int) -> dict[str, str]:
    return {"charge": "ch_1"}


app = APIGatewayRestResolver()


@app.post("/orders", middlewares=[idempotent_route(manager, timeout=10)])
async def create_order() -> dict[str, str]:
    return {"id": "o1"}


redacted = idempotent_route(
    manager,
    replayed_header="X-Replayed",
    redaction=Redaction(fields=("body.secret", 'headers."x-token"')),
)


@app.post("/credentials", middlewares=[redacted])
async def mint() -> dict[str, str]:
    return {"id": "c1"}


async def uses() -> None:
    assert_type(await charge("o1", 5), dict[str, str])
    assert_type(await charge(order_id="o1", amount=5), dict[str, str])
