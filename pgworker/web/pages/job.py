"""One job: its payload (pretty, bounded, redacted), every recorded attempt with its
error, its lease (owner, fencing token, expiry, last renewal: is it really running?),
its keys, the audit trail, the trace link, and the actions its state allows.

The page is a list of sections, each a template partial fed by a loader
(:data:`SECTIONS`): what issues 20 and 21 add (steps and effects, dependencies, the
result, progress) is a partial and a loader appended there, reading its own table.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...names import ID_MAX
from ..live import fingerprint, poll_stream
from ..render import pretty, redact
from .job_sections import dependencies_section, progress_section, result_section

#: (partial template, loader(ctx, job) -> dict merged into the page) in page order.
#: A loader may read more through the store; the job page's own come from job_get.
SECTIONS: list[tuple[str, Callable[[Any, dict[str, Any]], dict[str, Any]]]] = []


def shown(cfg: Any, value: Any, job: dict[str, Any]) -> Any:
    """``value`` (a payload, a result, a step's result: any JSON value) as the console may
    show it: the values of ``cfg.redact_keys`` replaced at any depth, then the
    application's ``cfg.redact(value, job)`` hook when it has one."""
    value = redact(value, cfg.redact_keys)
    if cfg.redact is not None:
        value = cfg.redact(value, job)
    return value


def _steps(ctx: Any, job: dict[str, Any]) -> dict[str, Any]:
    """The job's durable steps and effects (issue 20), their results redacted like the
    payload (the API returns the job: never an unredacted result)."""
    cfg = ctx.console.config
    steps = [dict(s, result=shown(cfg, s["result"], job)) for s in job.get("steps") or []]
    job["steps"] = [{k: v for k, v in s.items()} for s in steps]
    for s in steps:
        s["result_text"] = "-" if s["result"] is None else pretty(s["result"], 200)
    return {"steps": steps}


SECTIONS.append(("job/_steps.html", _steps))
SECTIONS.append(("job/_progress.html", progress_section))
SECTIONS.append(("job/_result.html", result_section))
SECTIONS.append(("job/_dependencies.html", dependencies_section))

#: What each action does to a job in each state (the store methods fence by state again).
ACTIONS_BY_STATE = {"pending": ("retry", "cancel"), "running": ("cancel",), "dead": ("replay", "discard")}
FINISHED = ("succeeded", "cancelled", "dead")


def job_data_raw(ctx: Any, job_id: int) -> dict[str, Any] | None:
    """The job's row as the App reads it, or None (also for an id no job can have: the
    route takes any digits, and the App refuses an id past a bigint)."""
    return ctx.app.get_job(job_id) if 0 < job_id <= ID_MAX else None


def job_exists(ctx: Any, job_id: int) -> bool:
    """Whether the path's id names a job."""
    return job_data_raw(ctx, job_id) is not None


def job_data(ctx: Any, job_id: int) -> dict[str, Any] | None:
    job = job_data_raw(ctx, job_id)
    if job is None:
        return None
    cfg = ctx.console.config
    # the API returns the job too: never the unredacted payload or result (what a handler
    # returns often carries what its payload did: a token, a signed URL)
    payload = shown(cfg, job["payload"], job)
    if "result" in job:
        job["result"] = shown(cfg, job["result"], job)
    job["payload"] = payload
    now = datetime.now(timezone.utc)
    actions = [a for a in ACTIONS_BY_STATE.get(job["state"], ()) if ctx.can(a)]
    if "retry" in actions and not (job["run_at"] > now):
        actions.remove("retry")  # due already: nothing to bring forward
    if "cancel" in actions and job["cancel_requested_at"] is not None:
        actions.remove("cancel")  # requested already: the lease section says when
    data = {"job": job, "payload_text": pretty(payload, cfg.payload_max_chars), "lease": _lease(job, now, ctx),
            "attempts": attempt_runs(job["errors"]), "trace": _trace(job.get("trace_context"), cfg.trace_url),
            "actions": actions, "now": now, "sections": [],
            "history_entries": ctx.app.settings.error_history_entries}
    for template, loader in SECTIONS:
        data.update(loader(ctx, job))
        data["sections"].append(template)
    data["live_seen"] = fingerprint(live_value(job))
    return data


def attempt_runs(errors: Any) -> list[dict[str, Any]]:
    """A job's error history for its page, newest first, each entry with ``earlier_run``:
    True where the run before a replay (or attempts given back) begins, so that 3, 2, 1,
    3, 2, 1 reads as two runs. An entry that is not an object (a row written by hand) is
    shown as its text; an attempt that is not a number marks no run."""
    out: list[dict[str, Any]] = []
    previous: int | None = None
    if errors is not None and not isinstance(errors, list):  # written by hand, or undecodable: shown, not hidden
        errors = [{"message": str(errors)[:2000]}]
    for entry in reversed(errors or []):
        if not isinstance(entry, dict):
            entry = {"message": str(entry)[:2000]}
        try:
            attempt: int | None = int(entry.get("attempt"))  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            attempt = None
        out.append({**entry, "earlier_run": previous is not None and attempt is not None and attempt >= previous})
        previous = attempt if attempt is not None else previous
    return out


def live_value(job: dict[str, Any]) -> tuple[Any, ...]:
    """What an open job page follows: its state, lease, attempts and progress."""
    return (job["state"], job["lease_token"], job["heartbeat_at"], job["attempts"], job["cancel_requested_at"],
            job["run_at"], len(job["events"]), job.get("progress_at"))


def _lease(job: dict[str, Any], now: datetime, ctx: Any) -> dict[str, Any] | None:
    """A running job's lease: who holds it, the token, when it expires, when it was last
    renewed (heartbeat_at), and a verdict the operator can act on."""
    if job["state"] != "running":
        return None
    expires = job["lease_expires_at"]
    renewed = job["heartbeat_at"]
    renew_every = ctx.app.settings.effective_renew_interval
    left = (expires - now).total_seconds() if expires else None
    since = (now - renewed).total_seconds() if renewed else None
    if left is not None and left <= 0:
        verdict = "expired: its worker stopped renewing; the reaper will recover the job"
    elif since is not None and since > 2 * renew_every:
        verdict = f"not renewed for {since:.0f} s (renewals come every {renew_every:.0f} s): its worker may be gone"
    else:
        verdict = "renewed on schedule: a worker holds it"
    return {"owner": job["lease_owner"], "token": job["lease_token"], "expires_at": expires, "seconds_left": left,
            "renewed_at": renewed, "seconds_since_renewal": since, "verdict": verdict,
            "cancel_requested_at": job["cancel_requested_at"]}


def _trace(context: Any, template: str | None) -> dict[str, Any] | None:
    """The trace id of the enqueuing span (W3C traceparent 00-<trace id>-<span id>-<flags>)."""
    if not isinstance(context, dict) or not isinstance(context.get("traceparent"), str):
        return None
    parts = context["traceparent"].split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or not all(c in "0123456789abcdef" for c in parts[1]):
        return None
    return {"trace_id": parts[1], "url": template.replace("{trace_id}", parts[1]) if template else None}


async def job_page(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    job_id = request.path_params["job_id"]
    data = await ctx.db(job_data, ctx, job_id)
    if data is None:
        return console.render(ctx, "error.html", {"status": 404, "message": f"no job {job_id} (pruned, or never "
                                                  "enqueued in this schema)"}, status=404)
    return console.render(ctx, "job.html", data)


async def job_events(request: Request) -> Response:
    """SSE for an open job page: 'refresh' when its state, lease, attempts or progress change."""
    console = request.app.state.console
    ctx = await console.enter(request)
    job_id = request.path_params["job_id"]

    async def read() -> Any:
        job = await ctx.db(job_data_raw, ctx, job_id)
        return None if job is None else live_value(job)

    return StreamingResponse(poll_stream(read, request.is_disconnected, until=lambda v: v is None or v[0] in FINISHED,
                                         seen=request.query_params.get("seen"),
                                         reconnected="last-event-id" in request.headers),
                             media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


async def job_action(request: Request) -> Response:
    """replay, retry (now), cancel, discard: the App's methods, with the principal as actor."""
    console = request.app.state.console
    verb = request.path_params["verb"]
    if verb not in ("replay", "retry", "cancel", "discard"):
        return Response("unknown job action", status_code=404)
    ctx = await console.enter(request, verb)
    job_id = request.path_params["job_id"]
    reason = None
    if verb in ("cancel", "discard"):  # the form's optional reason field (the gate read the form already)
        field = (await request.form()).get("reason")
        reason = field if isinstance(field, str) else None
    done = await ctx.db(apply_action, ctx, verb, job_id, reason)
    return ctx.redirect(f"/jobs/{job_id}?done={verb if done else 'nothing'}")


def apply_action(ctx: Any, verb: str, job_id: int, reason: str | None = None) -> bool:
    """Whether the action changed the job (the store's fence may find it moved on).
    ``reason`` (cancel and discard: kept in the audit event, bounded by
    :func:`pgworker.names.cancel_reason`) is not read by replay and retry."""
    app = ctx.app
    if not 0 < job_id <= ID_MAX:
        return False
    if verb == "replay":
        return bool(app.replay([job_id], actor=ctx.actor))
    if verb == "retry":
        return app.retry(job_id, actor=ctx.actor) is not None
    if verb == "discard":
        job = app.get_job(job_id)
        if job is None or job["state"] != "dead":
            return False  # a discard is a cancel of a dead job: never of a pending one
    return app.cancel(job_id, actor=ctx.actor, reason=reason) is not None


ROUTES = [
    Route("/jobs/{job_id:int}", job_page, methods=["GET"], name="job"),
    Route("/jobs/{job_id:int}/events", job_events, methods=["GET"]),
    Route("/jobs/{job_id:int}/{verb}", job_action, methods=["POST"]),
]
