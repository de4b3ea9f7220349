"""``key``: the idempotency key of a payload, or of an HTTP request, as the service derives it.

Nothing here re-implements derivation: a Manager (or the decorator's per-function manager,
or the HTTP middleware's options and request scope) computes the key, so the printed key
is the stored one byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import orjson

from idempotency_async._function_manager import function_manager
from idempotency_async._json import loads_strict
from idempotency_async._keys import key_deriver
from idempotency_async.cli._errors import CliError
from idempotency_async.errors import KeyMissingError
from idempotency_async.integrations._http import Rejection, http_manager, parse_key, request_scope
from idempotency_async.manager import Manager
from idempotency_async.options import Options
from idempotency_async.stores.memory import MemoryStore

__all__ = ["run_key"]


def run_key(args: argparse.Namespace) -> int:
    options = Options(
        key_prefix=args.prefix,
        event_key_jmespath=args.jmespath,
        payload_validation_jmespath=args.validation_jmespath,
        hash_function=args.hash,
        integer_precision=args.integer_precision,
        key_format=args.key_format,
        powertools_version=args.powertools_version,
        raise_on_no_key=True,  # only decides whether a missing key raises or logs
    )
    manager = Manager(MemoryStore(), options)
    if args.http is not None:
        key, validation = _http_key(manager, args), None
    else:
        key, validation = _payload_keys(manager, args)
    if args.json:
        print(json.dumps({"key": key, "validation": validation}, ensure_ascii=False))
    else:
        print(key)
        if validation is not None:
            print(validation)
    return 0


def _payload_keys(manager: Manager, args: argparse.Namespace) -> tuple[str, str | None]:
    if args.caller is not None:
        raise CliError("--caller is the HTTP middleware's caller scope: use it with --http")
    payload = _read_payload(args.payload)
    if args.function is not None:
        manager = function_manager(manager, _named(args.function))
    try:
        key = manager.key_for(payload)
    except KeyMissingError as exc:
        raise CliError(
            f"the payload has no idempotency key: --jmespath {args.jmespath!r} selected "
            "nothing (the service runs such calls without idempotency)"
        ) from exc
    assert key is not None  # raise_on_no_key
    validation = None
    if args.validation_jmespath is not None:
        keys = key_deriver(manager.options).derive(payload)
        validation = None if keys is None else keys.validation
    return key, validation


def _http_key(manager: Manager, args: argparse.Namespace) -> str:
    if args.jmespath is not None or args.validation_jmespath is not None or args.function:
        raise CliError(
            "--http derives the key as the HTTP middleware does; it takes no --jmespath, "
            "--validation-jmespath or --function"
        )
    if args.payload is not None:
        raise CliError("--http takes no payload: the key comes from METHOD, ROUTE and KEY")
    method, route, header = args.http
    try:
        key = parse_key([header], required=True)
    except Rejection as exc:
        detail = orjson.loads(exc.response.body).get("detail", "invalid Idempotency-Key")
        raise CliError(f"invalid Idempotency-Key {header!r}: {detail}") from exc
    assert key is not None  # required=True
    http = http_manager(manager)
    found = http.key_for({"scope": request_scope(method, route, args.caller, key)})
    assert found is not None  # the scope is never missing
    return found


def _read_payload(path: str | None) -> Any:
    if path is None or path == "-":
        if sys.stdin.isatty():
            raise CliError("no payload: pass a JSON file, or pipe the JSON into stdin")
        text = sys.stdin.buffer.read()
        source = "stdin"
    else:
        try:
            with open(path, "rb") as file:
                text = file.read()
        except OSError as exc:
            raise CliError(f"cannot read the payload: {exc.strerror}: {path}") from exc
        source = path
    try:
        return loads_strict(text)
    except UnicodeDecodeError as exc:
        raise CliError(f"the payload in {source} is not UTF-8 JSON: {exc}") from exc
    except ValueError as exc:
        raise CliError(f"the payload in {source} is not valid JSON: {exc}") from exc


def _named(spec: str) -> Callable[[], None]:
    """A stand-in carrying the decorated function's ``__module__`` and ``__qualname__``.

    The decorator reads nothing else, and importing the service's module would run its code.
    """
    module, sep, qualname = spec.partition(":")
    if not sep or not module or not qualname:
        raise CliError(
            f"--function takes MODULE:QUALNAME (e.g. shop.payments:charge or "
            f"shop.api:Orders.create), got {spec!r}"
        )

    def stand_in() -> None: ...

    stand_in.__module__ = module
    stand_in.__qualname__ = qualname
    return stand_in
