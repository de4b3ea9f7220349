"""A scenario's trace as text, for a reader (``--verbose``): the store's log with what each
operation applied, the callbacks' runs and the callers' outcomes."""

from __future__ import annotations

from idempotency_async.testing._trace import BASE_TIME, Trace

__all__ = ["describe_trace"]


def describe_trace(trace: Trace) -> str:
    """The store's log, the callback runs and the outcomes, as text (``--verbose``)."""
    start = trace.start
    lines = ["store operations (t = seconds from the scenario start):"]
    for op in trace.store.ops:
        arg = op.arg
        if hasattr(arg, "owner"):
            arg = f"owner={arg.owner} now={arg.now - BASE_TIME:.3f}"
        fault = "" if op.fault is None else f" FAULT={op.fault.kind}"
        ended = "-" if op.ended is None else f"{op.ended - start:.3f}"
        got = op.raised if op.raised is not None else op.delivered
        lines.append(
            f"  #{op.seq} t={op.started - start:.3f}..{ended} call {op.call} {op.name} "
            f"{op.key} {arg}{fault} -> {got!r}"
        )
        for application in op.applications:
            lines.append(
                f"      applied t={application.at - start:.3f}: {application.before} "
                f"=> {application.after}"
            )
    lines.append("callbacks:")
    for run in trace.runs:
        ended = "-" if run.ended is None else f"{run.ended - start:.3f}"
        lines.append(
            f"  call {run.call} owner={run.owner} t={run.started - start:.3f}..{ended} "
            f"returned={run.returned} cancelled={run.cancelled} "
            f"swallowed={run.swallowed} blocked={run.blocked}"
        )
    lines.append("outcomes:")
    for outcome in trace.outcomes:
        got = outcome.value if outcome.error is None else repr(outcome.error)
        exited = "-" if outcome.exited is None else f"{outcome.exited - start:.3f}"
        lines.append(f"  call {outcome.call} t={outcome.entered - start:.3f}..{exited} -> {got}")
    return "\n".join(lines)
