"""Options: the immutable configuration a Manager snapshots at construction."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from idempotency_async._disabled import DISABLED_ENV
from idempotency_async._key_formats import KEY_FORMATS, POWERTOOLS_PYTHON
from idempotency_async._prefixes import has_explicit_prefix, js_trim
from idempotency_async._replayed import ReplayErrorsSetting, declared_errors
from idempotency_async._stored_redaction import Redaction
from idempotency_async.canonical import HASH_ALGORITHMS, Serializer
from idempotency_async.errors import ConfigError
from idempotency_async.events import EventHook
from idempotency_async.instrumentation import Instrumentation
from idempotency_async.record import JSONValue, Record
from idempotency_async.selection import Expression

if TYPE_CHECKING:
    from jmespath.functions import Functions

__all__ = [
    "DISABLED_ENV",
    "KeyFormat",
    "LocalCache",
    "Options",
    "Renewal",
    "ResponseCodec",
    "Wait",
]

# The share of a renewed short lease kept free for a renewal's round trip (see
# Options._check_renewal_fits).
_RENEWAL_ROOM = 0.1


class ResponseCodec(Protocol):
    """Turns callback results into JSON values for storage, and stored values back."""

    def encode(self, result: Any) -> JSONValue: ...

    def decode(self, stored: JSONValue) -> Any: ...


ResponseHook = Callable[[Any, Record], Any]

KeyFormat = Literal["typescript", "powertools-python"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    """Lease renewal: hold a short lease and renew it while the callback runs, so a crashed
    worker blocks its key for about ``lease`` seconds instead of its whole deadline.

    ``Options(renewal=Renewal(lease=30.0))``; ``Options(renewal=None)`` (the default) holds
    one lease, the deadline's.  The callback's own bound does not change: the deadline, else
    ``Options.lease`` (or ``expires_after``).  See ``docs/manager.md``.

    .. versionadded:: 0.1.0
    """

    lease: float
    """Seconds of each short lease, counted from when the claim (or renewal) was sent."""
    every: float | None = None
    """Seconds between renewals, counted from the claim's send (default: a third of
    ``lease``).  Each renewal is one store round trip, abandoned if unanswered when the
    next is due.  One lost renewal must be survivable: ``2 * every`` plus the completion
    reserve must fit in 90 % of ``lease``, else ``ConfigError`` (checked by ``Options``)."""

    def __post_init__(self) -> None:
        if not _positive(self.lease):
            raise ConfigError(
                f"Renewal(lease=...) must be a positive number of seconds, got {self.lease!r}"
            )
        if self.every is not None and not (_positive(self.every) and self.every < self.lease):
            raise ConfigError(
                f"Renewal(every=...) must be a positive number of seconds below its lease "
                f"({self.lease!r}), got {self.every!r}: e.g. a third of it"
            )

    @property
    def interval(self) -> float:
        """Seconds between renewals: ``every``, else a third of ``lease``."""
        return self.every or self.lease / 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """Waiting for an in-progress duplicate: instead of raising
    :class:`~idempotency_async.errors.AlreadyInProgressError`, a duplicate waits for the
    call holding its key to finish and replays its result.

    ``Options(wait=Wait(timeout=10.0))``; ``Options(wait=None)`` (the default) raises at
    once.  A wait never outlasts the caller's own deadline.

    .. versionadded:: 0.1.0
    """

    timeout: float = 10.0
    """The most seconds a duplicate waits before it raises ``AlreadyInProgressError``
    (a transactional call on Postgres: ``LockTimeoutError``)."""

    def __post_init__(self) -> None:
        if not _positive(self.timeout):
            raise ConfigError(
                f"Wait(timeout=...) must be a positive number of seconds, got {self.timeout!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalCache:
    """An in-process cache of completed results: a replay the cache holds costs no store
    round trip.  It keeps an entry for the record's remaining life as the store judged it,
    and never in-progress records.

    ``Options(local_cache=LocalCache(max_items=1000))``; ``Options(local_cache=None)`` (the
    default) asks the store every time.  Each manager owns its own cache.

    .. versionadded:: 0.1.0
    """

    max_items: int = 1000
    """The most results kept; the least recently used is dropped first."""

    def __post_init__(self) -> None:
        items = self.max_items
        if isinstance(items, bool) or not isinstance(items, int) or items < 0:
            raise ConfigError(f"LocalCache(max_items=...) must be an integer >= 0, got {items!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How a :class:`~idempotency_async.Manager` derives keys, stores results and waits.

    Validated at construction: invalid values raise :class:`~idempotency_async.errors.ConfigError`.

    A feature with settings of its own is one group, a frozen value object that is ``None``
    when the feature is off (as httpx groups ``Timeout`` and ``Limits``):
    ``renewal=Renewal(...)``, ``wait=Wait(...)``, ``local_cache=LocalCache(...)``.  How keys
    are derived stays flat, under the names aws-lambda-powertools uses
    (``event_key_jmespath``, ``payload_validation_jmespath``, ``raise_on_no_key``,
    ``key_prefix``, ``hash_function``...): those settings are read together on every call,
    are always on, and users coming from Powertools find them where they look.
    """

    key_format: KeyFormat = "typescript"
    """``"typescript"``: keys and hashes of the TypeScript port (Base64 digests of its
    canonical JSON).  ``"powertools-python"``: the keys aws-lambda-powertools (Python) 3.x
    derives (hex digests of ``json.dumps(sort_keys=True)``, per-function prefixes), to take
    over its records; see ``docs/migrate-from-powertools.md``."""
    powertools_version: str | None = None
    """With ``key_format="powertools-python"``: the Powertools 3.x release whose rules to
    follow where they changed inside 3.x (e.g. ``"3.0"``); ``None`` follows the latest."""
    key_prefix: str | None = None
    """Prefix of every key (``<prefix>#<hash>``), trimmed as TypeScript trims it.  ``None`` or
    blank: the trimmed ``AWS_LAMBDA_FUNCTION_NAME``, or ``""`` outside Lambda (keys
    ``#<hash>``, as TypeScript).  With ``key_format="powertools-python"`` it is used as
    given, as Powertools uses its ``key_prefix``."""
    event_key_jmespath: Expression | None = None
    """Selects the part of the payload that identifies the request (whole payload if None)."""
    payload_validation_jmespath: Expression | None = None
    """Selects the part that must be equal when a key is reused (no validation if None)."""
    jmespath_functions: Functions | None = None
    """Custom JMESPath functions (subclass ``selection.PowertoolsFunctions`` to keep its own)."""
    raise_on_no_key: bool = False
    """Raise ``KeyMissingError`` when the key selection is missing (default: run unprotected)."""
    strict_missing_key: bool = False
    """Also treat ``""``, ``[]`` and ``{}`` selections as missing, like the reference ports."""
    expires_after: float = 3600.0
    """Seconds a completed record is replayed for."""
    hash_function: str = "md5"
    """The digest of keys and validation hashes: ``md5``, ``sha1``, ``sha256``, ``sha384``
    or ``sha512`` (``powertools-python`` also takes ``sha224``, ``sha3_*``, ``blake2b``,
    ``blake2s``)."""
    local_cache: LocalCache | None = None
    """An in-process cache of completed results, e.g. ``LocalCache(max_items=1000)``;
    ``None``: every call asks the store."""
    lease: float | None = None
    """Lease in seconds when a call has no deadline at all (default: ``expires_after``)."""
    renewal: Renewal | None = None
    """Lease renewal, e.g. ``Renewal(lease=30.0)``: hold a short lease and renew it while the
    callback runs; ``None``: one lease, until the deadline."""
    lease_margin: float = 0.0
    """Seconds added to every lease for clock skew between workers."""
    completion_reserve: float | None = None
    """Seconds kept between the callback's cutoff and the lease end for the completion write
    (default: min(0.5 s, 20 % of the time left at the claim))."""
    wait: Wait | None = None
    """Wait for an in-progress duplicate to finish and replay its result, e.g.
    ``Wait(timeout=10.0)``; ``None``: raise ``AlreadyInProgressError`` at once."""
    integer_precision: Literal["strict", "float64"] = "strict"
    """``strict`` rejects integers beyond ±(2**53-1) in the key and validation selections;
    ``float64`` hashes them as JavaScript would (TypeScript parity; distinct ids may collide)."""
    serializer: Serializer | None = None
    """Turns non-JSON objects in the payload (pydantic models, custom classes) into JSON values."""
    serialize_key: Callable[[Any], str | bytes] | None = None
    """Replaces canonical JSON for both hashes: a deliberate custom key contract."""
    response_codec: ResponseCodec | None = None
    """Turns results into JSON values for the store and stored values back (``None``: results
    are stored as JSON as they are), e.g. :mod:`idempotency_async.codecs`."""
    response_hook: ResponseHook | None = None
    """Called as ``hook(response, record)`` on every replay; its return value is replayed."""
    redaction: Redaction | None = None
    """What of a result is kept out of the store: ``Redaction(fields=("credentials.secret",))``
    removes those members (from the ``response_codec``'s JSON value) before the store write,
    ``Redaction(never_store=True)`` stores no response at all.  The caller whose call ran
    gets its whole result; duplicates the redacted one (see ``docs/manager.md``)."""
    replay_errors: ReplayErrorsSetting | None = None
    """Errors the callback may raise that are its result (a declined card): a
    :class:`~idempotency_async.ReplayErrors`, or just a tuple of exception classes (a base
    class covers its subclasses).  Such an error completes the record instead of releasing
    it, and every duplicate gets it raised again.  Held as ``ReplayErrors`` once built.
    Refused with ``key_format="powertools-python"`` (see ``docs/manager.md``)."""
    on_event: EventHook | None = None
    """Called with a typed :class:`~idempotency_async.Event` at every step of a call
    (claimed, completed, replayed, ...); ``None``: events are only logged."""
    telemetry: Instrumentation | None = None
    """Traces and metrics for every call, e.g. :class:`idempotency_async.otel.Telemetry`
    (``pip install 'idempotency-async[otel]'``); None: nothing is observed or paid."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall clock in Unix seconds; the only one the manager and stores use."""

    def __post_init__(self) -> None:
        if not _positive(self.expires_after):
            raise ConfigError(
                f"expires_after must be a positive number of seconds, got {self.expires_after!r}"
            )
        self._check_key_format()
        self._check_replay_errors()
        self._check_groups()
        if self.lease is not None and not _positive(self.lease):
            raise ConfigError(f"lease must be a positive number of seconds, got {self.lease!r}")
        self._check_renewal()
        if not _non_negative(self.lease_margin):
            raise ConfigError(f"lease_margin must be >= 0 seconds, got {self.lease_margin!r}")
        if self.completion_reserve is not None and not _non_negative(self.completion_reserve):
            raise ConfigError(
                f"completion_reserve must be None or >= 0 seconds, got {self.completion_reserve!r}"
            )
        if self.integer_precision not in ("strict", "float64"):
            raise ConfigError(
                f"integer_precision must be 'strict' or 'float64', got {self.integer_precision!r}"
            )
        if self.telemetry is not None and not callable(getattr(self.telemetry, "bind", None)):
            raise ConfigError(
                "telemetry must be an instrumentation such as "
                "idempotency_async.otel.Telemetry(), got "
                f"{type(self.telemetry).__name__}"
            )
        if self.redaction is not None and not isinstance(self.redaction, Redaction):
            raise ConfigError(
                "redaction must be an idempotency_async.Redaction, got "
                f"{type(self.redaction).__name__}"
            )
        if self.key_prefix is not None and not isinstance(self.key_prefix, str):
            raise ConfigError(f"key_prefix must be a string, got {type(self.key_prefix).__name__}")

    def _check_replay_errors(self) -> None:
        settings = declared_errors(self.replay_errors)
        object.__setattr__(self, "replay_errors", settings)  # held as ReplayErrors
        if settings is not None and self.key_format == POWERTOOLS_PYTHON:
            raise ConfigError(
                "replay_errors cannot be used with key_format='powertools-python': its "
                "records are read by Powertools, which would replay a stored error as the "
                "function's successful return value"
            )

    def _check_groups(self) -> None:
        """Each group is one value object (validated when it was built) or None."""
        groups = (
            ("local_cache", LocalCache, "LocalCache(max_items=1000)"),
            ("renewal", Renewal, "Renewal(lease=30.0)"),
            ("wait", Wait, "Wait(timeout=10.0)"),
        )
        for name, kind, example in groups:
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(
                    f"{name} takes a {kind.__name__} or None, got {value!r}: "
                    f"e.g. Options({name}={example})"
                )

    def _check_renewal(self) -> None:
        if self.renewal is None:
            return
        if self.completion_reserve is not None and not _non_negative(self.completion_reserve):
            return  # refused below, with its own message
        self._check_renewal_fits()

    def _check_renewal_fits(self) -> None:
        """A renewal must be confirmable before the cutoff even after one was lost: the
        second renewal goes out two intervals after the claim was sent, and its answer must
        arrive before the cutoff, a reserve before the short lease ends, leaving room for a
        round trip (``_RENEWAL_ROOM`` of the short lease).  The same rule covers settings
        under which not even the first renewal could be confirmed."""
        assert self.renewal is not None
        lease, every = self.renewal.lease, self.renewal.every
        reserve = self.completion_reserve
        if _renewal_fits(lease, every, reserve):
            return
        interval = self.renewal.interval
        cut = min(reserve, lease) if reserve is not None else _default_reserve(lease)
        usable = (1 - _RENEWAL_ROOM) * lease
        what = f"renewal=Renewal(lease={lease:g}" + ("" if every is None else f", every={every:g}")
        what += ")" if reserve is None else f"), completion_reserve={reserve:g}"
        advice = []
        if usable - cut > 0:
            advice.append(f"renewal.every to at most {_down((usable - cut) / 2)} s")
        if reserve is not None and usable - 2 * interval > 0:
            advice.append(f"completion_reserve to at most {_down(usable - 2 * interval)} s")
        advice.append(f"renewal.lease to at least {_up(_shortest_lease(every, reserve))} s")
        raise ConfigError(
            f"{what} cannot survive a lost renewal: the callback is cut off "
            f"{_s(cut)} s (the completion reserve) before the short lease ends, and after "
            f"one lost renewal the next goes out two intervals ({_s(interval)} s each) after "
            f"the claim; both intervals, the reserve and a round trip "
            f"({_RENEWAL_ROOM:.0%} of renewal.lease) must fit in renewal.lease "
            f"({_s(2 * interval + cut)} s > {_s(usable)} s). Set "
            + ", ".join(advice[:-1])
            + (", or " if len(advice) > 1 else "")
            + advice[-1]
            + (" (renewal.every left out is a third of renewal.lease)" if every is not None else "")
        )

    def _check_key_format(self) -> None:
        if self.key_format not in KEY_FORMATS:
            raise ConfigError(
                f"key_format must be one of {', '.join(map(repr, KEY_FORMATS))}, "
                f"got {self.key_format!r}"
            )
        python = self.key_format == POWERTOOLS_PYTHON
        algorithms = _python_rules().HASH_ALGORITHMS_PYTHON if python else HASH_ALGORITHMS
        if self.hash_function not in algorithms:
            raise ConfigError(
                f"unknown hash_function {self.hash_function!r}: "
                f"use one of {', '.join(sorted(algorithms))}"
            )
        if not python:
            if self.powertools_version is not None:
                raise ConfigError(
                    "powertools_version applies only to key_format='powertools-python'"
                )
            return
        _python_rules().parse_version(self.powertools_version)
        # Powertools' own rules decide these; a setting that would be ignored is an error.
        if self.integer_precision != "strict":
            raise ConfigError(
                "integer_precision applies only to key_format='typescript': Powertools "
                "(Python) hashes integers exactly"
            )
        if self.strict_missing_key:
            raise ConfigError(
                "strict_missing_key applies only to key_format='typescript': with "
                "key_format='powertools-python' a key is missing exactly when Powertools "
                "says so"
            )

    def resolved_prefix(self) -> str:
        """The prefix keys use, trimmed as the TypeScript port trims it.

        With ``key_format="powertools-python"``: ``key_prefix`` as given, else Powertools'
        ``<AWS_LAMBDA_FUNCTION_NAME or "test-func">.`` — to which the decorators append the
        function's ``<module>.<qualname>``.
        """
        if self.key_format == POWERTOOLS_PYTHON:
            return self.key_prefix or _python_rules().prefix_for("")
        if self.key_prefix is not None and has_explicit_prefix(self.key_prefix, self.key_format):
            return js_trim(self.key_prefix)
        return js_trim(os.environ.get("AWS_LAMBDA_FUNCTION_NAME", ""))


def _python_rules() -> ModuleType:
    # Imported on first use: the Powertools (Python) rules cost milliseconds of a cold
    # start that users of the TypeScript key format should not pay.
    from idempotency_async import _powertools_python

    return _powertools_python


def _default_reserve(lease: float) -> float:
    # The largest reserve a renewed call takes by default: min(0.5 s, 20 % of its lease).
    return min(0.5, 0.2 * lease)


def _renewal_fits(lease: float, every: float | None, reserve: float | None) -> bool:
    interval = every or lease / 3
    cut = min(reserve, lease) if reserve is not None else _default_reserve(lease)
    # (A microsecond of slack: settings exactly at the bound, as the advice gives, fit.)
    return 2 * interval + cut <= (1 - _RENEWAL_ROOM) * lease + 1e-6


def _shortest_lease(every: float | None, reserve: float | None) -> float:
    """The shortest ``Renewal.lease`` that fits ``every`` and ``reserve`` (None: defaults)."""
    usable = 1 - _RENEWAL_ROOM
    if every is None:  # lease / 3; with the default reserve every lease fits
        return 0.0 if reserve is None else reserve / (usable - 2 / 3)
    if reserve is not None:
        return (2 * every + reserve) / usable
    shorter = 2 * every / (usable - 0.2)  # while 20 % of it is under 0.5 s
    return shorter if 0.2 * shorter <= 0.5 else (2 * every + 0.5) / usable


def _s(seconds: float) -> str:
    return f"{round(seconds, 3):g}"


def _down(seconds: float) -> str:
    """``seconds`` rounded down to the millisecond, for advice that must satisfy a bound."""
    return f"{math.floor(seconds * 1000 + 1e-6) / 1000:g}"


def _up(seconds: float) -> str:
    return f"{math.ceil(seconds * 1000 - 1e-6) / 1000:g}"


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > 0
        and value == value
        and value != float("inf")
    )


def _non_negative(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
    )
