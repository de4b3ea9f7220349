"""docs/architecture.md stays truthful and complete: its module map names every module of
the package and nothing else, and every door it lists exists.

When a module is added, renamed or removed, the failure names the lines to add to or
remove from the map (one line per module, its path relative to the package, a package as
``name/``).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import idempotency_async

PACKAGE = Path(idempotency_async.__file__).parent
DOC = Path(__file__).parent.parent / "docs" / "architecture.md"

# The public modules whose names are doors (each of their names a user calls is listed).
DOOR_MODULES = (
    "decorators",
    "integrations.aws_lambda",
    "integrations.starlette",
    "integrations.fastapi",
    "integrations.aiohttp",
    "integrations.mcp",
    "integrations.powertools",
)
# Names those modules export that are types or values handed to a door, not doors.
NOT_DOORS = frozenset(
    {
        "HttpTransaction",
        "RequestState",
        "request_state",
        "IdempotencyKey",
        "OptionalIdempotencyKey",
        "IdempotentTransaction",
        "idempotency_openapi",
        "IdempotentFunction",
        "BatchResponse",
        "EventType",
        "LambdaEntrypoint",
        "CallerScope",
        "CONTEXT_PARAMETER",
        "META_KEY",
        "REPLAYED_HEADER",
        "REDACTED_HEADER",
    }
)


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/architecture.md has no '## {title}' section"
    return match[1]


def _mapped() -> list[str]:
    block = re.search(r"^```\n(.*?)^```", _section("Modules"), re.MULTILINE | re.DOTALL)
    assert block is not None, "the Modules section has no code block"
    # An entry starts its line; descriptions continue on indented lines.
    return [line.split()[0] for line in block[1].splitlines() if line and not line[0].isspace()]


def _modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if relative.name == "__init__":
            found.add("__init__" if relative.parent == Path() else f"{relative.parent}/")
        else:
            found.add(relative.as_posix())
    return found


def test_the_module_map_names_every_module_and_nothing_else() -> None:
    mapped = _mapped()
    duplicates = sorted({name for name in mapped if mapped.count(name) > 1})
    assert not duplicates, f"listed twice in docs/architecture.md: {duplicates}"
    actual = _modules()
    missing = sorted(actual - set(mapped))
    stale = sorted(set(mapped) - actual)
    assert not missing and not stale, (
        f"docs/architecture.md's module map: add {missing}, remove {stale}"
    )


def _doors() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|", _section("Doors"), re.MULTILINE)
    assert rows, "the Doors section has no table"
    return rows


def test_every_door_listed_exists() -> None:
    for name, module in _doors():
        found: object = importlib.import_module(f"idempotency_async.{module}")
        for part in name.split("."):
            assert hasattr(found, part), f"docs/architecture.md: {module} has no {name}"
            found = getattr(found, part)
        assert callable(found), f"docs/architecture.md: {module}.{name} is not callable"


def test_every_public_door_is_listed() -> None:
    listed = {name for name, _ in _doors()}
    for module in DOOR_MODULES:
        public = importlib.import_module(f"idempotency_async.{module}").__all__
        missing = sorted(set(public) - listed - NOT_DOORS)
        assert not missing, f"docs/architecture.md's Doors: add {missing} ({module})"
    manager = importlib.import_module("idempotency_async.manager").Manager
    methods = {f"Manager.{name}" for name in ("execute", "execute_call", "replay")}
    methods |= {f"Manager.{n}" for n in ("execute_in_transaction", "force_release")}
    assert methods <= listed
    assert all(hasattr(manager, name.split(".")[1]) for name in methods)
