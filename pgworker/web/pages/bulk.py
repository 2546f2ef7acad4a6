"""Bulk operations: confirm (the count first), record, follow, cancel.

"Replay every job of this group" or "cancel everything this filter matches" is one
durable record (:mod:`pgworker.bulk`) that this console applies in bounded batches:
never a loop inside the HTTP request, never a cap on how many jobs it reaches.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ... import bulk
from ...errors import ConfigError
from ...jobfilter import KEYS, JobFilter, check_keys
from ..live import fingerprint, poll_stream
from .jobs import NEWEST

#: The confirmation's count of a dead group stops here (the dead set is indexed).
DEAD_COUNT_CAP = 1_000_000
#: The fields of the confirmation's form beside the filter's (``every``: the filter is empty on purpose).
FORM_KEYS = ("csrf_token", "kind", "expected", "reason", "every")
ACTION_OF = {"replay": "replay", "cancel": "cancel", "discard": "discard"}


def no_filter(kind: str, every: str) -> str:
    """The refusal of a bulk operation asked with no filter at all (the API's ``filter``
    missing or null, a form without its fields): it would act on every job, unconfirmed.
    ``every`` says how to ask for every job on purpose."""
    states = " and ".join(bulk.APPLIES_TO.get(kind, ("matching",)))
    return (f"a bulk {kind} needs a filter: name what it acts on (a queue, task, error_code, graph, ...: "
            f'{{"task": "send_email"}}), or give {every} to act on every {states} job; nothing was started')


def acted_on(kind: str, job_filter: JobFilter) -> list[JobFilter]:
    """The filters, one per state, whose jobs an operation of ``kind`` with ``job_filter``
    (:func:`pgworker.bulk.checked_filter`'s) changes: the states of
    :data:`pgworker.bulk.APPLIES_TO`, the rule the applier keeps, narrowed to the filter's
    own. A count of ``job_filter`` alone took every state (a cancel of a queue counted its
    succeeded and dead jobs)."""
    states = (job_filter.state,) if job_filter.state is not None else bulk.APPLIES_TO[kind]
    return [job_filter.replace(state=s) for s in states]


def count_acted_on(ctx: Any, c: Any, kind: str, job_filter: JobFilter) -> dict[str, Any]:
    """How many jobs the operation would change now (the confirmation's count and the
    operation's ``expected``): exact from the dead set's index for a dead group, else
    what the window of the newest ``scan_rows`` jobs holds of each state it takes."""
    cfg = ctx.console.config
    filters = acted_on(kind, job_filter)
    if [f.state for f in filters] == ["dead"] and job_filter.replace(
            state=None, queue=None, task=None, error_code=None).empty:
        count = ctx.store.console_dead_count(c, queue=job_filter.queue, task=job_filter.task,
                                             error_code=job_filter.error_code, cap=DEAD_COUNT_CAP)
        return {"jobs": count, "exact": count < DEAD_COUNT_CAP, "cap": DEAD_COUNT_CAP, "window": None}
    jobs, exact, window = 0, True, 0
    for f in filters:
        _, scanned, rows = ctx.store.console_jobs_window(c, job_filter=f.to_json(), before=NEWEST,
                                                         scan=cfg.scan_rows, limit=cfg.count_cap)
        jobs, window = jobs + len(rows), max(window, scanned)
        exact = exact and scanned < cfg.scan_rows and len(rows) < cfg.count_cap
    return {"jobs": jobs, "exact": exact, "cap": cfg.count_cap, "window": window,
            "states": [f.state for f in filters]}


def confirm_data(ctx: Any, params: Any) -> dict[str, Any]:
    kind = params.get("kind") or ""
    check_keys(params, (*KEYS, "kind"), what="query", changes=False)  # a misspelt key widened the operation
    given = JobFilter.parse(params)
    job_filter = bulk.checked_filter(kind, given)
    with ctx.app.connection() as c:
        counted = count_acted_on(ctx, c, kind, job_filter)
        tail = ctx.store.console_job_tail(c)
    # "every": asked with no filter at all, this page is its confirmation (the form says so)
    return {"kind": kind, "filter": job_filter, "counted": counted, "tail": tail,
            "takes_reason": kind in bulk.REASON_KINDS, "every": given.empty}


async def confirm(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    kind = request.query_params.get("kind") or ""
    if kind not in ACTION_OF:
        raise ConfigError(f"bulk operation {kind!r} is not one of {', '.join(bulk.KINDS)}")
    ctx.require("bulk")
    ctx.require(ACTION_OF[kind])
    return console.render(ctx, "bulk_confirm.html", await ctx.db(confirm_data, ctx, request.query_params))


async def create(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request, "bulk")
    form = await request.form()
    kind = str(form.get("kind") or "")
    if kind not in ACTION_OF:
        raise ConfigError(f"bulk operation {kind!r} is not one of {', '.join(bulk.KINDS)}")
    ctx.require(ACTION_OF[kind])
    check_keys(form, (*KEYS, *FORM_KEYS))  # a misspelt field, dropped, would widen the operation
    job_filter = JobFilter.parse(form)
    if job_filter.empty and form.get("every") != "1":  # no filter field: every job, unconfirmed
        raise ConfigError(no_filter(kind, f"every=1 (the confirmation, {ctx.root}/bulk/new?kind={kind}, "
                                          "sends it)"))
    expected = str(form.get("expected") or "")
    # the confirmation's optional reason field (cancel, discard): a long one is refused by
    # bulk.create (a 400 page, nothing recorded), never cut without a word
    field = form.get("reason")
    op = await ctx.db(bulk.create, ctx.app, kind, job_filter, actor=ctx.actor,
                      expected=int(expected) if expected.isdigit() else None,
                      reason=field if isinstance(field, str) else None)
    if console.applier is not None:
        console.applier.wake.set()
    return ctx.redirect(f"/bulk/{op['id']}")


def list_data(ctx: Any, params: Any) -> dict[str, Any]:
    before = int(params.get("cursor") or NEWEST)
    limit = ctx.console.config.page_size
    with ctx.app.connection() as c:
        ops = ctx.store.bulk_operations_list(c, before=before, limit=limit + 1)
    return {"operations": ops[:limit], "next_cursor": str(ops[limit - 1]["id"]) if len(ops) > limit else None}


async def operations(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    return console.render(ctx, "bulk_list.html", await ctx.db(list_data, ctx, request.query_params))


def operation_data(ctx: Any, op_id: int) -> dict[str, Any] | None:
    with ctx.app.connection() as c:
        op = ctx.store.bulk_operation_get(c, op_id)
        if op is None:
            return None
        sample = ctx.store.bulk_operation_jobs_of(c, op_id, limit=20)
    span = max(op["max_id"], 1)
    return {"op": op, "filter": _recorded(op["filter"]), "sample": sample,
            "progress": 100.0 if op["state"] == "done" else min(100.0, 100.0 * op["cursor_id"] / span),
            "live_seen": fingerprint(live_value(op))}


class UnreadableFilter(str):
    """What the page shows for a recorded filter that does not read as one (written by
    hand: not an object, or JSON Python cannot decode): its text, said to be unreadable."""

    def describe(self) -> str:
        return f"unreadable ({self})"


def _recorded(value: Any) -> "JobFilter | UnreadableFilter":
    try:
        return JobFilter.from_json(value)
    except (TypeError, ValueError) as exc:
        return UnreadableFilter(str(exc)[:300])


def live_value(op: dict[str, Any]) -> tuple[Any, ...]:
    """What an open operation page follows: its state and cursor."""
    return (op["state"], op["cursor_id"])


async def operation(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    op_id = request.path_params["op_id"]
    data = await ctx.db(operation_data, ctx, op_id)
    if data is None:
        return console.render(ctx, "error.html", {"status": 404, "message": f"no bulk operation {op_id}"}, status=404)
    return console.render(ctx, "bulk.html", data)


async def operation_events(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    op_id = request.path_params["op_id"]

    async def read() -> Any:
        with_conn = await ctx.db(operation_data, ctx, op_id)
        return None if with_conn is None else live_value(with_conn["op"])

    return StreamingResponse(poll_stream(read, request.is_disconnected,
                                         until=lambda v: v is None or v[0] != "running",
                                         seen=request.query_params.get("seen"),
                                         reconnected="last-event-id" in request.headers),
                             media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


async def cancel(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request, "bulk_cancel")
    op_id = request.path_params["op_id"]
    await ctx.db(bulk.cancel, ctx.app, op_id, actor=ctx.actor)
    return ctx.redirect(f"/bulk/{op_id}")


ROUTES = [
    Route("/bulk", operations, methods=["GET"], name="bulk_list"),
    Route("/bulk", create, methods=["POST"]),
    Route("/bulk/new", confirm, methods=["GET"]),
    Route("/bulk/{op_id:int}", operation, methods=["GET"]),
    Route("/bulk/{op_id:int}/events", operation_events, methods=["GET"]),
    Route("/bulk/{op_id:int}/cancel", cancel, methods=["POST"]),
]
