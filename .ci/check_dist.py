"""Build the sdist and the wheel (the wheel from the sdist) and check what users would get.

The wheel holds the package, its ``py.typed`` marker and metadata, and nothing else (no
tests, benchmarks, examples or docs); every module of the source tree is in it; the core
metadata of both artifacts is valid.  Run from the repository root: ``python .ci/check_dist.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from email.parser import BytesParser
from pathlib import Path

from packaging.metadata import Metadata
from packaging.version import Version

ROOT = Path(__file__).parents[1]
PACKAGE = "idempotency_async"
EXTRAS = {
    "dynamodb",
    "dynamodb-light",
    "redis",
    "postgres",
    "sqlalchemy",
    "starlette",
    "fastapi",
    "aiohttp",
    "otel",
    "mcp",
    "testing",
    "dev",
    "docs",
}


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "build", "--outdir", out, str(ROOT)], check=True)
        (wheel,) = Path(out).glob("*.whl")
        (sdist,) = Path(out).glob("*.tar.gz")
        problems = check_wheel(wheel) + check_sdist(sdist)
    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {wheel.name} and {sdist.name} are fine")
    return 1 if problems else 0


def check_wheel(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        problems = check_metadata(archive.read(metadata_name), wheel.name)
    tops = {name.split("/", 1)[0] for name in names}
    stray = sorted(t for t in tops if t != PACKAGE and not t.endswith(".dist-info"))
    if stray:
        problems.append(f"{wheel.name} holds more than the package: {stray}")
    expected = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / PACKAGE).rglob("*")
        if path.suffix == ".py" or path.name == "py.typed"
    }
    missing = sorted(expected - set(names))
    if missing:
        problems.append(f"{wheel.name} lacks {missing}")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        handle = archive.extractfile(sdist.name.removesuffix(".tar.gz") + "/PKG-INFO")
        assert handle is not None
        problems = check_metadata(handle.read(), sdist.name)
    for required in ("pyproject.toml", "README.md", f"{PACKAGE}/py.typed", "tests/conftest.py"):
        if required not in names:
            problems.append(f"{sdist.name} lacks {required}")
    junk = sorted(n for n in names if "__pycache__" in n or "node_modules" in n)
    if junk:
        problems.append(f"{sdist.name} holds build or install leftovers: {junk[:5]}")
    return problems


def check_metadata(raw: bytes, artifact: str) -> list[str]:
    """Core metadata parsed and validated by `packaging` (what PyPI and pip rely on)."""
    try:
        meta = Metadata.from_email(raw, validate=True)
    except Exception as exc:  # ExceptionGroup of every invalid field
        return [f"{artifact}: invalid metadata: {exc!r}"]
    problems = []
    if meta.name != "idempotency-async":
        problems.append(f"{artifact}: name {meta.name!r}")
    if meta.requires_python is None or not meta.requires_python.contains(Version("3.11")):
        problems.append(f"{artifact}: Requires-Python {meta.requires_python} excludes 3.11")
    if meta.description_content_type != "text/markdown" or not meta.description:
        problems.append(f"{artifact}: the README is not the Markdown long description")
    missing_extras = EXTRAS - {str(extra) for extra in meta.provides_extra or []}
    if missing_extras:
        problems.append(f"{artifact}: extras missing: {sorted(missing_extras)}")
    if "Typing :: Typed" not in (meta.classifiers or []):
        problems.append(f"{artifact}: no 'Typing :: Typed' classifier")
    headers = BytesParser().parsebytes(raw)
    if not headers.get("Summary"):
        problems.append(f"{artifact}: no Summary")
    return problems


if __name__ == "__main__":
    sys.exit(main())
