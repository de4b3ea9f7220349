"""Griffe extension: hooks of Python's own machinery stay out of the API reference.

``filters: public`` keeps every special method, which is right for ``__call__``,
``__aenter__`` or ``__len__`` (they are how a class is used) but not for
``__post_init__``: a dataclass's validation step, which users never call.
"""

from __future__ import annotations

from typing import Any

from griffe import Class, Extension

_HIDDEN = ("__post_init__",)


class HideInternals(Extension):
    """Drops the members named in ``_HIDDEN`` from every class, once its members are known."""

    def on_class_members(self, *, cls: Class, **kwargs: Any) -> None:
        for name in _HIDDEN:
            if name in cls.members:
                cls.del_member(name)
