"""The run of a callback, as downstream keys see it: its key, and whether it still runs.

The manager begins a :class:`Run` where a claimed callback starts and ends it where the
callback ends (``Lifecycle.run`` in ``_lifecycle``: the run is the call's single-flight
entry); nothing else here knows the manager.  Beginning one is a context-variable set and
ending it a set back plus one attribute write: the plain path pays nothing more, whether
or not anything reads it.  Tasks the callback spawns copy the context and so see the same
``Run``; ``open`` is how they learn that the call has ended (a copied context keeps the
value after it is set back, and with it the call's single-flight entry).
"""

from __future__ import annotations

import base64
import hashlib
from contextvars import ContextVar
from typing import Final

__all__ = ["CURRENT", "NAMED", "REQUEST", "Run", "derive", "derive_in_step", "issue"]

CURRENT: Final[ContextVar[Run | None]] = ContextVar("idempotency_async.downstream", default=None)

# Domain separation: a downstream key is never the record's key, and never a hash another
# use of SHA-256 in this library (or a name a caller picks) can produce.
_DOMAIN: Final = b"idempotency-async/downstream-key/v1\x00"
NAMED: Final = b"N"
"""Kind of a key asked for by name (``downstream_key``)."""
REQUEST: Final = b"R"
"""Kind of a key a client hook derives for the n-th request to one method and URL."""
_STEP: Final = b"S"
"""Scope of a key derived inside a step (``_steps``): the step's name follows the key."""


class Run:
    """One run of a callback under a claimed key: begun at its start, ended at its end.

    A base class: the lifecycle's single-flight entry (``_flight.Flight``) is the run of
    its call, so a call in flight holds no object of its own for downstream keys — only
    the context-variable set.  A subclass provides :attr:`key`; the run's own slots are
    set by :meth:`begin`, before anything can read them (only ``CURRENT`` leads here).
    """

    __slots__ = ("_outer", "_requests", "open")

    _outer: Run | None
    _requests: _Requests | None
    open: bool
    """Whether the callback still runs (tasks it spawned keep the run after it ends)."""

    @property
    def issued(self) -> set[str] | None:
        """The keys the client hooks added to requests in this run (None: none yet)."""
        requests = self._requests
        return None if requests is None else requests.issued

    @property
    def key(self) -> str:
        """The record key the callback runs under."""
        raise NotImplementedError

    def begin(self) -> None:
        """The callback starts: hooks and ``downstream_key`` see this run from now on."""
        self.open = True
        self._requests = None
        # The run this one is nested in (an idempotent call inside a callback), restored at
        # the end.  Restoring it by value, not with the Token ``set`` returns, frees that
        # Token at once: one object less per call in flight.
        self._outer = CURRENT.get()
        CURRENT.set(self)

    def end(self) -> None:
        """The callback ended: hooks and ``downstream_key`` no longer see this run."""
        self.open = False
        CURRENT.set(self._outer)

    def number(self, request: str) -> int:
        """How many times ``request`` (a method and URL) was numbered in this run, this one
        included: 1 for the first."""
        requests = self._requests
        if requests is None:
            requests = self._requests = _Requests()
        counts = requests.counts
        count = counts.get(request, 0) + 1
        counts[request] = count
        return count


class _Requests:
    """What the client hooks note in one run (made on first use): one slot of the run for
    both, as a run is the single-flight entry of every call in flight."""

    __slots__ = ("counts", "issued")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        """Requests seen per method and URL."""
        self.issued: set[str] = set()
        """The keys added to requests."""


def issue(run: Run, key: str) -> str:
    """Note that a client hook added ``key`` to a request of ``run`` (numbered first, with
    :meth:`Run.number`); returns it."""
    requests = run._requests
    if requests is None:
        requests = run._requests = _Requests()
    requests.issued.add(key)
    return key


def derive(key: str, kind: bytes, name: str) -> str:
    """The downstream key of ``name`` under the record key ``key``: 43 base64url characters.

    SHA-256 over a domain tag, the kind, the record key's length and bytes, then the name:
    the length prefix keeps ``("a#b", "c")`` and ``("a#", "bc")`` apart.
    """
    raw = key.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(
        b"".join(
            (_DOMAIN, kind, len(raw).to_bytes(8, "big"), raw, name.encode("utf-8", "surrogatepass"))
        )
    ).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def derive_in_step(key: str, step: str, kind: bytes, name: str) -> str:
    """As :func:`derive`, inside the step ``step``: the scope kind ``S``, then the step's
    length and name, then ``kind`` and the name.  Two steps never share a key."""
    raw = step.encode("utf-8", "surrogatepass")
    return derive(key, _STEP, len(raw).to_bytes(8, "big").hex() + step + kind.decode() + name)
