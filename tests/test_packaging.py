"""After the README's install command, type checkers see the package and its types.

Each test builds a fresh virtual environment (no system site-packages), installs a copy of
the project into it the way a user would, and runs mypy on a small user file with
``--python-executable`` pointing at that environment: mypy then searches only that
interpreter's site-packages (and the paths its ``.pth`` files add), never the environment
the tests run in, and the user file sits alone in its directory, so the package can only
come from the fresh install.  setuptools' default editable install failed this test: its
import hook is invisible to mypy, which reported ``import-not-found``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# One deliberate error: it is reported only if mypy resolved the real types (an unresolved
# import would make `manager` Any, and mypy would report `import-not-found` instead).
USER_FILE = """\
from idempotency_async import Manager, MemoryStore, Options, errors


async def handle(manager: Manager, order: dict[str, object]) -> object:
    try:
        return await manager.execute(order, lambda: charge(order), timeout=10)
    except errors.AlreadyInProgressError as exc:
        return exc.lease_end


async def charge(order: dict[str, object]) -> dict[str, str]:
    return {"charge": "ch_1"}


manager = Manager(MemoryStore(), Options(key_prefix="orders"))
key: int = manager.key_for({"id": 1})
"""
EXPECTED_ERROR = (
    'app.py:16: error: Incompatible types in assignment (expression has type "str | None", '
    'variable has type "int")  [assignment]'
)


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a user's checkout needs to install, copied so nothing is written into the repo."""
    target = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    shutil.copytree(
        ROOT / "idempotency_async",
        target / "idempotency_async",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return target


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MYPYPATH"}}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _fresh_venv_with(tmp_path: Path, install_args: list[str]) -> Path:
    venv = tmp_path / "venv"
    # Without pip of its own (bootstrapping pip takes longer than the rest of the test):
    # this environment's pip installs into it through --python.
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, timeout=60)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *install_args],
        tmp_path,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def _mypy_on_user_file(tmp_path: Path, python: Path) -> str:
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    (user_dir / "app.py").write_text(USER_FILE)
    checked = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--python-executable",
            str(python),
            "app.py",
        ],
        user_dir,
        timeout=120,
    )
    return checked.stdout + checked.stderr


@pytest.mark.slow  # ~10-15 s per install mode; runs in CI like every test
@pytest.mark.parametrize("mode", ["editable", "wheel"])
def test_mypy_sees_the_installed_package_and_its_types(
    mode: str, project_copy: Path, tmp_path: Path
) -> None:
    install_args = ["-e", str(project_copy)] if mode == "editable" else [str(project_copy)]
    python = _fresh_venv_with(tmp_path, install_args)
    where = _run(
        [str(python), "-c", "import idempotency_async as m; print(m.__file__)"], tmp_path, 60
    )
    installed_from = project_copy if mode == "editable" else tmp_path / "venv"
    assert Path(where.stdout.strip()).is_relative_to(installed_from), where.stdout + where.stderr

    output = _mypy_on_user_file(tmp_path, python)

    assert "import-not-found" not in output, output
    assert "import-untyped" not in output, output
    assert output.splitlines() == [
        EXPECTED_ERROR,
        "Found 1 error in 1 file (checked 1 source file)",
    ]
