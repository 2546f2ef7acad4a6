"""Graphs of jobs: helpers that build one in a call (a chain, a group with a callback),
and the operations on a whole graph (cancel, replay). See docs/graphs.md.

A graph is the set of jobs sharing a ``graph_id`` (the id of its first job). The
helpers are ``enqueue_many`` calls with ``ref``/``depends_on``: one transaction, every
job validated before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from . import operations
from .errors import InvalidJob
from .jobspec import specs_from
from .names import check_id, checked_cancel_reason
from .producer import enqueue_many

if TYPE_CHECKING:
    import psycopg

    from .core import Core


class Graph(NamedTuple):
    """An enqueued graph: its id (its first job's) and its jobs' ids in the order given."""

    graph_id: int
    ids: list[int]


def chain(core: Core, jobs: Sequence[Any], *, on_parent_failure: str | None = None,
          conn: "psycopg.Connection | None" = None) -> Graph:
    """Enqueue ``jobs`` (JobSpec, dicts, or (task, payload) tuples) so that each runs after
    the previous one succeeded: job k depends on job k-1. ``on_parent_failure``: the
    policy of every job but the first ('hold' by default). Returns the :class:`Graph`."""
    specs = specs_from(jobs)
    if not specs:
        raise InvalidJob("chain() needs at least one job")
    out = []
    for k, spec in enumerate(specs):
        deps = [f"chain:{k - 1}"] if k else None
        out.append(spec._replace(ref=f"chain:{k}", depends_on=deps,
                                 on_parent_failure=on_parent_failure if k else spec.on_parent_failure))
    ids = enqueue_many(core, out, conn=conn)
    return Graph(ids[0], ids)


def group(core: Core, jobs: Sequence[Any], *, callback: Any = None, on_parent_failure: str | None = None,
          conn: "psycopg.Connection | None" = None) -> Graph:
    """Enqueue ``jobs`` to run independently (in parallel), and ``callback`` (one job, as in
    ``jobs``) to run once every one of them succeeded: its context's
    ``parent_results()`` gives their results. ``on_parent_failure``: the callback's
    policy. Returns the :class:`Graph`; the callback's id is last."""
    specs = [s._replace(ref=f"group:{k}") for k, s in enumerate(specs_from(jobs))]
    if not specs:
        raise InvalidJob("group() needs at least one job")
    if callback is not None:
        [cb] = specs_from([callback])
        specs.append(cb._replace(depends_on=[s.ref for s in specs], on_parent_failure=on_parent_failure))
    ids = enqueue_many(core, specs, conn=conn)
    return Graph(ids[0], ids)


def cancel_graph(core: Core, graph_id: int, *, actor: str | None = None,
                 reason: str | None = None) -> dict[str, Any]:
    """Cancel every unfinished job of a graph: pending and dead ones at once, running ones
    by a request (their workers see it at the next renewal). Children waiting for a
    cancelled job are cancelled by the dependency rule. ``reason`` is kept in the audit
    event of each job this cancels (as :meth:`App.cancel`'s). Returns {jobs, cancelled,
    requested}: the graph's size and what changed."""
    check_id(graph_id, "graph id")
    checked_cancel_reason(reason)  # a refused reason refuses the whole graph, before any job changes
    with core.connection() as c:
        jobs = core.store.graph_jobs(c, graph_id)
    cancelled = requested = 0
    for job in jobs:  # roots first (ids grow): their children follow them through the trigger
        if job["state"] in ("pending", "running", "dead"):
            outcome = operations.cancel(core, job["id"], actor=actor, conn=None, reason=reason)
            cancelled += outcome == "cancelled"
            requested += outcome == "running"
    return {"jobs": len(jobs), "cancelled": cancelled, "requested": requested}


class ReplayedGraph(list):  # type: ignore[type-arg]
    """The ids :func:`replay_graph` put back (a list, dead ones first), with ``replayed``
    (dead jobs back to pending) and ``requeued`` (jobs a dead parent had cancelled, waiting
    again) apart, and ``held_by`` ({dead job id: the live job holding its dedupe key}, as
    :class:`pgworker.ReplayResult`'s: those stayed dead)."""

    replayed: list[int]
    requeued: list[int]
    held_by: dict[int, int]


def graph_states(core: Core, graph_id: int) -> dict[str, int]:
    """{state: jobs} of a graph; {} when no job carries ``graph_id`` (no such graph, or
    all its jobs were pruned)."""
    check_id(graph_id, "graph id")
    with core.connection() as c:
        jobs = core.store.graph_jobs(c, graph_id)
    out: dict[str, int] = {}
    for job in jobs:
        out[job["state"]] = out.get(job["state"], 0) + 1
    return out


#: Dead jobs of a graph put back per replay call (each one transaction).
REPLAY_CHUNK = 1000


def replay_graph(core: Core, graph_id: int, *, actor: str | None = None) -> ReplayedGraph:
    """Replay a graph: its dead jobs go back to pending (as ``replay``), and its jobs that
    a dead parent cancelled (``PARENT_DEAD``) wait again for their parents. Jobs whose
    parent was cancelled stay cancelled. Returns the ids replayed or requeued
    (:class:`ReplayedGraph`: a list, with the two kinds apart)."""
    check_id(graph_id, "graph id")
    with core.connection() as c:
        dead = [j["id"] for j in core.store.graph_jobs(c, graph_id) if j["state"] == "dead"]
    replayed: list[int] = []
    requeued: list[int] = []
    held_by: dict[int, int] = {}
    # In chunks of REPLAY_CHUNK ids, each its own replay (one transaction): a graph with
    # more dead jobs than one replay takes is replayed whole (it stopped at the first
    # 1,000). A crash between chunks leaves the rest dead; calling again finishes it.
    for start in range(0, len(dead), REPLAY_CHUNK):
        chunk = dead[start:start + REPLAY_CHUNK]
        result = operations.replay(core, chunk, queue=None, limit=len(chunk), actor=actor, clean=False)
        replayed += result
        # the replay brought back what its jobs' death cancelled
        requeued += result.requeued
        held_by.update(result.held_by)
    # the graph's own pass also finds jobs a parent replayed earlier left cancelled (the
    # same statement, by graph id)
    with core.connection() as c:
        requeued += core.store.requeue_dependents(c, [], graph_id=graph_id, actor=actor or "pgworker")
    out = ReplayedGraph(replayed + requeued)
    out.replayed, out.requeued, out.held_by = replayed, requeued, held_by
    return out
