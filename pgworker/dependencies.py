"""Enqueueing jobs that depend on other jobs: validation, parent locks, the insert with its edges.

The model (docs/graphs.md): a job with parents goes in pending and blocked, with
``waiting_parents`` = its parents that have not succeeded; the trigger
``job_dependencies_settle`` (migration 0008_graphs) counts each parent's success down in the
statement that records it, and unblocks the job when the count reaches 0. This module
only builds graphs; it never decides when a job runs.

What is refused, before anything is written (:class:`InvalidJob`, a ``ValueError``):
a parent that does not exist in this schema (a job of another schema is not one), a
cancelled parent, a dead one under the 'cancel' policy, more than ``max_parents``
parents, a ``ref`` that names no earlier job of the same call (so that no cycle can be
written), a ``graph_id`` that no job of the schema carries (a graph exists once its first
job does), and ``depends_on`` with a dedupe or ordering key (a duplicate would leave its
children waiting for a job that was never inserted; the ordering key owns ``blocked``).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from . import tracing
from .errors import InvalidJob
from .jobspec import JobSpec, PreparedJob
from .store import Store
from .store.plan import Atomic, Plan, run

if TYPE_CHECKING:
    from .metrics import WorkerMetrics

POLICIES = {"hold": False, "cancel": True}


def has_dependencies(spec: JobSpec) -> bool:
    return bool(spec.depends_on) or spec.ref is not None or spec.graph_id is not None


def _policy(value: str | None) -> bool:
    if value is None:
        return False
    if value not in POLICIES:
        raise InvalidJob(f"on_parent_failure must be 'hold' or 'cancel', got {value!r}")
    return POLICIES[value]


def _parents(spec: JobSpec, max_parents: int) -> list["int | str"]:
    deps = spec.depends_on or ()
    if isinstance(deps, (str, int)):
        raise InvalidJob("depends_on must be a list of job ids (or refs), not a single value: depends_on=[...]")
    if not isinstance(deps, (list, tuple)):  # a dict (its keys), a set (no order), a generator (read once)
        raise InvalidJob(f"depends_on must be a list or tuple of job ids (or refs), got a {type(deps).__name__}: "
                         "pass depends_on=[id, ...] (list(...) of it)")
    out: list[int | str] = []
    seen: set[Any] = set()
    for d in deps:
        if isinstance(d, bool) or not isinstance(d, (int, str)):
            raise InvalidJob(f"depends_on holds job ids (int) or refs (str) of the same call, got {d!r}")
        if isinstance(d, int) and not 0 < d < 2**63:  # a bigint id; PostgreSQL's error otherwise
            raise InvalidJob(f"depends_on names job id {d}, which no job can have (ids are 1 to 2**63-1)")
        if d not in seen:
            seen.add(d)
            out.append(d)
    if len(out) > max_parents:
        raise InvalidJob(f"a job may depend on at most max_parents ({max_parents}) jobs, got {len(out)}; "
                         "join them through an intermediate job, or raise PGWORKER_MAX_PARENTS")
    if spec.dedupe_key is not None or spec.ordering_key is not None:
        raise InvalidJob(f"{_dependency_options(spec)} cannot be combined with {_key_options(spec)} "
                         "(nothing was enqueued)")
    return out


def _dependency_options(spec: JobSpec) -> str:
    """The dependency options ``spec`` was given, as the error naming them says them."""
    given = [name for name, on in (("depends_on", bool(spec.depends_on)), ("ref", spec.ref is not None),
                                   ("graph_id", spec.graph_id is not None)) if on]
    return " and ".join(given) or "depends_on"


def _key_options(spec: JobSpec) -> str:
    given = [name for name, value in (("dedupe_key", spec.dedupe_key), ("ordering_key", spec.ordering_key))
             if value is not None]
    return " and ".join(given)


def enqueue_graph(store: Store, conn: psycopg.Connection, specs: Sequence[JobSpec], jobs: Sequence[PreparedJob], *,
                  max_parents: int, single: bool = False, metrics: "WorkerMetrics | None" = None) -> list[int]:
    """Insert ``jobs`` (prepared from ``specs``, same order) with their dependencies, in one
    transaction (a savepoint-free group in the caller's, if any). Returns ids in input order.

    ``single``: an ``enqueue`` of one job (its graph is its parents', or none) rather than
    a call of ``enqueue_many`` (its jobs form a graph, the first job's id by default).
    """
    return run(conn, enqueue_graph_plan(store, specs, jobs, max_parents=max_parents, single=single,
                                        metrics=metrics))


def enqueue_graph_plan(store: Store, specs: Sequence[JobSpec], jobs: Sequence[PreparedJob], *, max_parents: int,
                       single: bool = False, metrics: "WorkerMetrics | None" = None) -> Plan[list[int]]:
    """:func:`enqueue_graph` as a statement plan (:mod:`pgworker.store.plan`): the sync and
    the async enqueue (``App.aenqueue``) run it. The checks that need no database run
    here, at once, before any statement: :class:`InvalidJob` is raised by this call."""
    refs, parents_of = _checked(specs, max_parents, single)
    return _graph_plan(store, specs, jobs, refs, parents_of, single, metrics)


def _checked(specs: Sequence[JobSpec], max_parents: int,
             single: bool) -> tuple[dict[str, int], list[list["int | str"]]]:
    """Validate a call's dependency options; returns {ref: position} and each job's parents."""
    refs: dict[str, int] = {}
    parents_of: list[list[int | str]] = []
    for pos, spec in enumerate(specs):
        if spec.dedupe_key is not None or spec.ordering_key is not None:
            raise InvalidJob(f"{_dependency_options(spec)} cannot be combined with {_key_options(spec)} "
                             "(nothing was enqueued)" if single else
                             f"job {pos} of the call: a call with dependencies cannot carry a dedupe_key or "
                             "ordering_key; enqueue those jobs in a call of their own (nothing was enqueued)")
        deps = _parents(spec, max_parents)
        if single and spec.depends_on is None and spec.on_parent_failure is not None:
            # a policy for parents it was given none of, dropped without a word (a trial's
            # `pgworker enqueue --on-parent-failure cancel` without --depends-on); a list
            # built at run time may be empty (depends_on=[]: a break-it trial), and goes
            raise InvalidJob(f"on_parent_failure={spec.on_parent_failure!r} is what a job does when a parent fails, "
                             "and this job has none: give depends_on=[...] too (CLI: --depends-on ID), or leave "
                             "it out (nothing was enqueued)")
        for d in deps:
            if isinstance(d, str) and d not in refs:
                # a job id given as text reads as a ref (a new user's trial: "ref '1'")
                as_id = f"; a job id is an int: depends_on=[{d.strip()}]" if d.strip().isdigit() else ""
                raise InvalidJob(f"job {pos} of the call depends on ref {d!r}, which names no earlier job of the "
                                 f"same call; list parents before their children{as_id} (nothing was enqueued)")
        parents_of.append(deps)
        _policy(spec.on_parent_failure)
        if spec.ref is not None:
            if not isinstance(spec.ref, str) or not spec.ref:
                raise InvalidJob(f"ref must be a non-empty string, got {spec.ref!r}")
            if spec.ref in refs:
                raise InvalidJob(f"ref {spec.ref!r} names two jobs of the same call")
            refs[spec.ref] = pos
        if spec.graph_id is not None and (isinstance(spec.graph_id, bool) or not isinstance(spec.graph_id, int)):
            raise InvalidJob(f"graph_id must be a job id (int), got {spec.graph_id!r}")
        if spec.graph_id is not None and not 0 < spec.graph_id < 2**63:
            raise InvalidJob(f"graph_id {spec.graph_id} is no job id (ids are 1 to 2**63-1)")
    return refs, parents_of


def _graph_plan(store: Store, specs: Sequence[JobSpec], jobs: Sequence[PreparedJob], refs: dict[str, int],
                parents_of: list[list["int | str"]], single: bool,
                metrics: "WorkerMetrics | None") -> Plan[list[int]]:
    with tracing.send_span(jobs[0].queue, batch=len(jobs)) as span:
        ids: list[int] = yield Atomic(_insert_plan(store, specs, jobs, refs, parents_of, single, tracing.carrier(span)))
    if metrics:
        for q, n in Counter(j.queue for j in jobs).items():
            metrics.enqueued(q, n)
    return ids


def _insert_plan(store: Store, specs: Sequence[JobSpec], jobs: Sequence[PreparedJob], refs: dict[str, int],
                 parents_of: list[list["int | str"]], single: bool, ctx: dict[str, str] | None) -> Plan[list[int]]:
    external = sorted({d for deps in parents_of for d in deps if isinstance(d, int)})
    ctx_json = json.dumps(ctx) if ctx else None
    found = yield from store.lock_parents_plan(external)
    missing = [i for i in external if i not in found]
    if missing:
        raise InvalidJob(f"depends_on names jobs that do not exist in schema {store.schema!r}: "
                         f"{', '.join(map(str, missing[:10]))}{' ...' if len(missing) > 10 else ''}; "
                         "a parent must be enqueued (in this schema) before its children; nothing was enqueued")
    named = {spec.graph_id for spec in specs if spec.graph_id is not None}
    unknown = sorted(named - (yield from store.existing_graphs_plan(sorted(named))))
    if unknown:
        raise InvalidJob(f"graph_id names no graph in schema {store.schema!r}: {', '.join(map(str, unknown[:10]))} "
                         "(no job carries it; a graph's id is its first job's, as Graph.graph_id returns); "
                         "omit graph_id to start a graph or join the parents'; nothing was enqueued")
    ids, db_now = yield from store.allocate_ids_plan(len(jobs), (j.queue for j in jobs))
    parents_graph = min((p["graph_id"] for p in found.values() if p["graph_id"] is not None), default=None)
    default_graph = parents_graph if single else (parents_graph or ids[0])
    waiting, has_children, edges_p, edges_c, graphs, policies = [], [False] * len(jobs), [], [], [], []
    for pos, (spec, deps) in enumerate(zip(specs, parents_of)):
        cancel = _policy(spec.on_parent_failure)
        n = 0
        for d in deps:
            if isinstance(d, str):
                parent_id = ids[refs[d]]
                has_children[refs[d]] = True
                n += 1
            else:
                parent_id = d
                state = found[d]["state"]
                if state == "cancelled" or (state == "dead" and cancel):
                    raise InvalidJob(f"parent job {d} is {state}: a child enqueued now could never run "
                                     f"({'cancelled parents cancel their children' if state == 'cancelled' else 'policy cancel'}); "
                                     "replay the parent first, or enqueue without it; nothing was enqueued")
                n += state != "succeeded"
            edges_p.append(parent_id)
            edges_c.append(ids[pos])
        waiting.append(n)
        policies.append(cancel)
        graphs.append(spec.graph_id if spec.graph_id is not None else default_graph)
    run_ats = [j.run_at or (db_now + timedelta(seconds=j.delay_seconds) if j.delay_seconds else db_now)
               for j in jobs]
    yield from store.claim_backdate_plan(j.queue for j, at in zip(jobs, run_ats) if at < db_now)
    due = yield from store.insert_graph_jobs_plan({
        "ids": ids, "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs],
        "payloads": [j.payload_json for j in jobs], "priorities": [j.priority for j in jobs],
        "run_ats": run_ats, "max_attempts": [j.max_attempts for j in jobs],
        "trace_contexts": [ctx_json] * len(jobs), "waiting": waiting, "has_children": has_children,
        "cancel_on_parent_failure": policies, "graph_ids": graphs})
    yield from store.insert_dependencies_plan(edges_p, edges_c)
    yield from store.notify_queues_plan({j.queue for i, j in zip(ids, jobs) if due.get(i)})
    return ids


def check_specs(specs: Sequence[JobSpec], max_parents: int) -> None:
    """The checks of :func:`enqueue_graph` that need no database, for callers that
    prepare first (so bad input is refused before any statement)."""
    for spec in specs:
        _parents(spec, max_parents)
        _policy(spec.on_parent_failure)
