"""The command's own error, and how any error becomes one line on stderr."""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "CliError", "one_line"]

EXIT_ERROR: Final = 1
EXIT_NOT_FOUND: Final = 3
"""``get`` and ``release`` found no record for the key."""


class CliError(Exception):
    """A mistake or a condition the operator can fix; printed as one line, never a traceback."""

    def __init__(self, message: str, *, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    return " ".join(text.split())
