"""The names of the key formats, apart from their rules.

Checking ``Options.key_format`` needs only these names; the Powertools (Python) rules in
``_powertools_python`` (and the modules they import) load only when that format is used.
"""

from __future__ import annotations

from typing import Final

__all__ = ["KEY_FORMATS", "POWERTOOLS_PYTHON", "TYPESCRIPT"]

POWERTOOLS_PYTHON: Final = "powertools-python"
TYPESCRIPT: Final = "typescript"
KEY_FORMATS: Final = (TYPESCRIPT, POWERTOOLS_PYTHON)
