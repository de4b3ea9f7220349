"""MkDocs hooks: an API reference page per public module, and no page left out of the nav.

The reference follows the package: every module whose dotted path has no underscored part
gets a page rendering its docstrings (mkdocstrings reads the source without importing it,
so modules whose optional dependencies are not installed render too).  A new public
module needs no change here.  Pages under ``docs/`` that ``mkdocs.yml`` does not list are
appended to the "More" section, so a new page is never unreachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PACKAGE = "idempotency_async"
REFERENCE = "reference"
_ROOT = Path(__file__).parents[2]


def public_modules() -> list[str]:
    """Dotted names of the package's public modules, packages before their modules."""
    names = []
    for path in sorted((_ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return sorted(names, key=lambda name: name.split("."))


def on_config(config: MkDocsConfig, **kwargs: Any) -> MkDocsConfig:
    nav = config.nav if config.nav is not None else []
    reference: list[Any] = [{"Overview": f"{REFERENCE}/index.md"}]
    reference += [{_title(name): _page(name)} for name in public_modules() if name != PACKAGE]
    nav.append({"API reference": reference})
    listed = set(_nav_pages(nav))
    docs = Path(config.docs_dir)
    extra = [
        {_heading(path): path.relative_to(docs).as_posix()}
        for path in sorted(docs.rglob("*.md"))
        if path.relative_to(docs).as_posix() not in listed
        and not any(part.startswith("_") for part in path.relative_to(docs).parts)
    ]
    if extra:
        nav.append({"More": extra})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    files.append(File.generated(config, f"{REFERENCE}/index.md", content=_overview()))
    for name in public_modules():
        if name != PACKAGE:
            files.append(File.generated(config, _page(name), content=f"# `{name}`\n\n::: {name}\n"))
    return files


def _overview() -> str:
    """The top-level names and every module, each with its docstring's first line."""
    rest = griffe.load_extensions(f"{Path(__file__).parent / 'rest_docstrings.py'}:ReSTDocstrings")
    package = griffe.load(
        PACKAGE, search_paths=[str(_ROOT)], resolve_aliases=False, extensions=rest
    )
    lines = [f"# API reference\n\n::: {PACKAGE}\n    options:\n      members: false\n"]
    lines += [f"## `from {PACKAGE} import ...`\n", "| name | what it is |", "| --- | --- |"]
    for export in package.exports or ():
        name = str(export)  # an ExprName when __all__ is built from other lists
        target = _target(package[name])
        link = f'<autoref identifier="{target.path}" optional><code>{name}</code></autoref>'
        lines.append(f"| {link} | {_summary(target)} |")
    lines += ["\n## Modules\n", "| module | what it holds |", "| --- | --- |"]
    for name in public_modules():
        if name != PACKAGE:
            module = package[name.removeprefix(PACKAGE + ".")]
            lines.append(f"| [`{name}`]({Path(_page(name)).name}) | {_summary(module)} |")
    return "\n".join(lines) + "\n"


def _target(obj: Any) -> Any:
    try:
        return obj.final_target if obj.is_alias else obj
    except griffe.AliasResolutionError:  # re-exported from outside the package
        return obj


def _summary(obj: Any) -> str:
    try:
        docstring = obj.docstring
    except griffe.AliasResolutionError:
        return ""
    if docstring is None:
        return ""
    first = docstring.value.strip().split("\n\n", 1)[0]
    return " ".join(first.split()).replace("|", "\\|")


def _page(module: str) -> str:
    return f"{REFERENCE}/{module.removeprefix(PACKAGE + '.')}.md"


def _title(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    return []


def _heading(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip().strip("`")
    return path.stem
