"""Griffe extension: the reST bits of this project's docstrings, rendered as Markdown.

The docstrings are written for ``help()`` and Sphinx-style readers (``:class:`~x.Y```,
``::`` literal blocks, ``.. code-block::``); mkdocstrings renders Markdown.  Roles become
cross-references marked *optional*, so a target that is not documented (a private module)
renders as plain code instead of failing the strict build.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([\w.]+)`")
_CODE_BLOCK = re.compile(r"^(\s*)\.\. code-block::\s*(\w*)\s*$")


class ReSTDocstrings(Extension):
    """Rewrites roles and literal blocks of every docstring once the tree is loaded."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = _literal_blocks(obj.docstring.value)
        obj.docstring.value = _ROLE.sub(lambda match: _crossref(obj, match), text)


def _crossref(obj: Object, match: re.Match[str]) -> str:
    short, name = match.group(1) == "~", match.group(2)
    try:
        target = obj.resolve(name.split(".", 1)[0])
        if "." in name:
            target += "." + name.split(".", 1)[1]
    except Exception:  # unresolvable in this scope: the name as written
        target = name
    title = name.rsplit(".", 1)[-1] if short else name
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def _literal_blocks(text: str) -> str:
    """``::`` and ``.. code-block::`` followed by an indented block become fenced code."""
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = _CODE_BLOCK.match(line)
        if directive is None and not line.rstrip().endswith("::"):
            out.append(line)
            index += 1
            continue
        if directive is not None:
            language = directive.group(2) or "python"
        else:
            language = "python"
            intro = line.rstrip()[:-2].rstrip()
            if intro:
                out.append(intro + ":")
        index += 1
        block: list[str] = []
        while index < len(lines) and (not lines[index].strip() or lines[index][:1].isspace()):
            block.append(lines[index])
            index += 1
        body = textwrap.dedent("\n".join(block)).strip("\n")
        out.extend(["", f"```{language}", *body.splitlines(), "```", ""])
    return "\n".join(out)
