"""One named argument of a call, found as ``inspect.Signature.bind`` finds it, without
binding every call.

Whether a call binds depends only on its shape — how many positional arguments, which
keyword names — never on the values, and so does where the named argument's value comes
from (a position, a keyword, the default).  The first call of each shape is bound in
full, which raises ``TypeError`` exactly as calling the function would, before anything
is claimed; later calls of that shape read the value from where it was found.
``Signature.bind`` and ``apply_defaults`` cost about two thirds of a decorated replay's
own work on a memory store, the shape lookup a fraction of that.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["Reader", "argument_reader"]

Reader = Callable[[tuple[Any, ...], dict[str, Any]], Any]

_SHAPES = 64  # shapes remembered per function: a **kwargs function has no end of them
_BY_NAME, _DEFAULT = -1, -2  # where a value is when no position holds it

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_GATHERING = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def argument_reader(signature: inspect.Signature, name: str) -> Reader:
    """``read(args, kwargs)``: the value parameter ``name`` of ``signature`` takes in the
    call ``f(*args, **kwargs)``, its default applied; ``TypeError`` for a call the
    signature refuses.  ``name`` must be one of the signature's parameters."""
    parameter = signature.parameters[name]
    if parameter.kind in _GATHERING:  # the value is assembled from the call: bind each
        return lambda args, kwargs: _bound(signature, args, kwargs)[name]
    position = list(signature.parameters).index(name) if parameter.kind in _POSITIONAL else None
    by_name = parameter.kind is not inspect.Parameter.POSITIONAL_ONLY
    default = parameter.default
    places: dict[tuple[Any, ...], int] = {}

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        shape = (len(args), *kwargs)
        place = places.get(shape)
        if place is None:
            _bound(signature, args, kwargs)  # refuses what the function would refuse
            if position is not None and position < len(args):
                place = position
            else:
                place = _BY_NAME if by_name and name in kwargs else _DEFAULT
            if len(places) < _SHAPES:
                places[shape] = place
        if place >= 0:
            return args[place]
        return kwargs[name] if place == _BY_NAME else default

    return read


def _bound(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments
