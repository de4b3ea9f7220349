"""Cold start: a fresh interpreter importing the library and making its first DynamoDB call.

    python benchmarks/bench_cold_start.py            # full run (about a minute)
    python benchmarks/bench_cold_start.py --smoke    # a few seconds, for CI

What a Lambda cold start pays before its first answer.  Every sample is a new Python
process (``sys.executable -c ...``) that talks to one single-threaded moto server started
by this script.  Each child reports, in milliseconds since the parent spawned it (so the
interpreter's own start-up is included), when each phase ended:

  import    its imports are done
  client    the DynamoDB client is ready (opened, nothing sent yet)
  claim     the first claim was answered (the callback starts running)
  complete  the first idempotent call returned (claim + callback + completion)

Paths:
  bare      ``import asyncio, json`` and nothing else: the interpreter's floor
  library   ``import idempotency_async`` and the DynamoDB store module, no call
  anchor    aws-lambda-powertools ``idempotent_function`` on ``DynamoDBPersistenceLayer``
            with a boto3 client: what a synchronous Lambda pays today
  aioboto3  ``Manager.execute`` on ``DynamoDBStore`` with an aioboto3 client (the default)
  light     the same on the light transport (``LightDynamoDBClient``, no botocore)

One round runs every path once, in an order that rotates every round; the tables give
medians over rounds, and each ratio is taken within one round (path / anchor) so machine
load moves both sides together; ``cpu`` is each child's whole CPU time, which moves far
less with load than wall time.  Last, ``python -X importtime`` of
``import idempotency_async`` and the store module (median self time per module over a few
runs): the modules the library's import loads beyond ``bare``.  Budgets: that sum (the
library's own import) at most 30 ms; ``light`` at most 1.0x ``anchor`` end to end.

Children load compiled bytecode, as from an installed package: a private
``PYTHONPYCACHEPREFIX`` filled by one untimed run of each path.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import boto3
from _moto_server import start_moto
from _stats import load, parse_args

REGION = "us-east-1"
IMPORT_BUDGET_MS = 30.0
LIGHT_BUDGET = 0.5
"""The documented Lambda construction (light transport) against Powertools + boto3."""
PHASES = ("import", "client", "claim", "complete")
COLUMNS = (*PHASES, "cpu")

_PRELUDE = """
import sys, time
SPAWNED = float(sys.argv[1])
ENDPOINT, TABLE = sys.argv[2], sys.argv[3]
stamps = {}
def stamp(phase):
    stamps[phase] = (time.time() - SPAWNED) * 1000
"""
_REPORT = """
import json as _json
print(_json.dumps(stamps))
"""

_BARE = """
import asyncio, json
stamp("import")
"""

_LIBRARY = """
import asyncio, json
import idempotency_async
import idempotency_async.stores.dynamodb
stamp("import")
"""

_ANCHOR = """
import uuid
import boto3
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function,
)
stamp("import")
client = boto3.client("dynamodb", endpoint_url=ENDPOINT)
stamp("client")
layer = DynamoDBPersistenceLayer(table_name=TABLE, boto3_client=client)

@idempotent_function(
    data_keyword_argument="order", persistence_store=layer,
    config=IdempotencyConfig(expires_after_seconds=3600),
)
def process(order):
    stamp("claim")
    return {"status": "ACCEPTED", "order": order["id"]}

process(order={"id": uuid.uuid4().hex, "amount": 10})
stamp("complete")
"""

_OURS = """
import asyncio, uuid
from idempotency_async import Manager, Options
from idempotency_async.stores.dynamodb import DynamoDBStore
{client_import}
stamp("import")

async def main():
    store = DynamoDBStore(client_factory={factory}, table_name=TABLE)
    async with store:
        stamp("client")
        manager = Manager(store, Options(key_prefix="cold"))

        async def process():
            stamp("claim")
            return {{"status": "ACCEPTED", "order": order["id"]}}

        order = {{"id": uuid.uuid4().hex, "amount": 10}}
        await manager.execute(order, process, timeout=10)
        stamp("complete")

asyncio.run(main())
"""

_AIOBOTO3 = _OURS.format(
    client_import="import aioboto3\nsession = aioboto3.Session()",
    factory='lambda: session.client("dynamodb", endpoint_url=ENDPOINT)',
)
_LIGHT = _OURS.format(
    client_import="from idempotency_async.stores.dynamodb_light import LightDynamoDBClient",
    factory="lambda: LightDynamoDBClient(endpoint_url=ENDPOINT)",
)

PATHS = {
    "bare": _BARE,
    "library": _LIBRARY,
    "anchor": _ANCHOR,
    "aioboto3": _AIOBOTO3,
    "light": _LIGHT,
}


def child_environment(scratch: str) -> dict[str, str]:
    """What a Lambda has: credentials and region in the environment, no AWS config files,
    and compiled bytecode for every module (as ``pip install`` leaves it).

    Bytecode goes to a private cache (``PYTHONPYCACHEPREFIX``) that the untimed warm-up
    run fills, so an editable checkout, or a shell with ``PYTHONDONTWRITEBYTECODE``, does
    not make the library compile its source on every sample while the SDKs load theirs
    from ``__pycache__``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "POWERTOOLS_", "IDEMPOTENCY_ASYNC_"))
        and name != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        PYTHONPYCACHEPREFIX=os.path.join(scratch, "pycache"),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_SESSION_TOKEN="testing",
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=os.path.join(scratch, "config"),
        AWS_SHARED_CREDENTIALS_FILE=os.path.join(scratch, "credentials"),
    )
    return env


def run_child(code: str, endpoint: str, table: str, env: dict[str, str]) -> dict[str, float]:
    script = _PRELUDE + code + _REPORT
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", script, repr(spawned), endpoint, table],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a cold-start child failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stamps: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    # The whole child's CPU time (user + system, exit included): far less sensitive than
    # wall time to other processes competing for the machine's cores.
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stamps["cpu"] = used * 1000
    return stamps


def create_table(endpoint: str) -> str:
    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"cold-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def measure(endpoint: str, rounds: int, env: dict[str, str]) -> dict[str, list[dict[str, float]]]:
    table = create_table(endpoint)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
    names = list(PATHS)
    for name in names:  # untimed: fills the bytecode cache and the OS file cache
        run_child(PATHS[name], endpoint, table, env)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(run_child(PATHS[name], endpoint, table, env))
    return samples


def median_phase(runs: list[dict[str, float]], phase: str) -> float | None:
    values = [run[phase] for run in runs if phase in run]
    return statistics.median(values) if values else None


def ratios(samples: dict[str, list[dict[str, float]]], name: str) -> list[float]:
    return [
        ours["complete"] / anchor["complete"]
        for ours, anchor in zip(samples[name], samples["anchor"], strict=True)
    ]


def report(samples: dict[str, list[dict[str, float]]], rounds: int) -> list[str]:
    print(f"Cold start on a single-threaded moto server: ms since spawn, medians of {rounds}")
    print("(cpu: the child's CPU time, user + system; ratios: complete / anchor's, per round)")
    print(f"  {'path':<9}" + "".join(f"{phase:>10}" for phase in COLUMNS) + "   / anchor (range)")
    for name, runs in samples.items():
        cells = ""
        for phase in COLUMNS:
            value = median_phase(runs, phase)
            cells += f"{'-' if value is None else f'{value:.1f}':>10}"
        ratio = ""
        if "complete" in runs[0] and name != "anchor":
            each = ratios(samples, name)
            ratio = f"   {statistics.median(each):.2f}x ({min(each):.2f}-{max(each):.2f})"
        print(f"  {name:<9}{cells}{ratio}")
    if "light" in samples:
        cpu = [
            light["cpu"] / anchor["cpu"]
            for light, anchor in zip(samples["light"], samples["anchor"], strict=True)
        ]
        print(
            f"  light / anchor, child CPU within rounds: {statistics.median(cpu):.2f}x "
            f"({min(cpu):.2f}-{max(cpu):.2f})"
        )
    over: list[str] = []
    for measure in ("import", "cpu"):
        library = [
            lib[measure] - bare[measure]
            for lib, bare in zip(samples["library"], samples["bare"], strict=True)
        ]
        label = "wall" if measure == "import" else "CPU"
        print(f"  library import above bare ({label}): {statistics.median(library):.1f} ms")
    light = statistics.median(ratios(samples, "light")) if "light" in samples else 0.0
    if light > LIGHT_BUDGET:
        over.append(f"light transport {light:.2f}x the anchor")
    return over


def import_times(runs: int, top: int, env: dict[str, str]) -> float:
    """Median self time of each module ``import idempotency_async`` adds beyond bare;
    returns their sum (ms): the library's own import, the budget's measure."""

    def profile(code: str) -> dict[str, list[int]]:
        selves: dict[str, list[int]] = {}
        for run in range(runs + 1):  # the first run fills the bytecode cache: not counted
            done = subprocess.run(
                [sys.executable, "-X", "importtime", "-c", code],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            if run == 0:
                continue
            for line in done.stderr.splitlines():
                parts = line.split("|")
                if len(parts) != 3 or not parts[0].startswith("import time:"):
                    continue
                try:
                    self_us = int(parts[0].removeprefix("import time:"))
                except ValueError:
                    continue  # the header line
                selves.setdefault(parts[2].strip(), []).append(self_us)
        return selves

    base = profile("import asyncio, json")
    ours = profile("import asyncio, json, idempotency_async, idempotency_async.stores.dynamodb")
    added = {
        name: statistics.median(values) / 1000 for name, values in ours.items() if name not in base
    }
    print(
        f"python -X importtime: modules added by the library's import, median self ms "
        f"of {runs} runs (sum {sum(added.values()):.1f} ms)"
    )
    for name, ms in sorted(added.items(), key=lambda item: -item[1])[:top]:
        print(f"  {ms:6.2f}  {name}")
    return sum(added.values())


def main() -> None:
    args = parse_args(__doc__ or "")
    rounds = args.repeats or (2 if args.smoke else 15)
    process, endpoint = start_moto()
    with tempfile.TemporaryDirectory() as scratch:
        env = child_environment(scratch)
        try:
            samples = measure(endpoint, rounds, env)
        finally:
            process.terminate()
            process.wait(timeout=10)
        over = report(samples, rounds)
        own = import_times(runs=1 if args.smoke else 5, top=8 if args.smoke else 25, env=env)
    # Self times are wall clock and move with the machine's load (2-5x on a shared VM):
    # the import budget is judged by bench_import.py, against a calibration import.
    print(
        f"the library's own import: {own:.1f} ms of import time ({load()}); its budget "
        f"({IMPORT_BUDGET_MS:.0f} ms) is checked by benchmarks/bench_import.py"
    )
    if over:
        print("over budget: " + "; ".join(over))
        if args.smoke:
            print("  (smoke runs are too short to judge; not failing)")
        else:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
