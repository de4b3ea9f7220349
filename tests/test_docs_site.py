"""The documentation site follows the package: new modules and pages need no configuration.

Builds the site strictly (warnings fail) from a copy of the repository to which a public
module with an optional dependency that is not installed, a private module and a new page
were added, as other work will add them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]

NEW_MODULE = '''\
"""A feature with an optional dependency.

Uses :class:`not_installed_anywhere.Client` and :func:`helper`::

    feature = Feature(Client())
"""

from not_installed_anywhere import Client

__all__ = ["Feature", "helper"]


class Feature:
    """Does the new thing with a :class:`~not_installed_anywhere.Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client


def helper() -> None:
    """Helps."""
'''


def test_site_builds_strictly_with_new_modules_and_pages(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=ignore)
    shutil.copytree(ROOT / "idempotency_async", copy / "idempotency_async", ignore=ignore)
    (copy / "idempotency_async" / "stores" / "future_store.py").write_text(NEW_MODULE)
    (copy / "idempotency_async" / "_future_internals.py").write_text('"""Private."""\n')
    (copy / "docs" / "future-page.md").write_text("# A page added later\n\nText.\n")
    site = tmp_path / "site"

    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=copy,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert built.returncode == 0, built.stderr
    page = (site / "reference" / "stores.future_store" / "index.html").read_text()
    assert 'id="idempotency_async.stores.future_store.Feature"' in page
    # reST roles became links (or plain code when the target is not documented) ...
    assert ":class:" not in page and ":func:" not in page
    assert 'href="#idempotency_async.stores.future_store.helper"' in page
    # ... and the `::` literal block became highlighted code.
    assert "<code>helper</code></a>:</p>" in page
    assert '<span class="n">feature</span> <span class="o">=</span>' in page
    assert not (site / "reference" / "_future_internals").exists()
    home = (site / "index.html").read_text()
    assert "A page added later" in home  # listed in the navigation
    assert "stores.future_store" in home
