"""A single-threaded moto server in a subprocess, for the DynamoDB benchmarks.

Single-threaded on purpose: moto's threaded server does not make a conditional write
atomic (see docs/dynamodb.md, "Running DynamoDB locally").
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

__all__ = ["start_moto"]

_SERVER = (
    "import sys\n"
    "from werkzeug.serving import run_simple\n"
    "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app\n"
    "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app),"
    " threaded=False)\n"
)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """Start the server; return its process (terminate it when done) and its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return process, url
        except urllib.error.HTTPError:
            return process, url
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the moto server did not start")
