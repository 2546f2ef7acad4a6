"""The job page's sections of issue 21 (docs/results.md, docs/graphs.md): what the
handler returned, how far a running job has come, and where the job stands in its graph.
Each is a loader ``(ctx, job) -> dict`` for :data:`pgworker.web.pages.job.SECTIONS`,
reading what ``get_job`` already holds (no statement of its own).

The values come redacted: :func:`pgworker.web.pages.job.job_data` redacts ``result``
like the payload before any loader runs, so the JSON API, which returns the same job,
never carries what the page hides.
"""

from __future__ import annotations

from typing import Any

from ..render import pretty

#: Parents and children a job page lists at most (the limit of job_parents_list and
#: job_children_list in get_job: a fan-in of 1,000 parents is not one page's table).
RELATIVES_SHOWN = 100


def result_section(ctx: Any, job: dict[str, Any]) -> dict[str, Any]:
    """``result_text``: the (already redacted) result, pretty-printed and cut at the
    payload's bound (``payload_max_chars``); None when the job stored no result."""
    if "result" not in job:
        return {"result_text": None}
    return {"result_text": pretty(job["result"], ctx.console.config.payload_max_chars)}


def progress_section(ctx: Any, job: dict[str, Any]) -> dict[str, Any]:
    """``progress``: {"percent": 0.0-100.0 or None, "message", "at"} once the job has
    reported progress (``ctx.progress``), else None."""
    if job.get("progress_at") is None:
        return {"progress": None}
    value = job.get("progress")
    return {"progress": {"percent": None if value is None else round(float(value) * 100, 1),
                         "message": job.get("progress_message"), "at": job["progress_at"]}}


def dependencies_section(ctx: Any, job: dict[str, Any]) -> dict[str, Any]:
    """``dependencies``: the parents and children (id, task, state, last error code; a
    child's waiting_parents), the policy on a parent's failure, the parents still awaited
    and the graph id, when the job has any of them; else None."""
    parents = job.get("parents") or []
    children = job.get("children") or []
    if not parents and not children and job.get("graph_id") is None:
        return {"dependencies": None}
    return {"dependencies": {"parents": parents, "children": children,
                             "on_parent_failure": job.get("on_parent_failure"),
                             "waiting_parents": job.get("waiting_parents") or 0,
                             "graph_id": job.get("graph_id"), "cap": RELATIVES_SHOWN}}
