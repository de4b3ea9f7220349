"""Options: the immutable configuration a Manager snapshots at construction."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from idempotency_async._key_formats import KEY_FORMATS, POWERTOOLS_PYTHON
from idempotency_async._prefixes import has_explicit_prefix, js_trim
from idempotency_async._replayed import ReplayErrorsSetting, declared_errors
from idempotency_async.canonical import HASH_ALGORITHMS, Serializer
from idempotency_async.errors import ConfigError
from idempotency_async.events import EventHook
from idempotency_async.instrumentation import Instrumentation
from idempotency_async.record import JSONValue, Record
from idempotency_async.selection import Expression

if TYPE_CHECKING:
    from jmespath.functions import Functions

__all__ = ["DISABLED_ENV", "KeyFormat", "Options", "ResponseCodec", "disabled_by_environment"]

DISABLED_ENV = "POWERTOOLS_IDEMPOTENCY_DISABLED"
_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})
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
class Options:
    """How a :class:`~idempotency_async.Manager` derives keys, stores results and waits.

    Validated at construction: invalid values raise :class:`~idempotency_async.errors.ConfigError`.
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
    use_local_cache: bool = False
    local_cache_max_items: int = 1000
    lease: float | None = None
    """Lease in seconds when a call has no deadline at all (default: ``expires_after``)."""
    renew_lease: float | None = None
    """Lease renewal (off by default): the claim holds a lease of this many seconds, renewed
    every ``renew_every`` seconds while the callback runs, so a crashed worker blocks its key
    for about this long instead of its whole deadline.  The callback's own bound does not
    change: the deadline, else ``lease`` (or ``expires_after``).  See ``docs/manager.md``."""
    renew_every: float | None = None
    """Seconds between renewals, counted from the claim's send (default: a third of
    ``renew_lease``).  Each renewal is one store round trip, abandoned if unanswered when
    the next is due.  One lost renewal must be survivable: ``2 * renew_every`` plus the
    completion reserve must fit in 90 % of ``renew_lease``, else ``ConfigError``."""
    lease_margin: float = 0.0
    """Seconds added to every lease for clock skew between workers."""
    completion_reserve: float | None = None
    """Seconds kept between the callback's cutoff and the lease end for the completion write
    (default: min(0.5 s, 20 % of the time left at the claim))."""
    wait: bool = False
    """Wait for an in-progress duplicate to finish and replay its result, instead of raising."""
    wait_timeout: float = 10.0
    integer_precision: Literal["strict", "float64"] = "strict"
    """``strict`` rejects integers beyond ±(2**53-1) in the key and validation selections;
    ``float64`` hashes them as JavaScript would (TypeScript parity; distinct ids may collide)."""
    serializer: Serializer | None = None
    """Turns non-JSON objects in the payload (pydantic models, custom classes) into JSON values."""
    serialize_key: Callable[[Any], str | bytes] | None = None
    """Replaces canonical JSON for both hashes: a deliberate custom key contract."""
    response_codec: ResponseCodec | None = None
    response_hook: ResponseHook | None = None
    """Called as ``hook(response, record)`` on every replay; its return value is replayed."""
    replay_errors: ReplayErrorsSetting | None = None
    """Errors the callback may raise that are its result (a declined card): a
    :class:`~idempotency_async.ReplayErrors`, or just a tuple of exception classes (a base
    class covers its subclasses).  Such an error completes the record instead of releasing
    it, and every duplicate gets it raised again.  Held as ``ReplayErrors`` once built.
    Refused with ``key_format="powertools-python"`` (see ``docs/manager.md``)."""
    on_event: EventHook | None = None
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
        if (
            isinstance(self.local_cache_max_items, bool)
            or not isinstance(self.local_cache_max_items, int)
            or self.local_cache_max_items < 0
        ):
            raise ConfigError(
                f"local_cache_max_items must be an integer >= 0, got {self.local_cache_max_items!r}"
            )
        if self.lease is not None and not _positive(self.lease):
            raise ConfigError(f"lease must be a positive number of seconds, got {self.lease!r}")
        self._check_renewal()
        if not _non_negative(self.lease_margin):
            raise ConfigError(f"lease_margin must be >= 0 seconds, got {self.lease_margin!r}")
        if self.completion_reserve is not None and not _non_negative(self.completion_reserve):
            raise ConfigError(
                f"completion_reserve must be None or >= 0 seconds, got {self.completion_reserve!r}"
            )
        if not _positive(self.wait_timeout):
            raise ConfigError(
                f"wait_timeout must be a positive number of seconds, got {self.wait_timeout!r}"
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

    def _check_renewal(self) -> None:
        if self.renew_lease is None:
            if self.renew_every is not None:
                raise ConfigError(
                    "renew_every needs renew_lease: set Options(renew_lease=30.0) to renew "
                    "a short lease while the callback runs"
                )
            return
        if not _positive(self.renew_lease):
            raise ConfigError(
                f"renew_lease must be a positive number of seconds, got {self.renew_lease!r}"
            )
        if self.renew_every is not None and not (
            _positive(self.renew_every) and self.renew_every < self.renew_lease
        ):
            raise ConfigError(
                f"renew_every must be a positive number of seconds below renew_lease "
                f"({self.renew_lease!r}), got {self.renew_every!r}: e.g. a third of it"
            )
        if self.completion_reserve is not None and not _non_negative(self.completion_reserve):
            return  # refused below, with its own message
        self._check_renewal_fits()

    def _check_renewal_fits(self) -> None:
        """A renewal must be confirmable before the cutoff even after one was lost: the
        second renewal goes out two intervals after the claim was sent, and its answer must
        arrive before the cutoff, a reserve before the short lease ends, leaving room for a
        round trip (``_RENEWAL_ROOM`` of the short lease).  The same rule covers settings
        under which not even the first renewal could be confirmed."""
        lease = self.renew_lease
        assert lease is not None
        every, reserve = self.renew_every, self.completion_reserve
        if _renewal_fits(lease, every, reserve):
            return
        interval = every or lease / 3
        cut = min(reserve, lease) if reserve is not None else _default_reserve(lease)
        usable = (1 - _RENEWAL_ROOM) * lease
        what = [f"renew_lease={lease:g}"]
        what += [] if every is None else [f"renew_every={every:g}"]
        what += [] if reserve is None else [f"completion_reserve={reserve:g}"]
        advice = []
        if usable - cut > 0:
            advice.append(f"renew_every to at most {_down((usable - cut) / 2)} s")
        if reserve is not None and usable - 2 * interval > 0:
            advice.append(f"completion_reserve to at most {_down(usable - 2 * interval)} s")
        advice.append(f"renew_lease to at least {_up(_shortest_lease(every, reserve))} s")
        raise ConfigError(
            f"{', '.join(what)} cannot survive a lost renewal: the callback is cut off "
            f"{_s(cut)} s (the completion reserve) before the short lease ends, and after "
            f"one lost renewal the next goes out two intervals ({_s(interval)} s each) after "
            f"the claim; both intervals, the reserve and a round trip "
            f"({_RENEWAL_ROOM:.0%} of renew_lease) must fit in renew_lease "
            f"({_s(2 * interval + cut)} s > {_s(usable)} s). Set "
            + ", ".join(advice[:-1])
            + (", or " if len(advice) > 1 else "")
            + advice[-1]
            + (" (renew_every left out is a third of renew_lease)" if every is not None else "")
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


def disabled_by_environment() -> bool:
    return os.environ.get(DISABLED_ENV, "").strip().lower() in _TRUE_WORDS


def _default_reserve(lease: float) -> float:
    # The largest reserve a renewed call takes by default: min(0.5 s, 20 % of its lease).
    return min(0.5, 0.2 * lease)


def _renewal_fits(lease: float, every: float | None, reserve: float | None) -> bool:
    interval = every or lease / 3
    cut = min(reserve, lease) if reserve is not None else _default_reserve(lease)
    # (A microsecond of slack: settings exactly at the bound, as the advice gives, fit.)
    return 2 * interval + cut <= (1 - _RENEWAL_ROOM) * lease + 1e-6


def _shortest_lease(every: float | None, reserve: float | None) -> float:
    """The shortest ``renew_lease`` that fits ``every`` and ``reserve`` (None: defaults)."""
    usable = 1 - _RENEWAL_ROOM
    if every is None:  # renew_lease / 3; with the default reserve every lease fits
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
