"""Downstream keys: idempotency that follows the work into the APIs it calls.

Inside a callback, :func:`downstream_key` derives a key from the record's key and a name
you choose; pass it as the ``Idempotency-Key`` of a call to a payments provider, an email
service or another service built with this library.  A re-run of the same key (a paused
process, clock skew, a lost completion) derives the same keys, so the downstream API
deduplicates the repeated call.  The client hooks (:func:`httpx_event_hook`,
:func:`aiohttp_middleware`) add such a key to the unsafe requests a callback makes to the
hosts you allow.

A key is SHA-256 over a domain tag, the record's key and the name, in 43 base64url
characters: the record's key never leaves the process, and every provider's key limit
(Stripe: 255 characters, Square: 45) is met.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from idempotency_async._downstream import CURRENT, NAMED, REQUEST, derive, derive_in_step, issue
from idempotency_async._steps import current_step
from idempotency_async.errors import ConfigError, NoDownstreamKeyError

if TYPE_CHECKING:
    import httpx
    from aiohttp import ClientRequest, ClientResponse
    from aiohttp.client_middlewares import ClientHandlerType, ClientMiddlewareType

__all__ = [
    "DEFAULT_METHODS",
    "aiohttp_middleware",
    "downstream_key",
    "downstream_key_or_none",
    "httpx_event_hook",
]

DEFAULT_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods the client hooks add a key to by default: the unsafe ones."""

_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def downstream_key(name: str) -> str:
    """The downstream key named ``name`` of the callback running now.

    The same on every run of the same idempotency key (even after its record expired),
    different for every name and every key; never the record's key itself.  Available
    while a callback runs under a claimed key: ``Manager.execute`` and ``execute_call``
    callbacks, :func:`~idempotency_async.idempotent_function`, Lambda handlers and
    endpoints under the HTTP integrations, and tasks they spawn (until the call ends).

    :raises ~idempotency_async.errors.NoDownstreamKeyError: outside such a callback: no
        call is running, the call runs without idempotency (its payload selected no key,
        or idempotency is disabled), or the call has ended.
    :raises ~idempotency_async.errors.ConfigError: ``name`` is not a non-empty string.

    .. versionadded:: 0.1.0
    """
    key = downstream_key_or_none(name)
    if key is None:
        raise NoDownstreamKeyError(
            f"downstream_key({name!r}) was called outside a running idempotent callback: "
            "a downstream key exists only while a callback runs under a claimed key "
            "(not in a call run without idempotency because its payload selected no key or "
            "idempotency is disabled, and not after the call ended); use "
            "downstream_key_or_none where the work may also run unprotected",
            name=name,
        )
    return key


def downstream_key_or_none(name: str) -> str | None:
    """As :func:`downstream_key`, but None outside a running idempotent callback.

    .. versionadded:: 0.1.0
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a downstream key needs a non-empty str name, got {name!r}")
    run = CURRENT.get(None)
    if run is None or not run.open:
        return None
    step = current_step(run)
    if step is not None:
        return derive_in_step(run.key, step, NAMED, name)
    return derive(run.key, NAMED, name)


@dataclass(frozen=True, slots=True)
class _Policy:
    """Which requests get a key, and under which header."""

    hosts: frozenset[tuple[str, int | None]]
    suffixes: tuple[tuple[str, int | None], ...]
    methods: frozenset[str]
    header: str

    def allows(self, host: str, port: int | None) -> bool:
        host = host.lower().rstrip(".")
        hosts = self.hosts
        if (host, None) in hosts or (host, port) in hosts:
            return True
        return any(
            host.endswith(suffix) and (allowed is None or allowed == port)
            for suffix, allowed in self.suffixes
        )

    def key_for(
        self,
        method: str,
        scheme: str,
        host: str | None,
        port: int | None,
        target: str,
        present: bool,
    ) -> str | None:
        """The key to add to this request, or None (not in a run, not covered, or set).

        Every covered request is numbered, including one whose caller set the header, so
        the n-th request to a method and URL is the n-th in every run.
        """
        run = CURRENT.get(None)
        if run is None or not run.open:
            return None
        method = method.upper()
        if method not in self.methods or host is None:
            return None
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        if not self.allows(host, port):
            return None
        request = f"{method} {scheme}://{host.lower()}:{port}{target}"
        step = current_step(run)
        if step is None:
            number = run.number(request)
            if present:
                return None  # a header the caller set wins
            return issue(run, derive(run.key, REQUEST, f"{number} {request}"))
        # Numbered per step: a step's requests are the same on every run of that step.
        number = run.number(f"{len(step)}:{step} {request}")
        if present:
            return None
        return issue(run, derive_in_step(run.key, step, REQUEST, f"{number} {request}"))

    def carried(self, method: str, host: str | None, port: int | None, value: str) -> bool:
        """Whether ``value``, in the header of a request this policy does not cover, is a
        key a hook added in the running call: a client that follows a redirect (httpx:
        307 and 308 keep the method and the headers) carries it to another host, which
        must not get it."""
        run = CURRENT.get(None)
        if run is None or run.issued is None or value not in run.issued:
            return False
        if host is None or method.upper() not in self.methods:
            return True
        return not self.allows(host, port)


def httpx_event_hook(
    *,
    hosts: Iterable[str],
    methods: Iterable[str] = DEFAULT_METHODS,
    header: str = "Idempotency-Key",
) -> Callable[[httpx.Request], Awaitable[None]]:
    """An ``httpx.AsyncClient`` request hook adding downstream keys to requests.

    ``httpx.AsyncClient(event_hooks={"request": [httpx_event_hook(hosts=[...])]})``: a
    request made while an idempotent callback runs, with a method in ``methods`` to a
    host in ``hosts``, gets ``header``: the n-th such request to one method and URL in a
    run gets the same key in every run of the idempotency key.  A header the caller set
    wins.  Requests made outside a callback, or after it ended, are left alone.

    :param hosts: the hosts to add keys for (required: a key goes only where you say):
        ``"api.example.com"``, ``"api.example.com:8443"`` (that port only), or
        ``"*.example.com"`` (its subdomains).
    :param methods: the methods to add keys to (default: POST, PUT, PATCH, DELETE).
    :param header: the header to set (e.g. ``"PayPal-Request-Id"``).

    .. versionadded:: 0.1.0
    """
    policy = _policy(hosts, methods, header)

    async def add_downstream_key(request: httpx.Request) -> None:
        url = request.url
        present = policy.header in request.headers
        key = policy.key_for(
            request.method, url.scheme, url.host, url.port, url.raw_path.decode("ascii"), present
        )
        if key is not None:
            request.headers[policy.header] = key
        elif present and policy.carried(
            request.method, url.host, _port(url.scheme, url.port), request.headers[policy.header]
        ):
            del request.headers[policy.header]  # followed a redirect off the allow-list

    return add_downstream_key


def aiohttp_middleware(
    *,
    hosts: Iterable[str],
    methods: Iterable[str] = DEFAULT_METHODS,
    header: str = "Idempotency-Key",
) -> ClientMiddlewareType:
    """An ``aiohttp.ClientSession`` client middleware (aiohttp >= 3.12) adding downstream
    keys to requests, with the rules of :func:`httpx_event_hook`:
    ``aiohttp.ClientSession(middlewares=[aiohttp_middleware(hosts=[...])])``.

    .. versionadded:: 0.1.0
    """
    policy = _policy(hosts, methods, header)

    async def add_downstream_key(
        request: ClientRequest, handler: ClientHandlerType
    ) -> ClientResponse:
        url = request.url
        present = policy.header in request.headers
        key = policy.key_for(
            request.method, url.scheme, url.host, url.port, url.raw_path_qs, present
        )
        if key is not None:
            request.headers[policy.header] = key
        elif present and policy.carried(
            request.method, url.host, _port(url.scheme, url.port), request.headers[policy.header]
        ):
            del request.headers[policy.header]
        return await handler(request)

    return add_downstream_key


def _port(scheme: str, port: int | None) -> int | None:
    return _DEFAULT_PORTS.get(scheme) if port is None else port


def _policy(hosts: Iterable[str], methods: Iterable[str], header: str) -> _Policy:
    if isinstance(hosts, str) or isinstance(methods, str):
        raise ConfigError(
            "hosts and methods are collections of strings: pass hosts=['api.example.com'], "
            "not a bare string"
        )
    if not isinstance(header, str) or _TOKEN.fullmatch(header) is None:
        raise ConfigError(f"header must be an HTTP header name, got {header!r}")
    exact: set[tuple[str, int | None]] = set()
    suffixes: list[tuple[str, int | None]] = []
    for entry in hosts:
        host, port = _host_entry(entry)
        if host.startswith("*."):
            suffixes.append((host[1:], port))
        else:
            exact.add((host, port))
    if not exact and not suffixes:
        raise ConfigError(
            "downstream keys need an allow-list of hosts: pass hosts=['api.example.com'] "
            "(a key is added only to requests to these hosts)"
        )
    chosen = set()
    for method in methods:
        if not isinstance(method, str) or _TOKEN.fullmatch(method) is None:
            raise ConfigError(f"methods must be HTTP method names, got {method!r}")
        chosen.add(method.upper())
    if not chosen:
        raise ConfigError("methods is empty: no request would get a downstream key")
    return _Policy(frozenset(exact), tuple(suffixes), frozenset(chosen), header)


def _host_entry(entry: object) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or ``*.suffix``, lowercased."""
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError(f"hosts must be non-empty host names, got {entry!r}")
    text = entry.strip().lower()
    if "/" in text or "@" in text:
        raise ConfigError(f"cannot read the host {entry!r}: give a host name, not a URL")
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] not in ("", ":"):
            raise ConfigError(f"cannot read the host {entry!r}: write [v6-address]:port")
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] or None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        port_text = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"the port of the host {entry!r} is not a port number")
        port = int(port_text)
    host = host.rstrip(".")
    if not host or "*" in host[1:] or host in ("*", "*."):
        raise ConfigError(
            f"cannot read the host {entry!r}: give a host name (api.example.com), with an "
            "optional :port, or *.example.com for its subdomains"
        )
    return host, port
