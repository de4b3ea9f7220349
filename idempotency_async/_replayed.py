"""Declared errors: exceptions a callback raises that are its result, not a failure.

A declined card or a validation error raised as an exception is deterministic: running
the callback again gives the same answer.  ``Options(replay_errors=ReplayErrors((CardDeclined,)))``
(or ``idempotent_function(..., replay_errors=(CardDeclined,))``) declares such errors
(a base class covers its subclasses).  A declared error completes the record instead of
releasing it, and every duplicate gets the same error raised again.

The record keeps the error as its response, in an envelope no plain result can take (a
result that looks like one is completed as "not stored")::

    {"__idempotency_error__": {"v": 1, "type": "shop.errors:CardDeclined",
                               "message": "card declined", "args": ["card declined"],
                               "data": {"code": "insufficient_funds"}}}

Bounded when written (``ReplayErrors.max_bytes``: data first, then arguments, then the
message give way) and untrusted when read: no module is imported from a stored type name.
A replay rebuilds the type only if it is a declared class or an already loaded subclass of
one, as ``cls.__idempotency_replay__(args, data)`` when the class defines it, else
``cls(*args)``; otherwise (or if that fails) it raises
:class:`~idempotency_async.errors.ReplayedError`, carrying the stored type name, message
and data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from idempotency_async._json import encode_json
from idempotency_async.errors import ConfigError, IdempotencyError, ReplayedError
from idempotency_async.record import JSONValue

__all__ = [
    "ENVELOPE",
    "ReplayErrors",
    "ReplayErrorsSetting",
    "declared_errors",
    "encode_error",
    "is_envelope",
    "replayed",
]

ENVELOPE: Final = "__idempotency_error__"
"""The one member of a stored error's response."""
_VERSION: Final = 1
_MAX_TYPE = 300
_MAX_MESSAGE = 1000
_MAX_ARGS = 16
_MAX_SUBCLASSES = 10_000  # how many loaded subclasses a replay looks through, at most
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class ReplayErrors:
    """Errors a callback may raise that are its result: stored and replayed, not released.

    ``classes``: the declared exception classes (a base class covers its subclasses);
    ``data``: an optional hook ``data(error) -> JSON value`` stored with the error (by
    default an error's ``__idempotency_data__()`` method, when it has one); ``max_bytes``:
    the bound of the stored error; ``private_records``: no TypeScript or Powertools reader
    shares the store's records (required with a store writing their record layout, whose
    readers would replay a stored error as a success; see ``docs/manager.md``).

    .. versionadded:: Unreleased
    """

    classes: tuple[type[Exception], ...]
    data: Callable[[Exception], JSONValue] | None = None
    max_bytes: int = 4096
    private_records: bool = False

    def __post_init__(self) -> None:
        classes: Any = self.classes
        if isinstance(classes, type):
            classes = (classes,)
            object.__setattr__(self, "classes", classes)
        if not isinstance(classes, tuple) or not classes:
            raise ConfigError(
                "replay_errors needs a non-empty tuple of exception classes, e.g. "
                f"(CardDeclined,); got {classes!r}"
            )
        for cls in classes:
            if not isinstance(cls, type) or not issubclass(cls, Exception):
                raise ConfigError(
                    f"replay_errors declares exception classes (subclasses of Exception); "
                    f"got {cls!r}"
                )
            if cls is Exception:
                raise ConfigError(
                    "replay_errors cannot declare Exception itself: every failure (a timeout, "
                    "a lost connection) would be stored and replayed until the record expires; "
                    "declare the classes of deterministic failures, e.g. (CardDeclined,)"
                )
            if issubclass(cls, IdempotencyError):
                raise ConfigError(
                    f"replay_errors cannot declare {cls.__qualname__}: the library's own "
                    "errors say what happened to this call, they are never its result"
                )
        if self.data is not None and not callable(self.data):
            raise ConfigError(f"ReplayErrors(data=) must be callable, got {self.data!r}")
        if (
            isinstance(self.max_bytes, bool)
            or not isinstance(self.max_bytes, int)
            or self.max_bytes < 256
        ):
            raise ConfigError(
                f"ReplayErrors(max_bytes=) must be an integer >= 256, got {self.max_bytes!r}"
            )


ReplayErrorsSetting: TypeAlias = ReplayErrors | tuple[type[Exception], ...] | type[Exception]
"""What ``replay_errors=`` takes: the settings, or just the classes."""


def declared_errors(setting: ReplayErrorsSetting | None) -> ReplayErrors | None:
    """``setting`` as :class:`ReplayErrors` (``None``: nothing declared)."""
    if setting is None or isinstance(setting, ReplayErrors):
        return setting
    return ReplayErrors(setting)  # type: ignore[arg-type]  # checked there


# ------------------------------------------------------------------ writing


def encode_error(exc: Exception, settings: ReplayErrors, limit: int) -> tuple[JSONValue, bytes]:
    """The stored form of the declared error ``exc``, within ``settings.max_bytes`` and the
    store's ``limit``: the data gives way first, then the arguments, then the message."""
    bound = min(settings.max_bytes, limit)
    cls = type(exc)
    name = f"{cls.__module__}:{cls.__qualname__}"[:_MAX_TYPE]
    message = _text(exc)[:_MAX_MESSAGE]
    args = _plain_args(exc.args)
    data = _data(exc, settings)
    for candidate in (
        (message, args, data),
        (message, args, None),
        (message, None, None),
        (message[: max(0, bound // 8)], None, None),
        ("", None, None),
    ):
        value = _envelope(name, *candidate)
        try:
            encoded = encode_json(value)
        except Exception:
            continue  # data that is not JSON: without it
        if len(encoded) <= bound:
            return value, encoded
    value = _envelope(name[:64], "", None, None)
    return value, encode_json(value)


def _envelope(name: str, message: str, args: list[Any] | None, data: JSONValue) -> JSONValue:
    body: dict[str, Any] = {"v": _VERSION, "type": name, "message": message}
    if args is not None:
        body["args"] = args
    if data is not None:
        body["data"] = data
    return {ENVELOPE: body}


def _text(exc: BaseException) -> str:
    try:
        return str(exc).encode("utf-8", "replace").decode("utf-8")
    except Exception:
        return ""


def _plain_args(args: tuple[Any, ...]) -> list[Any] | None:
    """The error's arguments when they are few JSON scalars (rebuilding calls ``cls(*args)``)."""
    if len(args) > _MAX_ARGS or not all(isinstance(arg, _SCALARS) for arg in args):
        return None
    return list(args)


def _data(exc: Exception, settings: ReplayErrors) -> JSONValue:
    try:
        if settings.data is not None:
            return settings.data(exc)
        declare = getattr(exc, "__idempotency_data__", None)
        return declare() if callable(declare) else None
    except Exception:
        return None  # the error is stored all the same, without its data


# ------------------------------------------------------------------ reading


def is_envelope(value: Any) -> bool:
    """Whether a response is a stored error (or a plain result taking its form)."""
    return value.__class__ is dict and ENVELOPE in value and len(value) == 1


def replayed(stored: dict[str, Any], settings: ReplayErrors | None, key: str) -> Exception:
    """The exception a replay of the stored error raises (read as untrusted input)."""
    body = stored.get(ENVELOPE)
    body = body if isinstance(body, dict) else {}
    name = body.get("type")
    name = name[:_MAX_TYPE] if isinstance(name, str) else "unknown"
    message = body.get("message")
    message = message[:_MAX_MESSAGE] if isinstance(message, str) else ""
    args = body.get("args")
    data = body.get("data")
    cls = _declared_class(name, settings)
    why = "not a declared error class here"
    if cls is not None:
        try:
            rebuild = getattr(cls, "__idempotency_replay__", None)
            arguments = tuple(args) if isinstance(args, list) and _scalar_list(args) else (message,)
            error = rebuild(arguments, data) if callable(rebuild) else cls(*arguments)
        except Exception as exc:
            why = f"rebuilding it failed ({type(exc).__name__})"
        else:
            if isinstance(error, cls):
                error.add_note(f"replayed: the first call for key {key} raised this error")
                return error
            why = "its __idempotency_replay__ returned another type"
    return ReplayedError(
        f"the first call for key {key} raised {name}: {message} (replayed from its record; {why})",
        key=key,
        error_type=name,
        error_message=message,
        data=data,
    )


def _scalar_list(args: Any) -> bool:
    return (
        isinstance(args, list)
        and len(args) <= _MAX_ARGS
        and all(isinstance(arg, _SCALARS) for arg in args)
    )


def _declared_class(name: str, settings: ReplayErrors | None) -> type[Exception] | None:
    """The declared class, or loaded subclass of one, named ``name`` — never an import."""
    if settings is None:
        return None
    for cls in _classes(settings.classes):
        if f"{cls.__module__}:{cls.__qualname__}" == name:
            return cls
    return None


def _classes(roots: tuple[type[Exception], ...]) -> Iterator[type[Exception]]:
    seen: set[type[Exception]] = set()
    pending = list(roots)
    while pending and len(seen) < _MAX_SUBCLASSES:
        cls = pending.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        pending.extend(cls.__subclasses__())
