"""Options and its groups: every setting documented where users read it, groups frozen."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import idempotency_async
from idempotency_async import LocalCache, Options, Renewal, Wait, errors

ROOT = Path(__file__).parents[1]
GROUPS = {"local_cache": LocalCache, "renewal": Renewal, "wait": Wait}


def _field_docstrings(name: str) -> dict[str, str | None]:
    """Each annotated field of class ``name`` in options.py, with the string under it."""
    tree = ast.parse((ROOT / "idempotency_async" / "options.py").read_text())
    (body,) = [
        node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name
    ]
    found: dict[str, str | None] = {}
    for statement, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            docstring = None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docstring = after.value.value
            found[statement.target.id] = docstring
    return found


@pytest.mark.parametrize("kind", [Options, *GROUPS.values()], ids=lambda kind: kind.__name__)
def test_every_option_and_group_field_has_a_docstring(kind: type) -> None:
    documented = _field_docstrings(kind.__name__)
    assert set(documented) == {field.name for field in dataclasses.fields(kind)}
    assert [name for name, text in documented.items() if not text] == []


def test_the_options_table_lists_every_option_and_group_field_and_nothing_else() -> None:
    page = (ROOT / "docs" / "manager.md").read_text()
    table = page.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \|", table, re.MULTILINE)
    expected = [field.name for field in dataclasses.fields(Options)]
    for group in GROUPS.values():
        expected += [f"{group.__name__}.{field.name}" for field in dataclasses.fields(group)]
    assert sorted(rows) == sorted(expected)
    # A group's fields follow its option.
    for name, group in GROUPS.items():
        assert rows[rows.index(name) + 1].startswith(f"{group.__name__}.")


@pytest.mark.parametrize("group", GROUPS.values(), ids=lambda group: group.__name__)
def test_groups_are_frozen_slotted_and_exported(group: type) -> None:
    value = group(lease=30.0) if group is Renewal else group()
    first = dataclasses.fields(group)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, 1.0)
    assert not hasattr(value, "__dict__")
    assert group.__name__ in idempotency_async.__all__


@pytest.mark.parametrize(
    ("name", "bare"), [("wait", True), ("renewal", 30.0), ("local_cache", 500)]
)
def test_a_bare_value_where_a_group_belongs_names_the_group(name: str, bare: object) -> None:
    group = GROUPS[name].__name__
    with pytest.raises(errors.ConfigError, match=rf"{name} takes a {group} or None.*{group}\("):
        Options(**{name: bare})  # type: ignore[arg-type]


def test_the_old_flat_names_are_gone() -> None:
    for old in ("renew_lease", "renew_every", "wait_timeout", "use_local_cache"):
        with pytest.raises(TypeError, match=old):
            Options(**{old: 1})  # type: ignore[arg-type]
