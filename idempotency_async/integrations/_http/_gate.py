"""The point of no return of one response, and the capture of its body for the record.

Its phases (every transition is one of these arrows; any other call leaves the phase as
it is and writes nothing, except a second head, which raises)::

    AWAITING_HEAD ─start: a status not stored (5xx, 408/409/425/429: stores_status), or
        │            not the endpoint's─> PASSING (released at the end)
        └─start: a stored status─> RECORDING_HEAD  (completed before the head goes out)
                           ├─ plain: the whole body in hand ──────────────────────> ENDED
                           ├─ stream ─> STREAMING ─end─> ENDED (the body attached)
                           │               │ too large, or sent from a file
                           └─ stream with a Content-Length past the limit
                                         └──> OVERFLOWED ─end─> ENDED (not stored, and why)

    RECORDING_HEAD, STREAMING, OVERFLOWED ─the endpoint returned or raised─> ENDED

Adapters call :meth:`ResponseGate.start` with the response head *before* forwarding it,
then :meth:`~ResponseGate.write` for each body chunk of a stream and
:meth:`~ResponseGate.end` at its end (before forwarding the last chunk), and
:meth:`~ResponseGate.client_gone` when sending failed.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable
from typing import Final

from idempotency_async._call import Call
from idempotency_async.integrations._http._answers import Answer, Stage, decide, respond
from idempotency_async.integrations._http._markers import RequestState
from idempotency_async.integrations._http._responses import (
    content_length,
    stored_response,
    stores_status,
)
from idempotency_async.integrations._http._rules import HttpIdempotency

__all__ = ["Phase", "ResponseGate"]

# Written when a stream starts; a later write replaces it when the stream ends.  It stays
# only when the request was cancelled mid-stream (after which nothing may be written).
_STREAMING: Final = (
    "streamed response, not captured: it was still being sent, or was cut off before its "
    "end (the client disconnected or the request was cancelled)"
)

# The reason a body the server sent from a file is not stored: it never passed through
# the middleware, so there is nothing to keep (and no size to blame).
_FROM_FILE: Final = "sent from a file: its body never passed through the middleware"


class Phase(enum.Enum):
    """Where one response is in its lifecycle."""

    AWAITING_HEAD = "awaiting head"
    """No response head yet: the endpoint may still raise and release the key."""
    PASSING = "passing"
    """A head that is not the record's went out (a status not stored — a 5xx, 408, 409,
    425, 429 — or the endpoint did not run): the key is released when the endpoint ends."""
    RECORDING_HEAD = "recording head"
    """Past the point of no return: the head's completion is being written; the head goes
    out once it is."""
    STREAMING = "streaming"
    """Recorded as not stored and forwarded; the body is captured for a second write."""
    OVERFLOWED = "overflowed"
    """Streaming, but the body cannot be stored (:attr:`ResponseGate.overflow` says why:
    too large, or sent from a file)."""
    ENDED = "ended"
    """The record has its last write."""


# The phases in which the head went (or is going) to the client.
_FORWARDED: Final = frozenset({Phase.PASSING, Phase.STREAMING, Phase.OVERFLOWED, Phase.ENDED})
# The phases that still owe the record its last write.
_OWING: Final = frozenset({Phase.RECORDING_HEAD, Phase.STREAMING, Phase.OVERFLOWED})


class ResponseGate:
    """The point of no return of one response (see the module's phases)."""

    def __init__(
        self, rules: HttpIdempotency, state: RequestState, marked: bool, route: str = ""
    ) -> None:
        self.rules = rules
        self.state = state
        self.marked = marked
        self.redaction = rules.settings.redaction_for(route)
        """What of the response is kept out of the record (the route's redaction)."""
        self.call: Call | None = None
        """The manager's handle once the endpoint runs (None: it did not run here)."""
        self.raised: Exception | None = None
        """What the endpoint raised (its own exception, not the gate's)."""
        self.phase = Phase.AWAITING_HEAD
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.body = bytearray()
        """The streamed body captured so far (while :attr:`phase` is STREAMING)."""
        self.overflow = ""
        """Why the streamed body cannot be stored (once :attr:`phase` is OVERFLOWED)."""
        self.gone = False
        """Sending to the client failed: the reason a stream stopped early."""

    @property
    def forwarded(self) -> bool:
        """A head went (or is going) to the client: a cutoff now leaves no room for a 504."""
        return self.phase in _FORWARDED

    async def start(self, status: int, headers: list[tuple[str, str]], body: bytes | None) -> bool:
        """The response head, before it is forwarded; ``body`` is the whole body when it is
        in hand (a plain response), None for a stream.  True: the head must carry
        ``Idempotency-Response-Stored: false``."""
        if self.phase is not Phase.AWAITING_HEAD:
            raise RuntimeError(f"a second response head while {self.phase.value}")
        self.status, self.headers = status, headers
        ran = not self.marked or self.state.endpoint_ran
        if not ran or not stores_status(status, self.rules.settings.store_server_errors):
            self.phase = Phase.PASSING
            return False  # released once the endpoint ends: the callback counts as raising
        # A cutoff during the write below leaves the head unsent: room for a 504.
        self.phase = Phase.RECORDING_HEAD
        if body is not None:
            result, reason = self._stored(body)
            if result is not None:
                await self._complete(result)
            else:
                await self._complete_without(reason)
            self.phase = Phase.ENDED
            return result is None
        limit = self.rules.max_response_bytes
        declared = content_length(self.headers)
        await self._complete_without(_STREAMING)
        if declared is not None and declared > limit:
            self._overflow(
                f"too large: its Content-Length ({declared} bytes) is over the limit of {limit}"
            )
            return True
        self.phase = Phase.STREAMING
        return False

    def write(self, chunk: bytes) -> None:
        """A chunk of a streamed body, before it is forwarded (captured while STREAMING)."""
        if self.phase is not Phase.STREAMING:
            return  # nothing to capture: passing, overflowed, or no stream
        self.body += chunk
        limit = self.rules.max_response_bytes
        if len(self.body) > limit:
            self._overflow(f"too large: the streamed body grew past the limit of {limit} bytes")

    async def end(self) -> None:
        """The streamed body is complete (before its last chunk is forwarded): attach it."""
        if self.phase is Phase.STREAMING:
            self.phase = Phase.ENDED
            result, reason = self._stored(bytes(self.body))
            if result is not None:
                await self._complete(result)
            else:
                await self._complete_without(reason)
        elif self.phase is Phase.OVERFLOWED:
            self.phase = Phase.ENDED
            await self._complete_without(self.overflow)
        # AWAITING_HEAD, PASSING, RECORDING_HEAD, ENDED: no stream of the record's to end.

    def untrackable(self) -> bool:
        """The body bypasses the capture (a file the server sends by itself: ASGI
        ``pathsend``, aiohttp's ``FileResponse``).  True: the record will not get the body."""
        if self.phase is Phase.STREAMING or self.phase is Phase.OVERFLOWED:
            self._overflow(_FROM_FILE)
            return True
        return False

    def client_gone(self) -> None:
        self.gone = True

    async def endpoint_returned(self) -> bool:
        """The endpoint returned.  False: the key is to be released (no head, or one that
        is not the record's)."""
        if self.phase is Phase.AWAITING_HEAD or self.phase is Phase.PASSING:
            return False
        if self.phase in _OWING:
            self.phase = Phase.ENDED
            why = "the response stream stopped before its end"
            if self.gone:
                why = "the client disconnected before the streamed response was complete"
            await self._complete_without(why)
        return True

    async def endpoint_failed(self, exc: Exception) -> None:
        """The endpoint raised: past the point of no return, the record still completes."""
        if self.phase in _OWING:
            self.phase = Phase.ENDED
            await self._complete_without(
                f"the endpoint raised {type(exc).__name__} while streaming the response"
            )

    def _overflow(self, why: str) -> None:
        self.phase = Phase.OVERFLOWED
        self.overflow = why
        self.body = bytearray()

    def _stored(self, body: bytes) -> tuple[dict[str, object] | None, str]:
        return stored_response(
            self.status,
            self.headers,
            body,
            replay_headers=self.rules.settings.replay_headers,
            max_body_bytes=self.rules.max_response_bytes,
            max_stored_bytes=self.rules.manager.store.max_response_bytes,
            redaction=self.redaction,
        )

    async def _complete(self, result: dict[str, object]) -> None:
        if self.call is not None:
            await self._recorded(self.call.complete(result))

    async def _complete_without(self, reason: str) -> None:
        if self.call is not None:
            reason = f"HTTP {self.status}: {reason}"
            await self._recorded(self.call.complete_without_response(reason))

    async def _recorded(self, write: Awaitable[None]) -> None:
        """Await a completion write.  Its failure is answered by the one table
        (:mod:`._answers`): a failed completion is logged, never the client's answer — the
        response goes out all the same (the key may stay in progress until its lease
        ends); any other error propagates."""
        try:
            await write
        except Exception as exc:
            answer = decide(exc, Stage.FORWARDED if self.forwarded else Stage.RUNNING)
            if answer is not Answer.SENT_UNRECORDED:
                raise
            respond(answer, exc, self.rules)
