"""The requests a call sends, and what MemoryStore answers, are whole: the hot path builds
its claim, completion and encoded response, and MemoryStore its records and verdicts, with
the tuple constructor (no Python-level ``__new__``), which fills no default.  A field added
to one of these without the hot path passing it would make a short tuple; these tests
catch it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from support import RecordingStore

from idempotency_async import Manager, MemoryStore, Options, Wait
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Found, Verdict, Written


@dataclass
class CompletionsSeen(RecordingStore):
    """A recording store that also keeps each completion it is sent."""

    completions: list[Completion] = field(default_factory=list)

    async def complete(self, completion: Completion) -> Written:
        self.completions.append(completion)
        return await super().complete(completion)


def whole(request: Claim | Completion | Record | Verdict) -> bool:
    """Every field is there, each where its name says."""
    kind = type(request)
    return len(request) == len(kind._fields) and request == kind(**request._asdict())


async def test_claim_and_completion_carry_every_field() -> None:
    store = CompletionsSeen(MemoryStore())
    manager = Manager(
        store,
        Options(key_prefix="t", payload_validation_jmespath="amount", wait=Wait(timeout=3)),
    )

    async def work() -> dict[str, int]:
        return {"ok": 1}

    assert await manager.execute({"id": 1, "amount": 5}, work, timeout=10) == {"ok": 1}
    (claim,) = store.claims
    (completion,) = store.completions
    assert whole(claim) and whole(completion)
    keys = manager._keys.derive({"id": 1, "amount": 5})
    assert keys is not None and keys.validation is not None
    assert (claim.key, claim.validation, claim.wait) == (keys.key, keys.validation, 3)
    assert claim.ttl == manager.options.expires_after and 0 < claim.lease <= 10
    assert (completion.key, completion.owner, completion.validation) == (
        keys.key,
        claim.owner,
        keys.validation,
    )
    assert completion.encoded == b'{"ok":1}' and completion.response == {"ok": 1}
    assert completion.not_stored is None and math.isclose(completion.ttl, claim.ttl)


async def test_memory_store_reads_back_whole_records_and_verdicts() -> None:
    # MemoryStore builds the records it reads back, and judge its verdicts, the same way.
    store = MemoryStore()
    manager = Manager(store, Options(key_prefix="t"))

    async def work() -> list[int]:
        return [1]

    await manager.execute({"id": 2}, work, timeout=10)
    key = manager.key_for({"id": 2})
    assert key is not None
    verdict = await store.get(key, now=time.time())
    assert verdict.found is Found.COMPLETED and verdict.record is not None
    assert whole(verdict) and whole(verdict.record)
    assert verdict.record.response == [1] and verdict.record.response_stored
