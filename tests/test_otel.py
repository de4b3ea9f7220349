"""OpenTelemetry: one span per call with its outcome and store round trips, and metrics.

Read through the SDK's in-memory span exporter and metric reader, on every real store.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support import RecordingStore, run, start_holding

from idempotency_async import LocalCache, Manager, MemoryStore, Options, Wait, errors
from idempotency_async.otel import Telemetry
from idempotency_async.stores.base import Store

PAYLOAD = {"order": "o-1", "amount": 10}
ROOT = Path(__file__).parent.parent  # subprocesses import this checkout
_ATTRIBUTE_NAMES = {"db_operation": "db.operation.name", "db_system": "db.system.name"}


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    telemetry: Telemetry

    def calls(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith("idempotency")]

    def only_call(self) -> ReadableSpan:
        (span,) = self.calls()
        return span

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found.extend(item.data.data_points)
        return found

    def count(self, metric: str, **attributes: str) -> float:
        """Calls counted (or samples recorded) with these attributes, named with ``_`` for
        the first ``.``: ``idempotency_outcome``, ``error_type``; ``db_operation`` is
        ``db.operation.name``."""
        wanted = {_ATTRIBUTE_NAMES.get(k, k.replace("_", ".", 1)): v for k, v in attributes.items()}
        total = 0.0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in wanted.items()):
                total += point.count if isinstance(point, HistogramDataPoint) else point.value
        return total


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Otel(spans, reader, tracer_provider, telemetry)
    meter_provider.shutdown()
    tracer_provider.shutdown()


def manager_of(store: Store, otel: Otel, **options: Any) -> Manager:
    return Manager(store, Options(key_prefix="orders", telemetry=otel.telemetry, **options))


def store_events(span: ReadableSpan) -> list[tuple[str, str | None]]:
    return [
        (str(e.attributes["db.operation.name"]), e.attributes.get("idempotency.store.result"))  # type: ignore[index, union-attr, misc]
        for e in span.events
        if e.name.startswith("idempotency.store.")
    ]


def system_of(store: Store) -> str:
    return {"MemoryStore": "memory", "RedisStore": "redis", "PostgresStore": "postgresql"}.get(
        type(store).__name__, "aws.dynamodb"
    )


async def test_first_call_is_claimed_with_claim_and_complete_round_trips(
    store: Store, otel: Otel
) -> None:
    manager = manager_of(store, otel)
    assert await manager.execute(PAYLOAD, lambda: run({"ok": 1}), timeout=5) == {"ok": 1}

    span = otel.only_call()
    assert span.name == "idempotency orders"
    assert span.attributes is not None
    assert span.attributes["idempotency.outcome"] == "claimed"
    assert span.attributes["idempotency.key"] == manager.key_for(PAYLOAD)
    assert span.attributes["idempotency.key_prefix"] == "orders"
    assert span.attributes["idempotency.callback.duration"] >= 0  # type: ignore[operator]
    assert span.status.status_code is StatusCode.UNSET
    assert store_events(span) == [("claim", "claimed"), ("complete", "response")]
    claim = next(e for e in span.events if e.name == "idempotency.store.claim")
    assert claim.attributes is not None
    assert claim.attributes["idempotency.store.duration"] > 0  # type: ignore[operator]
    # The outcome tells what happened: no span event repeats it.
    assert [e.name for e in span.events if not e.name.startswith("idempotency.store.")] == []

    assert otel.count("idempotency.calls", idempotency_outcome="claimed") == 1
    assert otel.count("idempotency.callback.duration", idempotency_outcome="claimed") == 1
    system = system_of(store)
    for operation in ("claim", "complete"):
        assert otel.count("idempotency.store.duration", db_operation=operation) == 1
    store_point = otel.points("idempotency.store.duration")[0]
    assert store_point.attributes["db.system.name"] == system
    if system in ("aws.dynamodb", "postgresql"):
        assert store_point.attributes["db.collection.name"] == store.table_name  # type: ignore[attr-defined]


async def test_replay_is_one_claim_round_trip_and_no_callback(store: Store, otel: Otel) -> None:
    manager = manager_of(store, otel)
    await manager.execute(PAYLOAD, lambda: run(1), timeout=5)
    assert await manager.execute(PAYLOAD, lambda: run(2), timeout=5) == 1

    _, replay = otel.calls()
    assert replay.attributes is not None
    assert replay.attributes["idempotency.outcome"] == "replayed"
    assert "idempotency.callback.duration" not in replay.attributes
    assert store_events(replay) == [("claim", "completed")]
    assert otel.count("idempotency.calls", idempotency_outcome="replayed") == 1
    assert otel.count("idempotency.callback.duration") == 1  # the first call's only


async def test_in_progress_rejection_from_another_manager(store: Store, otel: Otel) -> None:
    holder = manager_of(store, otel)
    release = asyncio.Event()
    task = await start_holding(holder, PAYLOAD, until=release, result=1)
    other = manager_of(store, otel)
    with pytest.raises(errors.AlreadyInProgressError):
        await other.execute(PAYLOAD, lambda: run(2), timeout=5)
    release.set()
    await task

    rejected = next(
        s
        for s in otel.calls()
        if s.attributes["idempotency.outcome"] == "rejected_in_progress"  # type: ignore[index]
    )
    assert rejected.attributes is not None
    # An answer to the caller (HTTP 409), not a failure: no ERROR status, no exception.
    assert "error.type" not in rejected.attributes
    assert rejected.status.status_code is StatusCode.UNSET
    assert "exception" not in [e.name for e in rejected.events]
    assert store_events(rejected) == [("claim", "in_progress")]
    assert (
        otel.count(
            "idempotency.calls",
            idempotency_outcome="rejected_in_progress",
        )
        == 1
    )
    assert otel.count("idempotency.calls", idempotency_outcome="claimed") == 1


async def test_waiting_on_another_manager_records_the_wait(store: Store, otel: Otel) -> None:
    holder = manager_of(store, otel)
    task = await start_holding(holder, PAYLOAD, seconds=1.0, result=1)
    waiter = manager_of(store, otel, wait=Wait(timeout=5))
    assert await waiter.execute(PAYLOAD, lambda: run(2), timeout=5) == 1
    await task

    waited = next(s for s in otel.calls() if s.attributes["idempotency.outcome"] == "replayed")  # type: ignore[index]
    assert waited.attributes is not None
    assert waited.attributes["idempotency.wait.duration"] >= 0.1  # type: ignore[operator]
    operations = [operation for operation, _ in store_events(waited)]
    assert operations[0] == "claim" and set(operations[1:]) == {"get"}
    assert otel.count("idempotency.wait.duration", idempotency_outcome="replayed") == 1


async def test_joined_duplicate_in_the_same_process(otel: Otel) -> None:
    manager = manager_of(MemoryStore(), otel, wait=Wait())
    task = await start_holding(manager, PAYLOAD, seconds=0.1, result=1)
    assert await manager.execute(PAYLOAD, lambda: run(2), timeout=5) == 1
    await task

    joined = next(s for s in otel.calls() if s.attributes["idempotency.outcome"] == "joined")  # type: ignore[index]
    assert joined.attributes is not None
    assert joined.attributes["idempotency.wait.duration"] > 0  # type: ignore[operator]
    assert store_events(joined) == []  # it waited on its neighbour, not on the store
    assert otel.count("idempotency.wait.duration", idempotency_outcome="joined") == 1


async def test_failure_releases_and_records_the_error(store: Store, otel: Otel) -> None:
    manager = manager_of(store, otel)

    async def boom() -> None:
        raise ValueError("card declined")

    with pytest.raises(ValueError):
        await manager.execute(PAYLOAD, boom, timeout=5)

    span = otel.only_call()
    assert span.attributes is not None
    assert span.attributes["idempotency.outcome"] == "failed"
    assert span.attributes["error.type"] == "ValueError"
    assert span.status.status_code is StatusCode.ERROR
    assert store_events(span) == [("claim", "claimed"), ("release", "released")]
    assert "exception" in [e.name for e in span.events]
    assert otel.count("idempotency.calls", idempotency_outcome="failed", error_type="ValueError")
    assert otel.count("idempotency.callback.duration", idempotency_outcome="failed") == 1


async def test_store_failure_is_an_error_with_the_store_error_type(otel: Otel) -> None:
    store = RecordingStore(
        MemoryStore(), fail_on={"claim": errors.StoreUnavailableError("down (injected)")}
    )
    manager = manager_of(store, otel)
    with pytest.raises(errors.StoreUnavailableError):
        await manager.execute(PAYLOAD, lambda: run(1), timeout=5)

    span = otel.only_call()
    assert span.attributes is not None
    assert span.attributes["idempotency.outcome"] == "error"
    claim = next(e for e in span.events if e.name == "idempotency.store.claim")
    assert claim.attributes is not None
    assert claim.attributes["error.type"] == "idempotency_async.errors.StoreUnavailableError"
    assert otel.count(
        "idempotency.store.duration",
        db_operation="claim",
        error_type="idempotency_async.errors.StoreUnavailableError",
    )


async def test_cutoff(store: Store, otel: Otel) -> None:
    manager = manager_of(store, otel, completion_reserve=0.1)

    async def slow() -> None:
        await asyncio.sleep(5)

    # Cut off at 0.4 s; the callback starts after the claim's round trip, so its duration
    # is 0.4 s less that round trip (up to 0.3 s on a slow machine keeps it above 0.1 s).
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute(PAYLOAD, slow, timeout=0.5)

    span = otel.only_call()
    assert span.attributes is not None
    assert span.attributes["idempotency.outcome"] == "cut_off"
    assert span.attributes["error.type"] == "idempotency_async.errors.DeadlineExceededError"
    assert 0.1 <= span.attributes["idempotency.callback.duration"] < 1  # type: ignore[operator]
    assert store_events(span) == [("claim", "claimed")]  # a cutoff writes nothing
    assert otel.count("idempotency.calls", idempotency_outcome="cut_off") == 1


async def test_lease_lost(otel: Otel) -> None:
    store = MemoryStore()
    manager = manager_of(store, otel)
    other = manager_of(store, otel)

    async def overtaken() -> int:
        await other.force_release(manager.key_for(PAYLOAD) or "")
        await other.execute(PAYLOAD, lambda: run(2), timeout=5)
        return 1

    with pytest.raises(errors.LeaseLostError):
        await manager.execute(PAYLOAD, overtaken, timeout=5)

    outcomes = sorted(s.attributes["idempotency.outcome"] for s in otel.calls())  # type: ignore[index]
    assert outcomes == ["claimed", "lease_lost"]
    lost = next(s for s in otel.calls() if s.attributes["idempotency.outcome"] == "lease_lost")  # type: ignore[index]
    inner = next(s for s in otel.calls() if s is not lost)
    # The call made from inside the callback nests under the call span.
    assert inner.parent is not None and inner.parent.span_id == lost.context.span_id
    assert ("complete", "nothing") in store_events(lost)


async def test_cache_hit_and_unprotected_calls(otel: Otel) -> None:
    manager = manager_of(MemoryStore(), otel, local_cache=LocalCache(), event_key_jmespath="order")
    await manager.execute(PAYLOAD, lambda: run(1), timeout=5)
    assert await manager.execute(PAYLOAD, lambda: run(2), timeout=5) == 1
    assert await manager.execute({"no": "order"}, lambda: run(3), timeout=5) == 3

    outcomes = [s.attributes["idempotency.outcome"] for s in otel.calls()]  # type: ignore[index]
    assert outcomes == ["claimed", "cache_hit", "unprotected"]
    assert store_events(otel.calls()[1]) == []


async def test_callback_spans_nest_under_the_call_span_under_the_caller(otel: Otel) -> None:
    manager = manager_of(MemoryStore(), otel)
    tracer = otel.tracer_provider.get_tracer("test")

    async def charge() -> int:
        with tracer.start_as_current_span("charge card"):
            return 1

    with tracer.start_as_current_span("POST /orders") as server:
        await manager.execute(PAYLOAD, charge, timeout=5)

    spans = {s.name: s for s in otel.spans.get_finished_spans()}
    call = spans["idempotency orders"]
    assert call.parent is not None and call.parent.span_id == server.get_span_context().span_id
    charge_span = spans["charge card"]
    assert charge_span.parent is not None and charge_span.parent.span_id == call.context.span_id


async def test_metric_attributes_never_carry_the_key(otel: Otel) -> None:
    manager = manager_of(MemoryStore(), otel)
    for n in range(3):
        await manager.execute({"order": n}, lambda: run(1), timeout=5)
    for metric in (
        "idempotency.calls",
        "idempotency.callback.duration",
        "idempotency.store.duration",
    ):
        points = otel.points(metric)
        assert points
        for point in points:
            assert "idempotency.key" not in point.attributes
            assert not any("#" in str(value) for value in point.attributes.values())
    assert otel.count("idempotency.calls") == 3
    assert len(otel.points("idempotency.calls")) == 1  # one series for three keys


async def test_on_event_hook_still_sees_every_event(otel: Otel) -> None:
    seen: list[str] = []
    manager = manager_of(MemoryStore(), otel, on_event=lambda event: seen.append(event.kind))

    async def boom() -> None:
        raise ValueError("declined")

    with pytest.raises(ValueError):
        await manager.execute(PAYLOAD, boom, timeout=5)
    await manager.execute(PAYLOAD, lambda: run(1), timeout=5)
    await manager.execute(PAYLOAD, lambda: run(1), timeout=5)
    assert seen == ["claimed", "released", "claimed", "completed", "replayed"]
    span_events = [
        [e.name for e in s.events if not e.name.startswith("idempotency.store.")]
        for s in otel.calls()
    ]
    # Span events: the lifecycle events the outcome does not tell.
    assert span_events == [["idempotency.released", "exception"], [], []]


async def test_without_providers_nothing_is_observed_and_calls_work() -> None:
    telemetry = Telemetry()  # the API's global no-op providers: none set in tests
    store = MemoryStore()
    manager = Manager(store, Options(telemetry=telemetry))
    assert await manager.execute(PAYLOAD, lambda: run(1), timeout=5) == 1
    assert await manager.execute(PAYLOAD, lambda: run(2), timeout=5) == 1
    assert not telemetry.active()
    # No method swap: execute is the class's own function with telemetry as without, and
    # it hands back a coroutine either way (marked a coroutine function where Python can).
    assert manager.execute.__func__ is Manager.execute
    coroutines = [
        manager.execute(PAYLOAD, lambda: run(3)),
        Manager(store).execute(PAYLOAD, lambda: run(3)),
    ]
    assert all(inspect.iscoroutine(c) for c in coroutines)
    assert [await c for c in coroutines] == [1, 1]
    if sys.version_info >= (3, 12):
        assert inspect.iscoroutinefunction(manager.execute)
        assert inspect.iscoroutinefunction(Manager(store).execute)


def test_the_core_package_never_imports_opentelemetry() -> None:
    code = (
        "import asyncio, sys\n"
        "from idempotency_async import Manager, MemoryStore, Options\n"
        "import idempotency_async.integrations.aws_lambda, idempotency_async.integrations._http\n"
        "m = Manager(MemoryStore(), Options())\n"
        "async def cb(): return 1\n"
        "assert asyncio.run(m.execute({'a': 1}, cb)) == 1\n"
        "assert not [n for n in sys.modules if n.startswith('opentelemetry')], 'imported'\n"
        "assert type(m).execute is m.execute.__func__, 'unobserved calls take the plain path'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_telemetry_that_is_not_an_instrumentation_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="Telemetry"):
        Options(telemetry="otel")  # type: ignore[arg-type]


def test_without_the_extra_the_import_error_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if opentelemetry-api were not installed\n"
        "try:\n"
        "    import idempotency_async.otel\n"
        "except ImportError as exc:\n"
        '    assert "idempotency-async[otel]" in str(exc), exc\n'
        "else:\n"
        "    raise SystemExit('imported without the API')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_global_providers_set_after_the_manager_is_built_are_picked_up() -> None:
    # In a subprocess: the API lets a process set its global providers only once.
    code = """
import asyncio, time
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.otel import Telemetry

manager = Manager(MemoryStore(), Options(key_prefix="late", telemetry=Telemetry()))

async def one(n):
    async def work():
        return n
    return await manager.execute({"n": n}, work, timeout=5)

asyncio.run(one(1))  # no provider yet: not observed
spans = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
time.sleep(1.05)  # the providers are looked up again at most once a second
asyncio.run(one(2))
names = [s.name for s in spans.get_finished_spans()]
assert names == ["idempotency late"], names
data = reader.get_metrics_data()
calls = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
         if m.name == "idempotency.calls"]
assert [p.value for p in calls[0].data.data_points] == [1], calls
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


async def test_payload_mismatch_and_not_stored_are_outcomes_not_errors(otel: Otel) -> None:
    """What an HTTP client sees as 422 and "Response not available": answers, not failures."""
    manager = manager_of(
        MemoryStore(), otel, event_key_jmespath="order", payload_validation_jmespath="amount"
    )
    assert await manager.execute(PAYLOAD, lambda: run({1, 2}), timeout=5) == {1, 2}  # not JSON
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute(PAYLOAD, lambda: run(2), timeout=5)
    with pytest.raises(errors.PayloadValidationError):
        await manager.execute({**PAYLOAD, "amount": 11}, lambda: run(3), timeout=5)

    _, not_stored, mismatch = otel.calls()
    for span, outcome in (
        (not_stored, "replayed_not_stored"),
        (mismatch, "rejected_payload_mismatch"),
    ):
        assert span.attributes is not None
        assert span.attributes["idempotency.outcome"] == outcome
        assert "error.type" not in span.attributes
        assert span.status.status_code is StatusCode.UNSET
        assert "exception" not in [e.name for e in span.events]
        assert otel.count("idempotency.calls", idempotency_outcome=outcome) == 1
    assert not any(point.attributes.get("error.type") for point in otel.points("idempotency.calls"))
