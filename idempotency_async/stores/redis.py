"""A Redis / Valkey record store on an asyncio client (redis-py ≥ 5 or valkey-py).

Each operation is one Lua script touching one key (``EVALSHA``, reloaded transparently
when the server lost it), so the store works the same on a single server, a Sentinel
master and a Redis Cluster.  Records are the JSON text the TypeScript port's Redis layer
writes or, with ``record_format="powertools-python"``, the one aws-lambda-powertools
(Python)'s writes, plus an ``owner`` token that fences completion and release.  See
``docs/redis.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final, Literal, Self

from idempotency_async._redact import redact, redact_url, secrets_in
from idempotency_async.errors import (
    ConfigError,
    InconsistentStateError,
    StoreUnavailableError,
)
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores import _redis_scripts as scripts
from idempotency_async.stores._closed import closed_error
from idempotency_async.stores._record_formats import (
    POWERTOOLS_PYTHON,
    RecordFormat,
    check_record_format,
)
from idempotency_async.stores._redis_errors import (
    is_client_defect,
    is_no_script,
    translate_errors,
    translated,
)
from idempotency_async.stores._redis_gate import Gate
from idempotency_async.stores._redis_records import (
    claim_tail,
    completion_tail,
    decode_record,
    python_data,
)
from idempotency_async.stores._redis_wakeups import Wakeups, sleeping
from idempotency_async.stores.base import (
    CLAIMED,
    DEFAULT_MAX_RESPONSE_BYTES,
    Extended,
    Found,
    Stepped,
    StepWrite,
    Verdict,
    Watch,
    Written,
    judge,
)

__all__ = ["RedisStore"]

logger = logging.getLogger("idempotency_async.redis")

_SCHEMES: Final = ("redis://", "rediss://", "unix://")
_IN_PROGRESS: Final = 2
_COMPLETED: Final = 3
_TAKEOVER: Final = 4
_RESUMABLE: Final = 5
_RESUMED: Final = 6  # claimed, keeping the record's steps: the answer carries the record
# The extend script's answers.
_EXTENDED: Final = {1: Extended.RENEWED, 2: Extended.ALREADY_LATER, 0: Extended.LOST}
# Powertools (Python) takes over an orphaned record only while it holds "<key>:lock"
# (SET NX, never deleted, min(10 s, TTL)); our takeovers of a lapsed record take it too.
_LOCK_SUFFIX: Final = ":lock"
_LOCK_SECONDS: Final = 10
# Times a command failed by a client defect (not a Redis error) is sent again after the
# cluster client reloads its slot map (see _eval_again).
_RESENDS: Final = 2


_UNGATED: Final = contextlib.nullcontext()


class _Script:
    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


_CLAIM: Final = _Script(scripts.CLAIM)
_COMPLETE: Final = _Script(scripts.COMPLETE)
_RELEASE: Final = _Script(scripts.RELEASE)
_EXTEND: Final = _Script(scripts.EXTEND)
_GET: Final = _Script(scripts.GET)
_FORCE_RELEASE: Final = _Script(scripts.FORCE_RELEASE)
_RELEASE_EXACTLY: Final = _Script(scripts.RELEASE_EXACTLY)
_STEP: Final = _Script(scripts.STEP)
_SCRIPTS: Final = (
    _CLAIM,
    _COMPLETE,
    _RELEASE,
    _EXTEND,
    _GET,
    _FORCE_RELEASE,
    _RELEASE_EXACTLY,
    _STEP,
)
# A released record's lease end (milliseconds) when the client's clock judges: the store
# has no clock of its own then (the manager's may be simulated), so long past on any
# clock, as MemoryStore's.  The server's clock judging: its TIME less one millisecond.
_RELEASED_MS: Final = b"1000"
_NEVER: Final = 2**63  # the expiry of a record without one, as _redis_records reads it
# A replay's verdict: every field, in order, to tuple's constructor (NamedTuple's own
# __new__ is Python), and Found's member read once (through its class it costs more).
_new_verdict: Final = tuple.__new__
_FOUND_COMPLETED: Final = Found.COMPLETED


class RedisStore:
    """Keeps idempotency records in Redis or Valkey, one string key per record.

    ``client`` is a ready asyncio client that the caller opens and closes:
    ``redis.asyncio.Redis``, ``redis.asyncio.RedisCluster``, a Sentinel master
    (``Sentinel.master_for(...)``) or ``valkey.asyncio.Valkey``.  :meth:`from_url` builds
    a client that the store owns and closes in :meth:`aclose`.

    ``judged_by="server"`` (the default) judges leases and expiry by the server's ``TIME``, so
    workers with skewed clocks agree; ``judged_by="client"`` uses the ``now`` the manager
    sends (for simulated time).  ``key_prefix`` is prepended to every Redis key (the
    record keeps its logical key).  ``min_replicas`` makes each claim wait (up to
    ``replica_timeout`` seconds) until that many replicas hold it, in the same round trip;
    a claim fewer replicas acknowledged raises ``StoreUnavailableError`` and its callback
    does not run.

    A completion or release publishes on the key's channel (``PUBLISH``, in the same
    script; not on a cluster), and with ``wake_waiters=True`` (the default) duplicates
    waiting on a key in progress (``Options(wait=Wait(...))``) are woken by it: one pub/sub
    connection per store, taken from the client's pool on the first wait and closed by
    :meth:`aclose`; polling stays underneath (``docs/redis.md``).

    It records steps (recovery points,
    :class:`~idempotency_async.stores.base.RecordsSteps`): the step list rides on the
    in-progress record as one JSON string beside its count, kept by claims that resume it,
    renewals and releases, dropped by the completion (``docs/redis.md``).

    ``record_format="powertools-python"`` reads and writes the records of
    aws-lambda-powertools (Python)'s Redis layer: the response is JSON text in ``data``,
    and taking over a lapsed record first takes Powertools' ``<key>:lock``.  Use it with
    ``Options(key_format="powertools-python")`` (``docs/migrate-from-powertools.md``).
    """

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "",
        judged_by: Literal["server", "client"] = "server",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        record_format: RecordFormat = "typescript",
        wake_waiters: bool = True,
    ) -> None:
        if client is None or not callable(getattr(client, "evalsha", None)):
            raise ConfigError(
                "RedisStore needs an asyncio Redis client (redis.asyncio.Redis, RedisCluster, "
                f"a Sentinel master or valkey.asyncio.Valkey), got {client!r}; or use "
                "RedisStore.from_url('redis://…')"
            )
        if judged_by not in ("server", "client"):
            raise ConfigError(f"judged_by must be 'server' or 'client', got {judged_by!r}")
        if not isinstance(key_prefix, str):
            raise ConfigError(f"key_prefix must be a string, got {key_prefix!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int):
            raise ConfigError(f"max_response_bytes must be an integer, got {max_response_bytes!r}")
        if max_response_bytes <= 0:
            raise ConfigError(f"max_response_bytes must be positive, got {max_response_bytes}")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
            raise ConfigError(f"min_replicas must be an integer >= 0, got {min_replicas!r}")
        if min_replicas < 0:
            raise ConfigError(f"min_replicas must be an integer >= 0, got {min_replicas}")
        if not replica_timeout > 0:
            raise ConfigError(f"replica_timeout must be positive seconds, got {replica_timeout!r}")
        if not isinstance(wake_waiters, bool):
            raise ConfigError(f"wake_waiters must be True or False, got {wake_waiters!r}")
        if min_replicas and _is_cluster(client):
            raise ConfigError(
                "min_replicas is not supported with RedisCluster: WAIT must run on the "
                "connection that wrote the claim, which a cluster client does not expose; use "
                "a client per shard, or accept the failover risk (docs/redis.md)"
            )
        socket_timeout = _socket_timeout(client)
        if min_replicas and socket_timeout is not None and socket_timeout <= replica_timeout:
            raise ConfigError(
                f"replica_timeout ({replica_timeout} s) must be shorter than the client's "
                f"socket_timeout ({socket_timeout} s): WAIT blocks the connection for up to "
                "replica_timeout, and the client would give up on the claim's answer first"
            )
        self.record_format = check_record_format(record_format)
        """The record layout read and written: ``"typescript"`` or ``"powertools-python"``."""
        self._python = self.record_format == POWERTOOLS_PYTHON
        self.max_response_bytes = max_response_bytes
        self.key_prefix = key_prefix
        self.judged_by = judged_by
        """Whose clock judges leases and expiry: ``"server"`` or ``"client"`` (the manager's)."""
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self._client = client
        self._client_clock = judged_by == "client"
        self._ready = False
        self._gate: Gate | None = None
        self._owns_client = False
        self._closed = False
        cluster = _is_cluster(client)
        # PUBLISH on a cluster goes to every node over the cluster bus: a cost to writers.
        self._publish = b"" if cluster else b"PUBLISH"
        # The pub/sub connection comes out of the client's pool: one of one would starve it.
        limit = _pool_limit(client)
        wakes = wake_waiters and not cluster and (limit is None or limit >= 2)
        self._wakeups = Wakeups(client) if wakes else None
        self.wake_waiters = wakes
        """Whether waiters are woken by pub/sub (``wake_waiters``, off on a cluster and on
        a pool of one connection)."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        client_options: Mapping[str, Any] | None = None,
        key_prefix: str = "",
        judged_by: Literal["server", "client"] = "server",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        record_format: RecordFormat = "typescript",
        wake_waiters: bool = True,
    ) -> RedisStore:
        """A store on a redis-py client built from ``url`` (``redis://``, ``rediss://`` for
        TLS, ``unix://``), owned by the store and closed in :meth:`aclose`.

        ``cluster=True`` builds a ``RedisCluster`` (the URL names any one node);
        ``client_options`` go to the client (``max_connections``, ``socket_timeout``, …).
        No connection is made until the first operation.
        """
        check_record_format(record_format)
        if not isinstance(url, str) or not url.startswith(_SCHEMES):
            raise ConfigError(
                "a Redis URL starts with redis://, rediss:// (TLS) or unix://, got "
                f"{redact_url(url) if isinstance(url, str) else url!r}"
            )
        try:
            import redis.asyncio as redis_asyncio
        except ImportError as exc:
            raise ConfigError(
                "RedisStore.from_url needs redis-py: pip install 'idempotency-async[redis]'"
            ) from exc
        options = dict(client_options or {})
        factory = redis_asyncio.RedisCluster if cluster else redis_asyncio.Redis
        try:
            client = factory.from_url(url, **options)
        except (ValueError, TypeError) as exc:
            # Services log this at start-up: never with the password.
            raise ConfigError(
                f"cannot build a Redis client from {redact_url(url)!r}: "
                f"{redact(str(exc), secrets_in(url))}"
            ) from exc
        store = cls(
            client,
            key_prefix=key_prefix,
            judged_by=judged_by,
            max_response_bytes=max_response_bytes,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            record_format=record_format,
            wake_waiters=wake_waiters,
        )
        store._owns_client = True
        return store

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.load_scripts()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop waking waiters (its task and pub/sub connection), and close the client if
        the store built it (:meth:`from_url`); a caller's client is left open.  The store
        refuses use afterwards."""
        self._closed = True
        self._ready = False
        if self._wakeups is not None:
            await self._wakeups.aclose()
        if self._owns_client:
            self._owns_client = False
            await self._client.aclose()

    async def load_scripts(self) -> None:
        """Connect and load the store's scripts now (``async with store`` does this).

        Optional: scripts load on first use anyway.  Calling it at start-up makes a wrong
        URL, password or ACL fail there rather than on the first request.
        """
        client = self._client if self._ready else await self._open()
        with translate_errors("script load", ""):
            for script in _SCRIPTS:
                await client.script_load(script.text)

    async def _open(self) -> Any:
        if self._closed:
            raise closed_error("RedisStore")
        # A RedisCluster must load its slot map before concurrent first commands (redis-py
        # fails them otherwise); initialize() is idempotent and locked.
        initialize = getattr(self._client, "initialize", None)
        if initialize is not None:
            with translate_errors("connect", ""):
                await initialize()
        limit = _pool_limit(self._client)
        if limit is not None and self._gate is None:
            # One connection of the pool is the pub/sub one while waiters are woken.
            self._gate = Gate(limit - 1 if self._wakeups else limit)
        self._ready = True
        return self._client

    async def _eval(self, operation: str, script: _Script, key: str, args: tuple[Any, ...]) -> Any:
        """Run ``script`` on the key ``key`` (logical) with ``args``; one round trip.

        One frame on the common path: the pool's gate is two integer operations when a
        connection is free, and the recovery (a lost script, a client defect, the
        translation of errors) runs only when the command failed."""
        task = asyncio.current_task()
        asked = 0 if task is None else task.cancelling()
        if not self._ready:
            await self._open()
        gate = self._gate
        if gate is not None:
            if gate.free > 0:
                gate.free -= 1
            else:
                await gate.wait()
        try:
            answer = await self._client.evalsha(script.sha, 1, self.key_prefix + key, *args)
        except Exception as exc:
            answer = await self._eval_again(operation, script, key, args, exc)
        finally:
            if gate is not None:
                if gate.waiters:
                    gate.release()
                else:
                    gate.free += 1  # Gate.release with none waiting, without its frame
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError  # one the client lost: see _raise_swallowed_cancel
        return answer

    async def _eval_again(
        self, operation: str, script: _Script, key: str, args: tuple[Any, ...], exc: Exception
    ) -> Any:
        """The rest of :meth:`_eval` once its command failed with ``exc``: the script
        reloaded and sent again when the server lost it, the command resent after a client
        defect, and what still fails raised as the library's error."""
        try:
            if is_no_script(exc):
                try:
                    return await self._reload_and_send(script, key, args)
                except Exception as again:
                    exc = again
            for _ in range(_RESENDS):
                if not is_client_defect(exc) or operation == "force release":
                    raise exc
                # redis-py's cluster client fails commands with a bare AttributeError when
                # a MOVED makes it close every connection to reload its slot map while
                # others are connecting (slots migrating).  Reload the map (under the
                # client's lock) and send the command again: every script here may be
                # resent by its owner (a claim meets its own token, a completion or a
                # release repeats).  force_release is not: a second run would report
                # nothing deleted.
                await self._reload_slots()
                try:
                    return await self._evalsha(script, key, args)
                except Exception as again:
                    exc = again
            raise exc
        except Exception as failure:
            error = translated(failure, operation, key)
            if error is failure:
                raise
            raise error from failure

    async def _evalsha(self, script: _Script, key: str, args: tuple[Any, ...]) -> Any:
        try:
            return await self._client.evalsha(script.sha, 1, self.key_prefix + key, *args)
        except Exception as exc:
            if not is_no_script(exc):
                raise
        return await self._reload_and_send(script, key, args)

    async def _reload_and_send(self, script: _Script, key: str, args: tuple[Any, ...]) -> Any:
        """A restart, a failover or SCRIPT FLUSH dropped the script: load it and retry."""
        client = self._client
        await client.script_load(script.text)
        return await client.evalsha(script.sha, 1, self.key_prefix + key, *args)

    async def _reload_slots(self) -> None:
        """A cluster client's ``initialize()`` reloads its slot map when the client marked
        it stale (and does nothing otherwise); other clients have no map."""
        initialize = getattr(self._client, "initialize", None)
        if initialize is not None:
            await initialize()

    # -- Store protocol -------------------------------------------------------------

    async def claim(self, claim: Claim) -> Verdict:
        key, owner = claim.key, claim.owner  # (a NamedTuple's field costs a lookup per read)
        args = (
            owner,
            repr(claim.now) if self._client_clock else b"",
            claim.lease,
            claim.ttl,
            claim_tail(owner, claim.validation),
            b"ask" if self._python else b"",
        )
        if not (self._python or self.min_replicas):
            # One command, guarded against a lost cancellation by _eval itself.
            return self._verdict(key, await self._eval("claim", _CLAIM, key, args))
        task = asyncio.current_task()
        asked = 0 if task is None else task.cancelling()
        answer = await self._claim(claim.key, args)
        if self._python and isinstance(answer, list) and answer and answer[0] == _TAKEOVER:
            answer = await self._take_over(claim, args, answer)
        _raise_swallowed_cancel(task, asked)
        return self._verdict(claim.key, answer)

    async def _take_over(self, claim: Claim, args: tuple[Any, ...], answer: list[Any]) -> Any:
        """Take Powertools' ``<key>:lock`` before replacing a lapsed record, as it does.

        Powertools replaces an orphaned record with an unconditional ``SET`` once it holds
        the lock, so holding it too keeps its takeover and ours from both running.  A held
        lock means another worker is taking over: in progress until the lock ends.
        """
        lock = self.key_prefix + claim.key + _LOCK_SUFFIX
        seconds = max(1, min(_LOCK_SECONDS, int(claim.ttl)))
        with translate_errors("claim", claim.key):
            if not self._ready:
                await self._open()
            async with self._gate or _UNGATED:
                acquired = await self._client.set(lock, "True", ex=seconds, nx=True)
        if not acquired:
            self._check_key(claim.key, answer[3] if len(answer) > 3 else None)
            return Verdict(Found.IN_PROGRESS, self._decode(claim.key, answer[1]), float(seconds))
        return await self._claim(claim.key, (*args[:-1], b"held"))

    async def _claim(self, key: str, args: tuple[Any, ...]) -> Any:
        if self.min_replicas:
            with translate_errors("claim", key):
                if not self._ready:
                    await self._open()
                async with self._gate or _UNGATED:
                    answer = await self._claim_acknowledged(self.key_prefix + key, args)
            return answer
        return await self._eval("claim", _CLAIM, key, args)

    def _verdict(self, key: str, answer: Any) -> Verdict:
        if answer == 1:
            return CLAIMED
        if not isinstance(answer, list) or len(answer) != 4:
            if isinstance(answer, Verdict):
                return answer
            raise StoreUnavailableError(
                f"the server answered a claim of key {key!r} with {answer!r:.200}, which is not "
                "the store's script answer; the callback was not run"
            )
        state, raw, now_text, answered = answer
        # The answer's own key, as _check_key reads it, without its frame when it matches.
        if type(answered) is not bytes or answered.decode("utf-8", "replace") != (
            self.key_prefix + key
        ):
            self._check_key(key, answered)
        record = self._decode(key, raw)
        if state == _COMPLETED:
            return _new_verdict(
                Verdict, (_FOUND_COMPLETED, record, None, record.expiration - float(now_text))
            )
        if state == _RESUMED and record.steps is not None:
            return Verdict(Found.CLAIMED, record)
        if state == _RESUMABLE and record.steps is not None:
            return Verdict(Found.RESUMABLE, record)
        now = float(now_text)
        if state == _IN_PROGRESS:
            end = record.expiration if record.lease_end is None else record.lease_end
            return Verdict(Found.IN_PROGRESS, record, max(end - now, 0.0))
        raise InconsistentStateError(
            f"the record of key {key!r} (status {record.status.value}) cannot be judged by "
            "the server: it was not written by this library or a Powertools port; check "
            "key_prefix, or delete it (manager.force_release or the CLI's release)"
        )

    async def get(self, key: str, *, now: float) -> Verdict:
        answer = await self._eval("get", _GET, key, (repr(now) if self._client_clock else b"",))
        if not isinstance(answer, list) or len(answer) != 3:
            raise StoreUnavailableError(
                f"the server answered a read of key {key!r} with {answer!r:.200}, which is not "
                "the store's script answer"
            )
        raw, now_text, answered = answer
        self._check_key(key, answered)
        return judge(None if raw is None else self._decode(key, raw), float(now_text))

    async def complete(self, completion: Completion) -> Written:
        key = completion.key
        encoded, reason = completion.encoded, completion.not_stored
        if encoded is not None and len(encoded) > self.max_response_bytes:
            reason = f"larger than max_response_bytes ({len(encoded)} bytes of JSON)"
            logger.warning("the response for %r is %s; stored without it", key, reason)
            encoded = None
        data = python_data(encoded) if self._python and encoded is not None else encoded
        tail = completion_tail(completion, data, reason, python=self._python)
        answer = await self._eval(
            "complete",
            _COMPLETE,
            key,
            (
                completion.owner,
                repr(completion.now) if self._client_clock else b"",
                completion.ttl,
                tail,
                b"bare" if encoded is None else b"",
                self._publish,
            ),
        )
        if answer == 0:
            return Written.NOTHING
        if answer == 1:
            return Written.WITHOUT_RESPONSE if encoded is None else Written.RESPONSE
        if answer == 2:
            return Written.RESPONSE  # the owner's response, kept: it is final
        raise StoreUnavailableError(
            f"the server answered the completion of key {key!r} with {answer!r}, which is not "
            "the store's script answer"
        )

    async def release(self, key: str, owner: str) -> bool:
        """Delete the owner's record, or write it *released* when it carries steps (no
        owner, its lease ended, steps, validation, expiry and ``PX`` kept); a released
        record counts as released.  Either way the key's waiters are woken."""
        ended = _RELEASED_MS if self._client_clock else b""
        answer = await self._eval("release", _RELEASE, key, (owner, self._publish, ended))
        return bool(answer == 1)

    async def extend(self, claim: Claim) -> Extended:
        answer = await self._eval(
            "extend",
            _EXTEND,
            claim.key,
            (
                claim.owner,
                repr(claim.now) if self._client_clock else b"",
                claim.lease,
                claim.ttl,
                claim_tail(claim.owner, claim.validation),
            ),
        )
        extended = _EXTENDED.get(answer) if isinstance(answer, int) else None
        if extended is None:
            raise StoreUnavailableError(
                f"the server answered the renewal of key {claim.key!r} with {answer!r}, which "
                "is not the store's script answer"
            )
        return extended

    async def record_step(self, write: StepWrite) -> Stepped:
        """Write ``write.steps`` on the owner's INPROGRESS record when it holds
        ``write.position`` steps, or find it already there (a resend); move the expiry
        forward, never the lease end.  One script (``STEP``)."""
        steps = write.steps.encode()
        if len(steps) > self.max_response_bytes:
            return Stepped.TOO_LARGE
        answer = await self._eval(
            "step",
            _STEP,
            write.key,
            (
                write.owner,
                repr(write.now) if self._client_clock else b"",
                write.ttl,
                write.position,
                steps,
            ),
        )
        if answer == 1:
            return Stepped.RECORDED
        if answer == 0:
            return Stepped.LOST
        raise StoreUnavailableError(
            f"the server answered the step write of key {write.key!r} with {answer!r:.200}, "
            "which is not the store's script answer"
        )

    async def force_release(self, key: str) -> Record | None:
        answer = await self._eval("force release", _FORCE_RELEASE, key, ())
        if not isinstance(answer, list) or len(answer) != 2:
            raise StoreUnavailableError(
                f"the server answered the release of key {key!r} with {answer!r:.200}, which is "
                "not the store's script answer"
            )
        raw, answered = answer
        self._check_key(key, answered)
        if raw is None:
            return None
        try:
            return self._decode(key, raw)
        except InconsistentStateError as exc:
            raise InconsistentStateError(
                f"the record was deleted, but it could not be read: {exc}"
            ) from exc.__cause__

    def watch(self, key: str) -> AbstractContextManager[Watch]:
        """Wake-ups of ``key`` while the context is entered (the waiting loop's, see
        :class:`~idempotency_async.stores.base.Wakes`): woken by the key's completion or
        release, from this store's one pub/sub subscription."""
        if self._wakeups is None:
            return sleeping()  # the waiter polls
        return self._wakeups.watch(self.key_prefix + key)

    async def release_exactly(self, record: Record) -> bool:
        """Delete the record of ``record.key`` only if it is still ``record``: the same
        owner, status, expiry, lease end and steps (what ``idempotency-async release``
        showed the operator).  False, deleting nothing, when the key holds another record or none.
        One atomic script."""
        expiration = "" if record.expiration >= _NEVER else str(record.expiration)
        lease = "" if record.lease_end is None else str(round(record.lease_end * 1000))
        answer = await self._eval(
            "release exactly",
            _RELEASE_EXACTLY,
            record.key,
            (
                "=" + (record.owner or ""),
                record.status.value,
                expiration,
                lease,
                b"" if record.steps is None else b"=" + record.steps.encode(),
            ),
        )
        return bool(answer == 1)

    # -- internals ------------------------------------------------------------------

    def _check_key(self, key: str, answered: Any) -> None:
        """An answer names the Redis key it is about: one about another key (a proxy or a
        connection that mixed answers up) is never an answer about ``key``."""
        name = self.key_prefix + key
        if isinstance(answered, bytes):
            answered = answered.decode("utf-8", "replace")
        if answered != name:
            raise InconsistentStateError(
                f"the server answered a request about key {name!r} with the record of "
                f"{str(answered)[:200]!r}: a proxy or connection that mixes answers up. It was "
                "not used"
            )

    async def _claim_acknowledged(self, key: str, args: tuple[Any, ...]) -> Any:
        """The claim script and ``WAIT`` pipelined on one connection (one round trip)."""
        client = self._client
        wait_ms = max(1, round(self.replica_timeout * 1000))
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(_CLAIM.sha, 1, key, *args)
            pipe.execute_command("WAIT", self.min_replicas, wait_ms)
            answer, acknowledged = await pipe.execute(raise_on_error=False)
            if isinstance(answer, Exception):
                if attempt == 0 and is_no_script(answer):
                    await client.script_load(_CLAIM.text)
                    continue
                raise answer
            break
        short = isinstance(acknowledged, Exception) or acknowledged < self.min_replicas
        written = answer == 1 or (isinstance(answer, list) and answer[:1] == [_RESUMED])
        if written and short:
            raise StoreUnavailableError(
                f"the claim of key {key!r} was acknowledged by {acknowledged!r} replicas within "
                f"{self.replica_timeout} s, fewer than min_replicas={self.min_replicas}; the "
                "callback was not run and the key stays claimed until its lease ends"
            )
        return answer

    def _decode(self, key: str, raw: bytes | str) -> Record:
        if isinstance(raw, str):  # a client built with decode_responses=True
            raw = raw.encode()
        try:
            return decode_record(
                key, raw, python=self._python, max_steps_bytes=self.max_response_bytes
            )
        except (KeyError, ValueError, TypeError, RecursionError) as exc:
            # Malformed control fields (a malformed response is "not stored" instead).
            why = f"{type(exc).__name__}: {exc}"[:200]
            raise InconsistentStateError(
                f"the record of key {key!r} cannot be read ({why}): it was not written by "
                "this library or a Powertools port; check key_prefix, or delete it "
                "(manager.force_release or the CLI's release)"
            ) from exc


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "nodes_manager")


def _pool_limit(client: Any) -> int | None:
    """The size of the client's connection pool when exceeding it fails rather than waits.

    redis-py's default pool raises ``MaxConnectionsError`` on the 101st concurrent command,
    and its ``BlockingConnectionPool`` waits but slows down badly with hundreds of waiters;
    the store queues its own commands at the pool's size instead.
    """
    pool = getattr(client, "connection_pool", None)
    limit = getattr(pool, "max_connections", None)
    names = {cls.__name__ for cls in type(pool).__mro__}
    if "ConnectionPool" not in names or "BlockingConnectionPool" in names:
        return None
    return limit if isinstance(limit, int) and 0 < limit < 2**31 else None


def _socket_timeout(client: Any) -> float | None:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    timeout = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    return timeout if isinstance(timeout, int | float) else None


def _raise_swallowed_cancel(task: asyncio.Task[Any] | None, asked: int) -> None:
    """Raise a cancellation the client lost.  redis-py sends a command through
    ``asyncio.wait_for`` when the client has a ``socket_timeout``, and on Python 3.11 a
    cancellation that arrives as the send finishes is swallowed there: the command goes on
    and answers, and the cancelled call would carry on to run its callback.  The task still
    counts the request (``cancelling()``), so a rise while the command ran is that loss."""
    if task is not None and task.cancelling() > asked:
        raise asyncio.CancelledError
