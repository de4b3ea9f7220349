"""Idempotent MCP tools: a decorator for tools served by the official Python SDK (``mcp`` 2).

.. code-block:: python

    from mcp.server.mcpserver import MCPServer

    server = MCPServer("payments")

    @server.tool()
    @idempotent_tool(manager, key="order_id")
    async def charge(order_id: str, amount: int) -> dict[str, str]: ...

One tool call, as the decorator runs it::

    arguments (validated, as JSON) ──> key: JMESPath over them (default: all of them)
                                       or, experimentally, the request's _meta key
    scope {tool, caller, source, key} ──> Manager.execute(callback = the tool)
        first call ──> the tool runs; its result is stored and returned
        duplicate  ──> the stored result (the tool does not run)
        in progress, other arguments, no key, result not stored ──> a tool error
                       (``isError`` result) that tells the model what to do next

The behaviour is described in ``docs/agents.md``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, ParamSpec, TypeVar

from mcp.server.mcpserver import Context, authenticated_principal
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from pydantic_core import PydanticSerializationError, to_jsonable_python

from idempotency_async._derive import derive
from idempotency_async._lease import check_duration
from idempotency_async.errors import (
    AlreadyInProgressError,
    ConfigError,
    KeyMissingError,
    PayloadError,
    PayloadValidationError,
    ResponseNotStoredError,
)
from idempotency_async.manager import Manager
from idempotency_async.selection import (
    Expression,
    PowertoolsFunctions,
    Selector,
    compile_expression,
    is_missing,
)

__all__ = ["CONTEXT_PARAMETER", "META_KEY", "CallerScope", "idempotent_tool"]

P = ParamSpec("P")
T = TypeVar("T")

CallerScope = Callable[[Context[Any, Any]], str | Awaitable[str | None] | None]
"""Who is calling, from the tool call's context: part of the key, so two callers sending
the same arguments (or the same ``_meta`` key) never share a result."""

META_KEY: Final = "idempotencyKey"
"""The ``_meta`` member the closed MCP proposal (SEP-3182) named; see ``meta_key=``."""

CONTEXT_PARAMETER: Final = "idempotency_context"
"""The keyword parameter the decorator adds to a tool that takes no ``Context`` of its own:
the SDK fills it, and it is not part of the tool's input schema."""

MAX_KEY_LENGTH: Final = 255

_ANSWERED: Final = (
    AlreadyInProgressError,
    PayloadError,
    PayloadValidationError,
    ResponseNotStoredError,
)
"""The manager's answers that are not the tool's result: each becomes a tool error."""

_log = logging.getLogger("idempotency_async.mcp")


def idempotent_tool(
    manager: Manager,
    *,
    key: Expression | None = None,
    meta_key: str | None = None,
    caller_scope: CallerScope | None = None,
    name: str | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Make an ``async def`` MCP tool run once per key; duplicates get the stored result.

    Put it under ``@server.tool()``.  ``key`` is a JMESPath expression over the tool's
    arguments (validated by the SDK, as JSON; default: all of them); every argument must
    match on a duplicate, else the call is refused as a tool error.  With ``meta_key``
    (experimental: ``"idempotencyKey"``, :data:`META_KEY`, as the closed MCP proposal had
    it, with no capability negotiation) a key the client sends in the request's ``_meta``
    replaces the arguments' key; calls without it fall back to ``key``.

    ``caller_scope(ctx)`` names the caller; by default the authenticated OAuth principal
    (client, issuer, subject) the SDK's auth middleware saw, else nobody: then every client
    shares the tool's keys (a warning is logged once per tool).  ``name`` is the tool's name
    in the key (default the function's name); ``timeout`` (seconds) bounds each call and
    its lease.  Results must be storable: JSON values, or what the manager's
    ``response_codec`` encodes.  See ``docs/agents.md``.
    """
    if timeout is not None:
        check_duration("idempotent_tool(timeout=)", timeout)
    selector = Selector(
        compile_expression(key, option="idempotent_tool(key=)"),
        manager.options.jmespath_functions or PowertoolsFunctions(),
    )
    if meta_key is not None and not (isinstance(meta_key, str) and meta_key):
        raise ConfigError("idempotent_tool(meta_key=) must be a non-empty _meta member name")
    tool_manager = derive(
        manager,
        "idempotent_tool",
        {
            "event_key_jmespath": "scope",
            "payload_validation_jmespath": "arguments",
            "serialize_key": None,
        },
    )

    def decorate(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        if not inspect.iscoroutinefunction(func):
            raise ConfigError(f"idempotent_tool needs an async def; {func!r} is not one")
        tool = _Tool(
            tool_manager, selector, meta_key, caller_scope or _principal, name or func.__name__
        )
        context_name = find_context_parameter(func)
        signature = inspect.signature(func)

        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            if context_name is None:  # the SDK fills the parameter the decorator added
                ctx = kwargs.pop(CONTEXT_PARAMETER, None)
            else:  # the tool's own Context, passed on to it
                ctx = kwargs.get(context_name)
            # The SDK passes every argument by name, defaults filled in; a direct call is
            # bound the same way, so both key alike.
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != context_name}
            started: list[bool] = []  # the tool ran: what it raises is its own

            def run() -> Awaitable[T]:
                started.append(True)
                return func(*args, **kwargs)

            try:
                payload = await tool.payload(ctx if isinstance(ctx, Context) else None, arguments)
                return await tool.manager.execute(payload, run, timeout=timeout)
            except _ANSWERED as exc:
                if started:
                    raise
                raise ToolError(_advice(exc)) from exc

        if context_name is None:
            _add_context_parameter(wrapper, func)
        return wrapper

    return decorate


class _Tool:
    """One decorated tool: what its calls are keyed by."""

    def __init__(
        self,
        manager: Manager,
        selector: Selector,
        meta_key: str | None,
        caller_scope: CallerScope,
        name: str,
    ) -> None:
        self.manager = manager
        self.selector = selector
        self.meta_key = meta_key
        self.caller_scope = caller_scope
        self.name = name
        self.warned = False

    async def payload(self, ctx: Context[Any, Any] | None, arguments: dict[str, Any]) -> Any:
        """What the manager hashes: ``scope`` becomes the key, ``arguments`` the validation."""
        try:
            values = to_jsonable_python(arguments)
        except PydanticSerializationError as exc:
            raise PayloadError(f"the arguments are not JSON values: {exc}") from exc
        caller = await self.caller(ctx)
        sent = await self.sent_key(ctx)
        if sent is not None:
            scope = {"tool": self.name, "caller": caller, "source": "meta", "key": sent}
            return {"scope": scope, "arguments": values}
        selected = self.selector.select(values)
        if is_missing(selected, strict=self.manager.options.strict_missing_key):
            return {"scope": None, "arguments": values}  # the manager's missing-key rules
        scope = {"tool": self.name, "caller": caller, "source": "arguments", "key": selected}
        return {"scope": scope, "arguments": values}

    async def caller(self, ctx: Context[Any, Any] | None) -> str | None:
        found = None if ctx is None else self.caller_scope(ctx)
        if found is not None and not isinstance(found, str):
            found = await found
        if found is None and not self.warned:
            self.warned = True
            _log.warning(
                "the MCP tool %s was called with no caller identity (no authenticated "
                "principal, no caller_scope): every client shares its idempotency keys",
                self.name,
            )
        return found

    async def sent_key(self, ctx: Context[Any, Any] | None) -> str | None:
        """The client's ``_meta`` key of this very tool call, when ``meta_key`` is on."""
        request = _request_context(ctx) if self.meta_key is not None else None
        if request is None:
            return None
        sent = (request.meta or {}).get(self.meta_key)
        called = (request.params or {}).get("name")
        if sent is None:
            return None
        if called != self.name:
            # A nested call (the _meta is the outer tool's), or this tool registered under
            # another name than the decorator's: that one must not pass silently.
            await self.check_registered(ctx, called)
            return None
        if not isinstance(sent, str) or not 1 <= len(sent) <= MAX_KEY_LENGTH:
            raise ToolError(
                f"_meta.{self.meta_key} must be a string of 1 to {MAX_KEY_LENGTH} characters: "
                "send a unique value (e.g. a UUID) per operation, the same one when retrying"
            )
        return sent

    async def check_registered(self, ctx: Context[Any, Any] | None, called: Any) -> None:
        """ConfigError when the server has no tool of this tool's name: it is registered
        under another (the one called), and its ``_meta`` key would be ignored."""
        try:
            server = None if ctx is None else ctx.mcp_server
        except ValueError:
            return
        if server is None or any(tool.name == self.name for tool in await server.list_tools()):
            return  # a tool of that name is served: this call is nested in another's
        message = (
            f"idempotent_tool(name={self.name!r}) names no tool of this server, and the "
            f"request calls {called!r:.80}: the tool is registered under another name, so "
            f"its _meta.{self.meta_key} would be ignored. Pass the registered name: "
            f"idempotent_tool(manager, name={called!r:.80}, ...)"
        )
        _log.error(message)
        raise ConfigError(message)


def _advice(exc: Exception) -> str:
    """The tool error a model reads for an answer that is not the tool's result."""
    if isinstance(exc, AlreadyInProgressError):
        wait = 1 if exc.retry_after is None else max(1, math.ceil(exc.retry_after))
        return (
            "an identical call is still in progress. Do not change anything: retry this "
            f"same call (same arguments, same key) in {wait} seconds to get its result"
        )
    if isinstance(exc, PayloadValidationError):
        return (
            "this idempotency key was already used with different arguments. To repeat the "
            "earlier operation, send its arguments unchanged; for a new operation, use a new key"
        )
    if isinstance(exc, KeyMissingError):
        return (
            "the call carries no idempotency key: send the arguments that identify the "
            "operation, then retry"
        )
    if isinstance(exc, ResponseNotStoredError):
        return (
            "this call already ran and completed, but its result was not stored and cannot "
            "be shown again. Do not retry it: check its effect instead"
        )
    return f"the arguments cannot be keyed: {exc}"


def _principal(ctx: Context[Any, Any]) -> str | None:
    request = _request_context(ctx)
    return None if request is None else authenticated_principal(request)


def _request_context(ctx: Context[Any, Any] | None) -> Any:
    if ctx is None:
        return None
    try:
        return ctx.request_context
    except ValueError:  # called outside a request (e.g. MCPServer.call_tool directly)
        return None


def _add_context_parameter(wrapper: Callable[..., Any], func: Callable[..., Any]) -> None:
    """Give ``wrapper`` a ``Context`` parameter the SDK fills (the tool has none): in its
    signature (before ``**kwargs``) and in its annotations, which the SDK reads."""
    try:
        signature = inspect.signature(func, eval_str=True)
    except NameError:  # a forward reference not defined yet: the SDK resolves it later
        signature = inspect.signature(func)
    parameters = list(signature.parameters.values())
    position = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        position -= 1
    added = inspect.Parameter(
        CONTEXT_PARAMETER,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Context | None,
    )
    parameters.insert(position, added)
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {
        **getattr(func, "__annotations__", {}),
        CONTEXT_PARAMETER: Context | None,
    }
