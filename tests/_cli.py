"""Run the ``idempotency-async`` command as operators do: a subprocess of this checkout."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "Run", "cli", "cli_env"]

ROOT = Path(__file__).resolve().parents[1]


def cli_env(**changes: str | None) -> dict[str, str]:
    """The environment of a run: dummy AWS credentials, no AWS files, no metadata service
    (a missing credential fails at once instead of after the IMDS timeout), UTC."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "IDEMPOTENCY_ASYNC_", "POWERTOOLS_"))
    }
    env.update(
        PYTHONPATH=str(ROOT),
        TZ="UTC",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def ok(self) -> str:
        assert self.code == 0, f"{self.args} exited {self.code}: {self.err}"
        return self.out

    def json(self) -> Any:
        return json.loads(self.ok())

    def error(self, code: int = 1) -> str:
        """The one-line error message (asserting it is one line, no traceback)."""
        assert self.code == code, f"{self.args} exited {self.code}, not {code}: {self.err}"
        assert self.out == "", self.out
        assert "Traceback" not in self.err, self.err
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        prefix = "idempotency-async: error: "
        assert lines[0].startswith(prefix), self.err
        return lines[0][len(prefix) :]


async def cli(
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    close_stdin: bool = False,
) -> Run:
    """Run ``python -m idempotency_async ARGS`` from the checkout and collect what it said.

    ``close_stdin``: run it with file descriptor 0 closed (``<&-`` in a shell).
    """
    command = (sys.executable, "-m", "idempotency_async", *args)
    if close_stdin:
        command = ("sh", "-c", 'exec "$@" <&-', "sh", *command)
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=ROOT,
        env=cli_env() if env is None else env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(
        process.communicate(None if stdin is None else stdin.encode()), timeout=60
    )
    assert process.returncode is not None
    return Run(args, process.returncode, out.decode(), err.decode())
