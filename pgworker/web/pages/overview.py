"""Overview: every queue with its jobs by state (counts stop at a cap), the age of its
oldest due job, a chart of the last hour's finished jobs, its pause and limits, and the
queue actions (pause, resume, set limits: the App's methods, as `pgworker queue`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...errors import ConfigError
from .. import chart
from ..live import overview_stream

QUEUES_SHOWN = 500
CHART_CACHE_SECONDS = 15.0


def overview_data(ctx: Any) -> dict[str, Any]:
    console, cfg = ctx.console, ctx.console.config
    with ctx.app.connection() as c:
        names = set(ctx.store.console_queue_names(c, limit=QUEUES_SHOWN))
        if ctx.app.tasks:
            names.update(ctx.app.queues())
        rows = ctx.store.console_queue_overview(c, sorted(names)[:QUEUES_SHOWN], cap=cfg.count_cap)
        estimate = ctx.store.console_jobs_estimate(c)
    throughput = console.cached("throughput", CHART_CACHE_SECONDS, lambda: _throughput(ctx))
    for row in rows:
        row["chart"] = chart.per_minute(throughput, row["queue"])
        row["finished_hour"] = {s: sum(b[s] for b in row["chart"]) for s in chart.STATES}
    total = chart.per_minute(throughput)
    return {"queues": rows, "total_chart": total, "cap": cfg.count_cap, "estimate": estimate,
            "chart_minutes": chart.covered_minutes(throughput, cfg.throughput_rows),
            "finished_hour": {s: sum(b[s] for b in total) for s in chart.STATES}}


def _throughput(ctx: Any) -> list[dict[str, Any]]:
    with ctx.app.connection() as c:
        return ctx.store.console_throughput(c, limit=ctx.console.config.throughput_rows)


async def overview(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    data = await ctx.db(overview_data, ctx)
    for row in data["queues"]:
        row["svg"] = chart.svg(row["chart"], label=f"jobs finished per minute in queue {row['queue']}")
    data["total_svg"] = chart.svg(data["total_chart"], width=720, height=72, label="jobs finished per minute")
    return console.render(ctx, "overview.html", data)


async def overview_events(request: Request) -> Response:
    console = request.app.state.console
    await console.enter(request)
    return StreamingResponse(overview_stream(console.live_updates(), request.is_disconnected),
                             media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


async def queue_action(request: Request) -> Response:
    console = request.app.state.console
    verb = request.path_params["verb"]
    action = {"pause": "pause", "resume": "resume", "limits": "set_limits"}.get(verb)
    if action is None:
        return Response("unknown queue action", status_code=404)
    ctx = await console.enter(request, action)
    queue = request.path_params["name"]
    if verb == "pause":
        await ctx.db(ctx.app.pause_queue, queue, actor=ctx.actor)
    elif verb == "resume":
        await ctx.db(ctx.app.resume_queue, queue, actor=ctx.actor)
    else:
        form = await request.form()
        limits = parse_limits(form)
        await ctx.db(lambda: ctx.app.configure_queue(queue, actor=ctx.actor, **limits))
    return ctx.redirect(f"/?done={verb}")


def parse_limits(form: Any) -> dict[str, Any]:
    """The limits form: an empty field removes that limit (as `queue set --rate none`)."""
    def number(name: str, kind: type) -> Any:
        text = str(form.get(name) or "").strip()
        if not text or text.lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"{name} {text!r} is not {'an integer' if kind is int else 'a number'}; "
                              "leave it empty to remove the limit") from None

    rate = number("rate", float)
    return {"concurrency_limit": number("concurrency", int), "rate_limit": rate,
            "burst": number("burst", float) if rate is not None else None, "aging": number("aging", float)}


ROUTES = [
    Route("/", overview, methods=["GET"], name="overview"),
    Route("/events/overview", overview_events, methods=["GET"]),
    Route("/queues/{name:path}/{verb}", queue_action, methods=["POST"]),
]
