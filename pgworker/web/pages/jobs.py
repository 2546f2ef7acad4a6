"""The jobs list: filtered by queue, state, task, ordering key, dedupe key, id, error
code, creation time, payload and graph; newest first (keyset on id, no OFFSET), or, for
the filters an index orders, in that index's order (due order, lease expiry, finish time).

A filter no index serves (task, payload, error code, a time range) is evaluated over a
window of the newest ``scan_rows`` jobs below the cursor; the page says how far back it
looked, and "further back" moves the window. With a graph, the window is the newest
``scan_rows`` jobs of that graph (jobs_graph_idx), so every job of a graph is reachable.
No count of matches over the table: a window says how many it found, an index-ordered
list counts up to a cap ("10,000+").
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...jobfilter import KEYS, FilterError, JobFilter, check_keys, closest_name, recent_known_names
from ...names import parse_id

NEWEST = 2**63 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
FAR = datetime(9999, 1, 1, tzinfo=timezone.utc)
SORTS = ("newest", "due", "lease", "finished")
QUEUE_NAMES_READ = 1000  # known queues a typo's hint compares with


def parse_sort(job_filter: JobFilter, sort: str | None) -> str:
    """The order asked for, if the filter allows it: due order needs state pending and a
    queue; lease expiry state running; finish time a finished state; each takes the queue
    (and state) only, the other fields being for the newest-first window."""
    sort = sort or "newest"
    if sort not in SORTS:
        raise FilterError(f"sort {sort!r} is not one of {', '.join(SORTS)}")
    if sort == "newest":
        return sort
    others = job_filter.replace(queue=None, state=None)
    if not others.empty:
        raise FilterError(f"sorting by {sort} takes the queue and state only ({others.describe()} is for the "
                          "newest-first list): clear those fields or sort newest first")
    need = {"due": ("pending",), "lease": ("running",), "finished": ("succeeded", "cancelled", "dead")}[sort]
    if job_filter.state not in need:
        raise FilterError(f"sorting by {sort} needs state {' or '.join(need)}")
    if sort == "due" and job_filter.queue is None:
        raise FilterError("due order is per queue (jobs_due_idx): choose a queue")
    if sort == "finished" and job_filter.queue is not None and job_filter.state != "dead":
        raise FilterError("finish time with a queue is indexed for dead jobs only: sort newest first instead")
    return sort


def jobs_data(ctx: Any, params: Any) -> dict[str, Any]:
    cfg = ctx.console.config
    job_filter = JobFilter.parse(params)
    sort = parse_sort(job_filter, params.get("sort"))
    cursor = params.get("cursor") or ""
    limit = cfg.page_size
    out: dict[str, Any] = {"filter": job_filter, "sort": sort, "cursor": cursor, "window": None,
                           "next_cursor": None, "cap": cfg.count_cap, "form": dict(params),
                           "queue_hint": None, "task_hint": None}
    with ctx.app.connection() as c:
        out["estimate"] = ctx.store.console_jobs_estimate(c)
        if sort == "newest":
            before = _int(cursor, NEWEST)
            floor, scanned, rows = ctx.store.console_jobs_window(
                c, job_filter=job_filter.to_json(), before=before, scan=cfg.scan_rows, limit=limit + 1)
            more = len(rows) > limit
            rows = rows[:limit]
            out["window"] = {"scanned": scanned, "floor": floor, "before": before, "full": scanned >= cfg.scan_rows,
                             "filtered": not job_filter.empty, "exhausted": False, "graph": job_filter.graph}
            if more:
                out["next_cursor"] = str(rows[-1]["id"])
            elif floor > 1 and scanned >= cfg.scan_rows:
                out["next_cursor"] = str(floor)  # the window ran out: look further back
                out["window"]["exhausted"] = True
        else:
            rows = _indexed(ctx.store, c, sort, job_filter, cursor, limit + 1)
            if len(rows) > limit:
                rows = rows[:limit]
                last = rows[-1]
                key = {"due": "run_at", "lease": "lease_expires_at", "finished": "finished_at"}[sort]
                out["next_cursor"] = f"{last[key].isoformat()}|{last['id']}"
        if not rows and job_filter.queue is not None and job_filter.state in (None, "pending", "running", "dead"):
            # the known names are the queues with jobs due, running or dead (and configured
            # ones): a queue of succeeded jobs alone is not among them, so no hint there
            out["queue_hint"] = _closest_queue(ctx.store, c, job_filter.queue)
        if not rows and job_filter.task is not None:
            out["task_hint"] = _closest_task(ctx.app, c, job_filter.task)
    # a filter nothing in the table matches: its bulk actions would act on nothing (a new
    # user's trial found them offered under "No job matches"); a window that was cut (it
    # then offers the next one: next_cursor), or a later page, may still have matches
    # elsewhere, so they stay offered there. A full window down to the first id was not cut.
    out["nothing_matches"] = not rows and not out["next_cursor"] and not cursor
    out["jobs"] = rows
    return out


def _closest_task(app: Any, c: Any, task: str) -> str | None:
    """For a list filtered on a task that matched nothing: the closest task name of the
    console's App and of the newest jobs (as `pgworker jobs list --task` names it), else None."""
    return closest_name(task, recent_known_names(app, c)[1])


def _closest_queue(store: Any, c: Any, queue: str) -> str | None:
    """For a list that matched nothing: the known queue closest to a queue name that is not
    one (a typo, ``emials``), else None. The names come from the overview's loose index
    scans, not from the jobs' rows."""
    return closest_name(queue, store.console_queue_names(c, limit=QUEUE_NAMES_READ))


def _indexed(store: Any, c: Any, sort: str, f: JobFilter, cursor: str, limit: int) -> list[dict[str, Any]]:
    if sort == "due":
        at, after_id = _keyset(cursor, EPOCH, 0)
        return store.console_jobs_due(c, queue=f.queue, after_run_at=at, after_id=after_id, limit=limit)
    if sort == "lease":
        at, after_id = _keyset(cursor, EPOCH, 0)
        return store.console_jobs_running(c, queue=f.queue, after_at=at, after_id=after_id, limit=limit)
    at, before_id = _keyset(cursor, FAR, NEWEST)
    if f.queue is not None:
        return store.console_jobs_dead_in_queue(c, queue=f.queue, before_at=at, before_id=before_id, limit=limit)
    return store.console_jobs_finished(c, state=f.state, before_at=at, before_id=before_id, limit=limit)


def _int(text: str, default: int) -> int:
    if not text:
        return default
    try:
        return max(1, min(int(text), NEWEST))
    except ValueError:
        raise FilterError(f"cursor {text!r} is not a job id") from None


def _keyset(text: str, at: datetime, job_id: int) -> tuple[datetime, int]:
    if not text:
        return at, job_id
    stamp, _, raw_id = text.rpartition("|")
    try:
        return datetime.fromisoformat(stamp), int(raw_id)
    except ValueError:
        raise FilterError(f"cursor {text!r} is not a position in this list: start from the first page") from None


def check_list_keys(params: Any, *extra: str) -> None:
    """Refuse a query key the job list does not read (raises :class:`FilterError`): the
    list ignored it and showed every job as if it matched."""
    check_keys(params, (*KEYS, "sort", "cursor", *extra), what="query", changes=False)


async def jobs(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    raw_id = (request.query_params.get("id") or "").strip().lstrip("#")
    if raw_id:
        try:
            job_id = parse_id(raw_id)
        except ValueError as exc:  # str.isdigit() also passes Arabic-Indic or fullwidth digits
            raise FilterError(str(exc)) from None
        return ctx.redirect(f"/jobs/{job_id}")
    try:
        check_list_keys(request.query_params, "id")  # misspelt keys were ignored
        data = await ctx.db(jobs_data, ctx, request.query_params)
    except FilterError as exc:  # the form again, with what to fix
        data = {"error": str(exc), "form": dict(request.query_params), "sort": request.query_params.get("sort"),
                "filter": JobFilter(), "jobs": [], "window": None, "next_cursor": None, "estimate": None,
                "queue_hint": None, "task_hint": None, "nothing_matches": False}
        return console.render(ctx, "jobs.html", data, status=400)
    return console.render(ctx, "jobs.html", data)


ROUTES = [Route("/jobs", jobs, methods=["GET"], name="jobs")]
