"""What `pgworker status` reports, read without reading the retained history.

- Live jobs per queue, exact: ``due`` (pending, its run_at has come), ``scheduled``
  (pending, run_at later), ``blocked`` (behind its ordering key's head), ``running`` and
  ``dead``, with the age of the oldest due job and the running jobs whose lease expired:
  the statistics statement of /metrics (``queue_stats``), for the queues that
  ``queues_live`` finds (a few index descents per queue).
- Finished jobs of the whole table by state (succeeded, cancelled): counted up to
  :data:`FINISHED_COUNT_LIMIT` each on their index, past that the planner's estimate.
  Per queue they would be a read of the history; the workers' counters
  (``pgworker_jobs_finished_total``) have them by queue.
- The queues' settings rows (paused queues) and the ordering keys held by a dead job.
- The queues holding due jobs that no live pod of the registry (``pods``) claims from: a
  misspelt ``queue=`` at enqueue, or a queue no deployment was given, waits forever
  otherwise. Only said when some pod is alive (between drain runs none is).

So the cost of a status is bounded by the live jobs and the limit, whatever retention
keeps (it grouped over every row: 17,595 buffers on a modest table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from .catalogue import STATS_STATES

FINISHED_COUNT_LIMIT = 10_000
PODS_READ = 500
#: A pod not seen for this many renewal intervals reads as gone (the console's Workers
#: page, and `pgworker status`'s queues that no live pod claims).
GONE_AFTER_RENEWALS = 3


def pod_status(pod: dict[str, Any], renew_interval: float) -> str:
    """``"stopped"``, ``"gone"`` or ``"alive"`` for a row of ``pods_list`` (its
    ``stopped_at`` and ``seen_seconds_ago``, seconds by the database clock), given the
    renewal interval in seconds that pods refresh their rows on."""
    if pod["stopped_at"]:
        return "stopped"
    return "gone" if pod["seen_seconds_ago"] > GONE_AFTER_RENEWALS * renew_interval else "alive"


@dataclass
class StatusReport:
    """``figures``: one row per queue (see ``Store.queue_figures``); ``finished``: one row
    per finished state with ``jobs`` and whether it is ``estimated``; ``queues``: the
    settings rows (``Store.list_queues``); ``blocked``: keys held by a dead job;
    ``unclaimed``: see the module docstring."""

    figures: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    blocked: list[dict[str, Any]] = field(default_factory=list)
    #: Queues with due jobs that no live pod claims: ``queue``, ``due``, and
    #: ``claimed`` (every queue the live pods claim, sorted).
    unclaimed: list[dict[str, Any]] = field(default_factory=list)

    def state_rows(self) -> list[dict[str, Any]]:
        """One row per queue and live state holding jobs, then one per finished state of
        the whole table (``queue`` None): ``queue``, ``state``, ``jobs``,
        ``oldest_due_age_seconds`` (due rows), ``expired_leases`` (running rows),
        ``paused``, ``estimated`` (True when ``jobs`` is the planner's estimate), and for a
        finished state of a table never analyzed ``more_than`` (``jobs`` is then only the
        count's limit, which it exceeds)."""
        paused = {q["name"] for q in self.queues if q.get("paused_at") is not None}
        rows = []
        for f in self.figures:
            for state in STATS_STATES:
                if f[state]:
                    rows.append({"queue": f["queue"], "state": state, "jobs": f[state],
                                 "oldest_due_age_seconds": f["oldest_due_age_seconds"] if state == "due" else None,
                                 "expired_leases": f["expired_leases"] if state == "running" else None,
                                 "paused": f["queue"] in paused, "estimated": False})
            if f.get("waiting_on_parents"):  # pending and blocked until their parents succeed
                rows.append({"queue": f["queue"], "state": "waiting_on_parents", "jobs": f["waiting_on_parents"],
                             "oldest_due_age_seconds": None, "expired_leases": None,
                             "paused": f["queue"] in paused, "estimated": False})
        for f in self.finished:
            if f["jobs"]:
                row = {"queue": None, "state": f["state"], "jobs": f["jobs"], "oldest_due_age_seconds": None,
                       "expired_leases": None, "paused": False, "estimated": f["estimated"]}
                if f.get("more_than"):
                    row["more_than"] = True
                rows.append(row)
        return rows

    def totals(self) -> dict[str, int]:
        """Jobs by state over every queue (finished states as in :meth:`state_rows`)."""
        out: dict[str, int] = {}
        for r in self.state_rows():
            out[r["state"]] = out.get(r["state"], 0) + r["jobs"]
        return out


def status_reads(app: Any, conn: psycopg.Connection) -> StatusReport:
    """Everything `pgworker status` reads, on ``conn`` (see the module docstring)."""
    store = app.store
    figures = store.queue_figures(conn, store.live_queues(conn))
    finished = []
    for row in store.finished_counts(conn, limit=FINISHED_COUNT_LIMIT + 1):
        if row["counted"] <= FINISHED_COUNT_LIMIT:
            finished.append({"state": row["state"], "jobs": row["counted"], "estimated": False})
        elif row["estimated"] is None:  # more than the limit, and never analyzed: no estimate at all
            finished.append({"state": row["state"], "jobs": FINISHED_COUNT_LIMIT, "estimated": True,
                             "more_than": True})
        else:  # more than the limit: the estimate, never below what was counted
            jobs = max(row["estimated"], row["counted"])
            finished.append({"state": row["state"], "jobs": jobs, "estimated": True})
    return StatusReport(figures=figures, finished=finished, queues=store.list_queues(conn),
                        blocked=store.dead_blocked_keys(conn),
                        unclaimed=unclaimed_queues(figures, _pods(store, conn), app.settings.effective_renew_interval))


def _pods(store: Any, conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The registry's rows, or none when this role may not read them (a producer role
    granted before the registry's column grant: `pgworker sql grants` gives it)."""
    try:
        with conn.transaction():
            return store.pods_claiming(conn, limit=PODS_READ)
    except psycopg.errors.InsufficientPrivilege:
        return []


def unclaimed_queues(figures: list[dict[str, Any]], pods: list[dict[str, Any]],
                     renew_interval: float) -> list[dict[str, Any]]:
    """The queues of ``figures`` with due jobs that no alive pod of ``pods`` (rows of
    ``pods_list``) claims; empty when no pod is alive."""
    alive = [p for p in pods if pod_status(p, renew_interval) == "alive"]
    if not alive:
        return []
    claimed = sorted({q for p in alive for q in p["queues"]})
    return [{"queue": f["queue"], "due": f["due"], "claimed": claimed}
            for f in figures if f["due"] and f["queue"] not in claimed]
