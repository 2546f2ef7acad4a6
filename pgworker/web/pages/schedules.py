"""Schedules: each periodic job with its last and next slot, and whether the App this
console runs with still declares it (``--app``; without one that is unknown)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def schedules_data(ctx: Any) -> dict[str, Any]:
    return {"schedules": ctx.app.list_schedules(), "app_known": bool(ctx.app.tasks or ctx.app.schedules)}


async def schedules(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    return console.render(ctx, "schedules.html", await ctx.db(schedules_data, ctx))


ROUTES = [Route("/schedules", schedules, methods=["GET"], name="schedules")]
