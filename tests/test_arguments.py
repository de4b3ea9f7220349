"""The decorator's argument reader: the value ``Signature.bind`` gives, for every shape."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest

from idempotency_async import Manager, MemoryStore, Options, idempotent_function
from idempotency_async._arguments import argument_reader


def plain(a: Any, b: Any = "b-default", *, c: Any = "c-default", d: Any) -> None: ...
def only(a: Any, b: Any = "b-default", /, c: Any = "c-default", **rest: Any) -> None: ...
def gathering(a: Any, *more: Any, c: Any = "c-default", **rest: Any) -> None: ...


FUNCTIONS = [plain, only, gathering]
NAMES = ["a", "b", "c", "d", "x"]


def shapes() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every call of zero to three positional arguments and any subset of five keyword names, each
    value distinct so a wrong place shows."""
    calls = []
    for count in range(4):
        args = tuple(f"arg{n}" for n in range(count))
        for size in range(len(NAMES) + 1):
            for names in itertools.combinations(NAMES, size):
                calls.append((args, {name: f"kw-{name}" for name in names}))
    return calls


def bound(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    arguments = signature.bind(*args, **kwargs)
    arguments.apply_defaults()
    return arguments.arguments


@pytest.mark.parametrize("func", FUNCTIONS, ids=lambda f: f.__name__)
def test_every_shape_reads_what_bind_reads_and_refuses_what_it_refuses(func: Any) -> None:
    signature = inspect.signature(func)
    for name in signature.parameters:
        read = argument_reader(signature, name)
        for _ in range(2):  # the second pass reads from the remembered places
            for args, kwargs in shapes():
                try:
                    expected = bound(signature, args, kwargs)[name]
                except TypeError:
                    with pytest.raises(TypeError):
                        read(args, kwargs)
                    continue
                assert read(args, kwargs) == expected, (name, args, kwargs)


def test_a_shape_remembered_reads_each_call_s_own_values() -> None:
    read = argument_reader(inspect.signature(plain), "b")
    assert read((1, 2), {"d": 3}) == 2
    assert read((4, 5), {"d": 6}) == 5
    assert read((7,), {"d": 8}) == "b-default"
    assert read((7,), {"b": 9, "d": 8}) == 9


def test_a_keyword_function_remembers_a_bounded_number_of_shapes() -> None:
    read = argument_reader(inspect.signature(only), "a")
    places = read.__closure__  # the reader's own memory, found by its type
    assert places is not None
    memory = next(cell.cell_contents for cell in places if isinstance(cell.cell_contents, dict))
    for n in range(1_000):
        assert read((n,), {f"name{n}": n}) == n
    assert 0 < len(memory) <= 64


async def test_a_call_the_function_refuses_raises_before_the_key_is_claimed() -> None:
    store = MemoryStore()
    runs: list[int] = []

    @idempotent_function(Manager(store, Options()), payload="order", timeout=5)
    async def charge(order: dict[str, int], *, note: str = "") -> int:
        runs.append(order["id"])
        return order["id"]

    assert await charge({"id": 1}, note="a") == 1
    for _ in range(2):  # the shape is known the second time
        with pytest.raises(TypeError):
            await charge({"id": 2}, "positional note")  # type: ignore[misc]
        with pytest.raises(TypeError):
            await charge({"id": 3}, order={"id": 3})  # type: ignore[misc]
    assert runs == [1]
    assert len(store) == 1  # the first order's record alone
