"""Workers: the pods of the registry (``pods``, refreshed by each supervisor on the
renewer's cadence), their claimers, queues, versions, what each claimer holds now and
when the pod last refreshed. A pod not seen for ``GONE_AFTER_RENEWALS`` renewal
intervals reads as gone (:func:`pgworker.status.pod_status`) (its row is pruned later); nothing recovers jobs from this page's
data: the reaper decides from leases alone."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...status import GONE_AFTER_RENEWALS, pod_status

PODS_SHOWN = 500


def workers_data(ctx: Any) -> dict[str, Any]:
    renew_interval = ctx.app.settings.effective_renew_interval
    gone_after = GONE_AFTER_RENEWALS * renew_interval
    with ctx.app.connection() as c:
        pods = ctx.store.pods_list(c, limit=PODS_SHOWN)
    for pod in pods:
        pod["status"] = pod_status(pod, renew_interval)
        pod["holding"] = sum(int(cl.get("holding", 0)) for cl in pod["claimers"])
    alive = [p for p in pods if p["status"] == "alive"]
    return {"pods": pods, "alive": len(alive), "gone_after": gone_after,
            "claimers": sum(len(p["claimers"]) for p in alive), "holding": sum(p["holding"] for p in alive)}


async def workers(request: Request) -> Response:
    console = request.app.state.console
    ctx = await console.enter(request)
    return console.render(ctx, "workers.html", await ctx.db(workers_data, ctx))


ROUTES = [Route("/workers", workers, methods=["GET"], name="workers")]
