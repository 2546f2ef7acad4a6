"""Dead jobs, grouped by task and error code (counts, first and last seen), from the
newest ``dead_scan_rows`` dead jobs; a group's jobs newest first with checkboxes; replay
or discard one (the job page), a selection (here, at once: at most a page of ids), or
every job of a group (a bulk operation, confirmed with its count first)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import ConfigError
from ...jobfilter import JobFilter
from ...names import parse_id
from .jobs import FAR, NEWEST, _keyset

SELECTION_MAX = 1000
GROUPS_SHOWN = 200


def dead_data(ctx: Any, params: Any) -> dict[str, Any]:
    cfg = ctx.console.config
    group = JobFilter.parse({"queue": params.get("queue"), "task": params.get("task"),
                             "error_code": params.get("error_code"), "state": "dead"})
    selected = params.get("task") is not None or params.get("error_code") is not None
    with ctx.app.connection() as c:
        groups = ctx.store.console_dead_groups(c, queue=group.queue, scan=cfg.dead_scan_rows, limit=GROUPS_SHOWN)
        jobs: list[dict[str, Any]] = []
        if selected:
            before_at, before_id = _keyset(params.get("cursor") or "", FAR, NEWEST)
            jobs = ctx.store.console_dead_group_jobs(
                c, queue=group.queue, task=group.task, error_code=group.error_code, before_at=before_at,
                before_id=before_id, scan=cfg.dead_scan_rows, limit=cfg.page_size + 1)
    scanned = groups[0]["scanned"] if groups else 0
    more = len(jobs) > cfg.page_size
    jobs = jobs[:cfg.page_size]
    next_cursor = f"{jobs[-1]['finished_at'].isoformat()}|{jobs[-1]['id']}" if more else None
    return {"groups": groups, "scanned": scanned, "scan_cap": cfg.dead_scan_rows, "group": group,
            "selected": selected, "jobs": jobs, "next_cursor": next_cursor, "queue": group.queue or ""}


async def dead(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    data = await ctx.db(dead_data, ctx, request.query_params)
    return console.render(ctx, "dead.html", data)


async def dead_selection(request: Request) -> Response:
    """Replay or discard the checked jobs (at most SELECTION_MAX ids: a page's)."""
    console = request.app.state.console
    ctx = await console.enter(request, "view")  # authenticated, same-site, CSRF checked
    form = await request.form()
    verb = form.get("verb")
    if verb not in ("replay", "discard"):
        raise ConfigError("choose replay or discard")
    ctx.require(verb)
    try:  # a checkbox's value is an id the page wrote; anything else was not typed by the page
        ids = sorted({parse_id(str(v)) for v in form.getlist("ids")})
    except ValueError as exc:
        raise ConfigError(f"{exc}; tick the jobs on the dead page") from None
    if not ids:
        raise ConfigError("no job was selected: tick the jobs first")
    if len(ids) > SELECTION_MAX:
        raise ConfigError(f"{len(ids):,} jobs selected; at most {SELECTION_MAX:,} at once: use the group's "
                          "bulk action for more")
    changed = await ctx.db(_apply_selection, ctx, verb, ids)
    back = str(form.get("back") or "/dead")
    back = back if back.startswith("/dead") else "/dead"
    sep = "&" if "?" in back else "?"
    return ctx.redirect(f"{back}{sep}done={verb}&changed={changed}")


def _apply_selection(ctx: Any, verb: str, ids: list[int]) -> int:
    if verb == "replay":
        return len(ctx.app.replay(ids, actor=ctx.actor, limit=len(ids)))
    changed = 0
    for job_id in ids:  # discard: the CLI's cancel, of the selected jobs that are still dead
        job = ctx.app.get_job(job_id)
        if job is not None and job["state"] == "dead" and ctx.app.cancel(job_id, actor=ctx.actor) is not None:
            changed += 1
    return changed


ROUTES = [
    Route("/dead", dead, methods=["GET"], name="dead"),
    Route("/dead/selection", dead_selection, methods=["POST"]),
]
