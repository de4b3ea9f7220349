"""Response codecs for results that are not plain JSON values.

Pass one as ``Options(response_codec=...)``: results are encoded to JSON values before
they are stored, and replays decode them back to the original type.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

from idempotency_async.errors import ConfigError
from idempotency_async.record import JSONValue

__all__ = ["DataclassCodec", "PydanticCodec"]

T = TypeVar("T")


class DataclassCodec(Generic[T]):
    """Stores a dataclass result as its fields; replays rebuild ``cls(**fields)``.

    Nested dataclasses are stored as dicts and come back as dicts unless ``cls`` rebuilds
    them in ``__post_init__``.
    """

    def __init__(self, cls: type[T]) -> None:
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"DataclassCodec needs a dataclass type, got {cls!r}")
        self._cls = cls

    def encode(self, result: Any) -> JSONValue:
        if not isinstance(result, self._cls):
            raise ConfigError(
                f"DataclassCodec({self._cls.__name__}) got a {type(result).__name__} result"
            )
        return dataclasses.asdict(result)  # type: ignore[call-overload]

    def decode(self, stored: JSONValue) -> T:
        return self._cls(**stored)


class PydanticCodec(Generic[T]):
    """Stores a pydantic v2 model result with ``model_dump(mode="json")``; replays validate it.

    pydantic is not a dependency: it is only used through the model class you pass.
    """

    def __init__(self, model: type[T]) -> None:
        if not hasattr(model, "model_validate"):
            raise ConfigError(f"PydanticCodec needs a pydantic v2 model class, got {model!r}")
        self._model: Any = model

    def encode(self, result: Any) -> JSONValue:
        return result.model_dump(mode="json")

    def decode(self, stored: JSONValue) -> T:
        return self._model.model_validate(stored)  # type: ignore[no-any-return]
