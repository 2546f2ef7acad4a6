"""Dependencies and graphs: jobs that wait for parents, their edges (sql/queries/dependencies.sql).

The rule that unblocks or cancels children is not here: it is the trigger
``job_dependencies_settle`` (migration 0008_graphs), fired by every statement that finishes a
parent, so no completion path can forget it.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg

from .base import StoreBase
from .plan import Exec, Plan, run


#: Jobs requeued per statement when a replay brings back what a dead parent's death
#: cancelled (dependents_requeue): the loop runs until a statement requeues nothing.
REQUEUE_BATCH = 10_000

#: Rows per keyset page when a graph's jobs are read (cancel_graph, replay_graph).
GRAPH_PAGE = 10_000


class DependencyStatements(StoreBase):
    """Enqueue with parents, and the reads of edges and graphs."""

    def lock_parents(self, conn: psycopg.Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Lock the parents ``ids`` until the transaction ends and mark them as parents;
        returns {id: {state, graph_id, last_error_code}} of those that exist."""
        return run(conn, self.lock_parents_plan(ids))

    def lock_parents_plan(self, ids: Sequence[int]) -> Plan[dict[int, dict[str, Any]]]:
        """:meth:`lock_parents` as a plan (:mod:`pgworker.store.plan`), for the async enqueue too."""
        if not ids:
            return {}
        rows = yield Exec(self.queries["job_parents_lock"], {"ids": sorted(set(ids))}, dict_rows=True)
        return {r["id"]: r for r in rows}

    def insert_graph_jobs_plan(self, rows: dict[str, list[Any]]) -> Plan[dict[int, bool]]:
        """Insert jobs with their dependency columns (see ``jobs_insert_graph``); returns
        {id: due now}."""
        out = yield self._step("jobs_insert_graph", rows)
        return {r[0]: r[1] for r in out}

    def insert_dependencies_plan(self, parents: Sequence[int], children: Sequence[int]) -> Plan[None]:
        """Insert the edges parent -> child (pairs, in the same order)."""
        if parents:
            yield self._step("job_dependencies_insert", {"parents": list(parents), "children": list(children)})

    def job_parents(self, conn: psycopg.Connection, job_id: int, *, limit: int = 100) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["job_parents_list"], {"id": job_id, "limit": limit}).fetchall()

    def job_children(self, conn: psycopg.Connection, job_id: int, *, limit: int = 100) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["job_children_list"], {"id": job_id, "limit": limit}).fetchall()

    def parent_results(self, conn: psycopg.Connection, job_id: int) -> dict[int, Any]:
        """{parent id: its result (None: it returned nothing)} of job ``job_id``."""
        rows = self._exec(conn, "job_parent_results", {"id": job_id}).fetchall()
        return {r[0]: r[2] if r[1] else None for r in rows}

    def existing_graphs_plan(self, graph_ids: Sequence[int]) -> Plan[set[int]]:
        """The ids of ``graph_ids`` that some job of this schema carries as its graph_id."""
        if not graph_ids:
            return set()
        rows = yield self._step("graphs_existing", {"ids": sorted(set(graph_ids))})
        return {r[0] for r in rows}

    def graph_jobs(self, conn: psycopg.Connection, graph_id: int, *, page: int | None = None) -> list[dict[str, Any]]:
        """Every job of the graph, oldest first, read in keyset pages of ``page`` rows
        (default :data:`GRAPH_PAGE`): a cancel or replay of a graph must see all of them."""
        page = page or GRAPH_PAGE
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            rows = cur.execute(self.queries["graph_jobs"], {"graph_id": graph_id, "after": after,
                                                            "limit": page}).fetchall()
            out += rows
            if len(rows) < page:
                return out
            after = rows[-1]["id"]

    def requeue_dependents(self, conn: psycopg.Connection, parents: Sequence[int], *, graph_id: int | None = None,
                           actor: str | None) -> list[int]:
        """:meth:`requeue_dependents_plan`, run on ``conn``."""
        return run(conn, self.requeue_dependents_plan(parents, graph_id=graph_id, actor=actor))

    def requeue_dependents_plan(self, parents: Sequence[int], *, graph_id: int | None = None,
                                actor: str | None) -> Plan[list[int]]:
        """The jobs the death of ``parents`` cancelled (``PARENT_DEAD``; with ``graph_id``,
        every such job of that graph too) wait again for their parents, layer by layer down
        their descendants, when none of their parents is cancelled or still dead (see
        ``dependents_requeue``). Returns the ids requeued, in the order they were. Call it in
        the transaction that replayed ``parents``: the children come back with them or not at all."""
        out: list[int] = []
        frontier = sorted(set(parents))
        while frontier or graph_id is not None:
            rows = yield self._step("dependents_requeue", {
                "parents": frontier, "graph_id": graph_id, "actor": actor, "channel": self.channel,
                "limit": REQUEUE_BATCH})
            more = [r[0] for r in rows]
            if not more:
                return out
            out += more
            # the next layer is below the jobs just requeued; a full batch may have left
            # others of this layer behind, so its parents are asked again
            frontier = sorted(set(more) | (set(frontier) if len(more) >= REQUEUE_BATCH else set()))
        return out

    def dependency_stats(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        """Per queue: jobs waiting for parents, those behind a dead parent, the oldest such wait (s)."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["dependency_stats"]).fetchall()
