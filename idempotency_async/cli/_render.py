"""How records read on a terminal and in ``--json``: states, local times, "in 4 min"."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
from typing import Any, Final

from idempotency_async.cli._progress import progress_of, released, steps_json, steps_lines
from idempotency_async.cli._terminal import printable
from idempotency_async.record import Record, Status

__all__ = [
    "ROW_HEADER",
    "local_time",
    "record_json",
    "record_lines",
    "record_row",
    "relative",
    "state_of",
]

_LINE_BREAK: Final = re.compile(r"\r?\n")
# DynamoDB records without an expiration never expire (the store reads them as 2**63).
_NEVER: Final = 2**62

_EXPLANATIONS: Final = {
    "in_progress": "duplicates are refused (HTTP 409) until the lease ends",
    "lapsed": "the lease ended (the call crashed or ran out of time): the next call runs again",
    "lapsed_steps": (
        "the lease ended while the call held recorded steps (it crashed or ran out of "
        "time; its owner is still on the record): the next call with the same payload "
        "resumes after them"
    ),
    "released": (
        "a call failed after recording steps and gave the key back with its progress kept "
        "(no owner): the next call with the same payload resumes at once"
    ),
    "completed": "duplicates get the stored response",
    "completed_not_stored": (
        "completed without its response: duplicates get ResponseNotStoredError "
        "(HTTP: 'Response not available')"
    ),
    "expired": "counts as absent: the next call runs again (the TTL deletes the item later)",
}


def state_of(record: Record, now: float) -> str:
    """``in_progress``, ``lapsed``, ``released``, ``completed`` or ``expired``: what a claim
    at ``now`` meets (``released``: a lapsed record a failed call left with its steps)."""
    if record.is_expired(now):
        return "expired"
    if released(record, now):
        return "released"
    if record.lease_lapsed(now):
        return "lapsed"
    return "in_progress" if record.status is Status.INPROGRESS else "completed"


def local_time(instant: float) -> str:
    if instant >= _NEVER:
        return "never"
    moment = _moment(instant)
    if moment is None:
        return _beyond_the_calendar(instant)
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z")


def _moment(instant: float) -> datetime.datetime | None:
    """The local time of a Unix time, or None beyond what Python's calendar holds (years
    1-9999; a record may hold year 294276 or 4713 BC, which Postgres accepts)."""
    try:
        return datetime.datetime.fromtimestamp(instant).astimezone()
    except (OverflowError, OSError, ValueError):
        return None


def _beyond_the_calendar(instant: float) -> str:
    return f"Unix time {instant:.0f} (beyond the calendar this tool shows)"


def relative(instant: float, now: float) -> str:
    """``in 4 min``, ``12 s ago``, ``now``: an instant as a person reads it."""
    seconds = instant - now
    size = abs(seconds)
    if size < 1:
        return "now"
    if size < 90:
        text = f"{round(size)} s"
    elif size < 90 * 60:
        text = f"{round(size / 60)} min"
    elif size < 48 * 3600:
        text = f"{round(size / 3600)} h"
    else:
        text = f"{round(size / 86400)} days"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _when(instant: float, now: float) -> str:
    if instant >= _NEVER:
        return "never"
    return f"{local_time(instant)} ({relative(instant, now)})"


def _iso(instant: float | None) -> str | None:
    if instant is None or instant >= _NEVER:
        return None
    moment = _moment(instant)
    return None if moment is None else moment.isoformat(timespec="seconds")


def record_json(record: Record, now: float, *, show_response: bool = False) -> dict[str, Any]:
    """The record for scripts: Unix seconds and ISO local times side by side."""
    state = state_of(record, now)
    completed = record.status is Status.COMPLETED
    result: dict[str, Any] = {
        "key": record.key,
        "status": record.status.value,
        "state": state,
        "expiration": None if record.expiration >= _NEVER else record.expiration,
        "expires_at": _iso(record.expiration),
        "lease_end": record.lease_end,
        "lease_ends_at": _iso(record.lease_end),
        "retry_after": (
            round(max(record.lease_end - now, 0.0), 3)
            if state == "in_progress" and record.lease_end is not None
            else None
        ),
        "owner": record.owner,
        "validation": record.validation,
        "response_stored": record.response_stored if completed else None,
        "not_stored": record.not_stored,
    }
    result.update(steps_json(record, show_results=show_response))
    if show_response:
        result["response"] = record.response
    return result


def record_lines(record: Record, now: float, *, show_response: bool = False) -> list[str]:
    """The record for people: one ``label  value`` line per field."""
    state = state_of(record, now)
    explained = state
    if state == "completed" and not record.response_stored:
        explained = "completed_not_stored"
    if state == "lapsed" and record.steps is not None:
        explained = "lapsed_steps"
    rows = [
        ("key", record.key),
        ("status", record.status.value),
        ("state", f"{state.replace('_', ' ')}: {_EXPLANATIONS[explained]}"),
    ]
    if record.status is Status.INPROGRESS:
        lease = "none (held until expiry)"
        if state == "released":
            lease = "ended at the release (no call holds the key)"
        elif record.lease_end is not None:
            lease = _when(record.lease_end, now)
        rows.append(("lease end", lease))
    rows += [
        ("expires", _when(record.expiration, now)),
        ("owner", record.owner or "-"),
        ("validation", record.validation or "-"),
    ]
    rows += steps_lines(record, show_results=show_response)
    if record.status is Status.COMPLETED:
        rows.append(("response", _response_summary(record, show_response)))
    lines = [f"{label:<11} {value}" for label, value in rows]
    if show_response and record.response_stored and record.status is Status.COMPLETED:
        lines += (
            _http_lines(record.response)
            or json.dumps(record.response, indent=2, ensure_ascii=False).splitlines()
        )
        if _is_json_text(record.response):
            lines.append(_JSON_TEXT_HINT)
    # Everything above may come from another writer of the store: shown, never run.
    return [printable(line) for line in lines]


_JSON_TEXT_HINT: Final = (
    "(the response is JSON text: if Powertools (Python) or a store with "
    "record_format='powertools-python' wrote it, add record_format=powertools-python to "
    "the store URL to see it decoded)"
)


def _is_json_text(response: Any) -> bool:
    """A string holding a JSON object or array: how Powertools (Python) stores a response."""
    if not isinstance(response, str) or response[:1] not in ("{", "["):
        return False
    try:
        json.loads(response)
    except ValueError:
        return False
    return True


def _http_lines(response: Any) -> list[str] | None:
    """A response the HTTP middleware stored, as the client received it; None otherwise."""
    if not (
        isinstance(response, dict)
        and response.get("v") == 1
        and isinstance(response.get("status"), int)
        and isinstance(response.get("headers", []), list)
    ):
        return None
    try:
        headers = [f"{name}: {value}" for name, value in response.get("headers", [])]
    except (TypeError, ValueError):
        return None
    lines = [f"HTTP {response['status']}", *headers]
    body = response.get("body_b64")
    if not isinstance(body, str):
        return [*lines, "", "(body not stored)"]
    try:
        text = base64.b64decode(body, validate=True).decode()
        return [*lines, "", *_LINE_BREAK.split(text)]
    except (binascii.Error, UnicodeDecodeError):
        return [*lines, "", f"({len(body) * 3 // 4} bytes, not UTF-8 text)"]


def _response_summary(record: Record, show_response: bool) -> str:
    if not record.response_stored:
        return f"not stored: {record.not_stored or 'no reason recorded'}"
    return "stored:" if show_response else "stored (pass --show-response to print it)"


def record_row(record: Record, now: float) -> str:
    """One line of ``list``: status, what happens next and when, key."""
    state = state_of(record, now)
    if state == "in_progress":
        end = record.lease_end if record.lease_end is not None else record.expiration
        when = f"lease ends {relative(end, now)}"
    elif state == "lapsed":
        when = f"lease lapsed {relative(record.lease_end or now, now)}"
    elif state == "released":
        when = "released, progress kept"
    elif state == "completed":
        when = f"expires {relative(record.expiration, now)}"
        if record.expiration >= _NEVER:
            when = "never expires"
    else:
        when = f"expired {relative(record.expiration, now)}"
    if state == "completed" and not record.response_stored:
        when += ", response not stored"
    progress = progress_of(record)
    if progress is not None:
        when += f", {len(progress)} steps" if isinstance(progress, list) else ", steps unreadable"
    return printable(f"{record.status.value:<10}  {when:<32}  {record.key}")


ROW_HEADER: Final = f"{'STATUS':<10}  {'STATE':<32}  KEY"
