"""The JSON API beside the pages, for scripts: the same data, the same gate (who asks,
what they may do, read-only mode, CSRF for ambient credentials: a script with HTTP basic
credentials gets a token from ``GET /api/csrf``; a bearer token needs none).

GET  /api/overview, /api/jobs?<filter>, /api/jobs/{id}, /api/dead, /api/schedules,
     /api/workers, /api/bulk, /api/bulk/{id}, /api/csrf
POST /api/jobs/{id}/{replay|retry|cancel|discard} (cancel, discard: {"reason": "why"} or none),
     /api/queues/{name}/{pause|resume|limits}
     (limits: {"concurrency": 5, "rate": 20, "burst": 40, "aging": 300}; null removes),
     /api/bulk ({"kind": "replay", "filter": {"state": "dead", "task": "t"}}; a cancel or a
     discard: "reason" too, kept on the operation and in each changed job's audit entry),
     /api/bulk/{id}/cancel
Every POST reads its body: none (or ``{}``) is fine, a key the action does not read is
refused (400, nothing changed), as is a body that is not a JSON object.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import bulk
from ..errors import ConfigError
from ..jobfilter import JobFilter, check_keys
from ..names import checked_cancel_reason
from .pages import bulk as bulk_page
from .pages.dead import dead_data
from .pages.job import apply_action, job_data, job_exists
from .pages.jobs import check_list_keys, jobs_data
from .pages.overview import overview_data
from .pages.schedules import schedules_data
from .pages.workers import workers_data
from .render import dumps

QUEUE_VERBS = {"pause": "pause", "resume": "resume", "limits": "set_limits"}
#: The body keys each job action reads: a reason is kept where the App keeps one (a
#: discard is a cancel of a dead job); replay and retry record only their actor.
JOB_ACTION_KEYS: dict[str, tuple[str, ...]] = {"cancel": ("reason",), "discard": ("reason",),
                                               "replay": (), "retry": ()}


class Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content, separators=(",", ":")).encode()


def _filter_out(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    for key in ("filter", "group"):
        if isinstance(data.get(key), JobFilter):
            data[key] = data[key].to_json()
    data.pop("form", None)
    return data


async def _read(request: Request, compute: Any, *args: Any) -> Response:
    ctx = await request.app.state.console.enter(request)
    return Json(await ctx.db(compute, ctx, *args))


async def overview(request: Request) -> Response:
    return await _read(request, overview_data)


async def jobs(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    # a misspelt filter (?tsk=) listed every job as if it matched
    check_list_keys(request.query_params)
    return Json(_filter_out(await ctx.db(jobs_data, ctx, request.query_params)))


async def job(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    data = await ctx.db(job_data, ctx, request.path_params["job_id"])
    if data is None:
        return Json({"error": "no such job"}, status_code=404)
    # the page's renderings of job["payload"], job["result"], and its template names
    for text in ("payload_text", "result_text", "sections"):
        data.pop(text, None)
    return Json(data)


async def dead(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    return Json(_filter_out(await ctx.db(dead_data, ctx, request.query_params)))


async def schedules(request: Request) -> Response:
    return await _read(request, schedules_data)


async def workers(request: Request) -> Response:
    return await _read(request, workers_data)


async def operations(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    return Json(await ctx.db(bulk_page.list_data, ctx, request.query_params))


async def operation(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    data = await ctx.db(bulk_page.operation_data, ctx, request.path_params["op_id"])
    if data is None:
        return Json({"error": "no such bulk operation"}, status_code=404)
    return Json(_filter_out(data))


async def csrf(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request)
    return Json({"token": ctx.csrf, "header": "X-CSRF-Token"})


async def job_action(request: Request) -> Response:
    verb = request.path_params["verb"]
    if verb not in JOB_ACTION_KEYS:
        return Json({"error": "unknown job action"}, status_code=404)
    ctx = await request.app.state.console.enter(request, verb)
    # a misspelt "reasn", dropped, cancelled the job without the reason the script sent
    body = await _body(request, JOB_ACTION_KEYS[verb], what=verb)
    reason = checked_cancel_reason(body.get("reason"))  # a long one refused, as the command line refuses it
    job_id = request.path_params["job_id"]
    changed = await ctx.db(apply_action, ctx, verb, job_id, reason)
    if not changed and not await ctx.db(job_exists, ctx, job_id):
        # as GET /api/jobs/ID says (a trial: 200 {"changed": false} read as "not in a state for it")
        return Json({"error": "no such job"}, status_code=404)
    return Json({"id": job_id, "action": verb, "changed": changed})


async def queue_action(request: Request) -> Response:
    verb = request.path_params["verb"]
    if verb not in QUEUE_VERBS:
        return Json({"error": "unknown queue action"}, status_code=404)
    ctx = await request.app.state.console.enter(request, QUEUE_VERBS[verb])
    queue = request.path_params["name"]
    body = await _body(request, ("concurrency", "rate", "burst", "aging") if verb == "limits" else (), what=verb)
    if verb == "pause":
        return Json(await ctx.db(ctx.app.pause_queue, queue, actor=ctx.actor))
    if verb == "resume":
        return Json({"resumed": await ctx.db(ctx.app.resume_queue, queue, actor=ctx.actor)})
    names = {"concurrency": "concurrency_limit", "rate": "rate_limit", "burst": "burst", "aging": "aging"}
    if not body:  # a limits request that sets nothing is a mistake, not a no-op to answer 200
        raise ConfigError('limits needs at least one of concurrency, rate, burst, aging, e.g. {"concurrency": 5} '
                          "(null removes one); nothing was changed")
    limits = {names[k]: v for k, v in body.items() if k in names}
    return Json(await ctx.db(lambda: ctx.app.configure_queue(queue, actor=ctx.actor, **limits)))


async def create_operation(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request, "bulk")
    # a misspelt "filter" would mean every job; a misspelt "reason", an operation without its why
    body = await _body(request, ("kind", "filter", "reason"), what="request")
    kind = str(body.get("kind") or "")
    if kind not in bulk.KINDS:
        raise ConfigError(f"kind must be one of {', '.join(bulk.KINDS)}")
    ctx.require(kind)
    if body.get("filter") is None:  # a break-it trial: {"kind": "cancel"} cancelled every job, unasked
        raise ConfigError(bulk_page.no_filter(kind, '"filter": {}'))
    # each key known, of its type, none empty: a misspelt, null or list-valued key would widen or mislead it
    job_filter = JobFilter.parse_object(body["filter"])
    op = await ctx.db(bulk.create, ctx.app, kind, job_filter, actor=ctx.actor, reason=body.get("reason"))
    if ctx.console.applier is not None:
        ctx.console.applier.wake.set()
    return Json(op, status_code=201)


async def cancel_operation(request: Request) -> Response:
    ctx = await request.app.state.console.enter(request, "bulk_cancel")
    await _body(request, (), what="bulk cancel")
    op = await ctx.db(bulk.cancel, ctx.app, request.path_params["op_id"], actor=ctx.actor)
    return Json({"cancelled": op is not None, "operation": op})


async def _body(request: Request, known: tuple[str, ...], *, what: str) -> dict[str, Any]:
    """The POST's body as a JSON object whose keys are all in ``known``: none (or only
    blanks) is ``{}``. Raises :class:`ConfigError` (400, before anything changes) for a
    body that is not a JSON object, and for a key ``what`` does not read, naming the
    closest one (a misspelt key, dropped, was a silent no-op or widened the action)."""
    try:
        raw = await request.body()
    except RuntimeError:  # the gate read it as a form (its csrf_token field): not JSON
        raw = None
    if raw is None:
        raise ConfigError("the request body is a form: the API reads a JSON object, sent with "
                          "Content-Type: application/json (and the CSRF token in the X-CSRF-Token header); "
                          "nothing was changed")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ConfigError("the request body is nested too deeply to read (an action's body is a flat JSON "
                          "object); nothing was changed") from None
    except ValueError:
        raise ConfigError("the request body is not JSON: send an object with Content-Type: application/json "
                          "(curl: -H 'Content-Type: application/json' -d '{...}'), or no body; nothing was "
                          "changed") from None
    if not isinstance(body, dict):
        got = "an array" if isinstance(body, list) else "a string" if isinstance(body, str) else \
            "null" if body is None else "a number or boolean"
        raise ConfigError(f"the request body must be a JSON object ({{...}}), not {got}; nothing was changed")
    if not known and body:
        key = next(iter(body))
        why = (" (a reason is kept by cancel and discard only: a job's, or a bulk operation's, given when it is "
               "created)") if key == "reason" else ""
        raise ConfigError(f"{what} reads no key of the request body, and it got {key!r}{why}: send no body "
                          "or {}; nothing was changed")
    check_keys(body, known, what=what)
    return body


ROUTES = [
    Route("/api/overview", overview), Route("/api/jobs", jobs), Route("/api/jobs/{job_id:int}", job),
    Route("/api/dead", dead), Route("/api/schedules", schedules), Route("/api/workers", workers),
    Route("/api/bulk", operations, methods=["GET"]), Route("/api/bulk", create_operation, methods=["POST"]),
    Route("/api/bulk/{op_id:int}", operation), Route("/api/csrf", csrf),
    Route("/api/bulk/{op_id:int}/cancel", cancel_operation, methods=["POST"]),
    Route("/api/jobs/{job_id:int}/{verb}", job_action, methods=["POST"]),
    Route("/api/queues/{name:path}/{verb}", queue_action, methods=["POST"]),
]
