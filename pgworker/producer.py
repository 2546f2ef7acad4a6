"""Enqueueing: the insert with its wake-up, for one job, a batch (COPY from 1000 jobs
without keys) or a graph (:mod:`pgworker.dependencies`); the checks before any I/O are
:mod:`pgworker.jobspec`'s. :func:`enqueue` and :func:`enqueue_many` are the App's calls,
taking the App's :class:`pgworker.core.Core`.

With a caller's connection the insert and its NOTIFY run in the caller's transaction:
a rollback leaves neither a job nor a wake-up (NOTIFY is delivered only at commit,
PostgreSQL docs, NOTIFY). Without one, a pooled connection in autocommit mode is used.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import psycopg

from . import tracing
from .connections import require_sync
from .dependencies import enqueue_graph, has_dependencies
from .errors import AlreadyEnqueued, InvalidJob
# re-exported: these were defined here before pgworker.jobspec, and callers import them from here
from .jobspec import JobSpec as JobSpec
from .jobspec import PreparedJob as PreparedJob
from .jobspec import Preparer as Preparer
from .jobspec import prepare as prepare
from .jobspec import serialize_payload as serialize_payload
from .jobspec import specs_from
from .store import Store
from .store.plan import Atomic, Plan, run

if TYPE_CHECKING:
    from .core import Core
    from .metrics import WorkerMetrics

#: What an enqueue does when the job's dedupe key is held: "return" the holder's id
#: (the default), or "raise" :class:`AlreadyEnqueued` (nothing inserted).
ON_CONFLICT = ("return", "raise")


def check_on_conflict(value: object) -> str:
    if value not in ON_CONFLICT:
        raise InvalidJob(f"on_conflict must be 'return' (a held dedupe key returns the holder's id) or "
                         f"'raise' (AlreadyEnqueued), got {value!r}")
    return value


def enqueue(core: Core, spec: JobSpec, *, any_task: bool, on_conflict: str,
            conn: psycopg.Connection | None) -> int:
    """:meth:`pgworker.App.enqueue`: check ``spec`` (nothing written on an error), then insert
    it, through the graph enqueue when it has dependencies; returns the job's id."""
    require_sync(conn, "aenqueue")
    job = core.prepared.one(spec, any_task)
    check_on_conflict(on_conflict)
    with core.connection(conn) as c:
        if has_dependencies(spec) or spec.on_parent_failure is not None:
            return enqueue_graph(core.store, c, [spec], [job], max_parents=core.settings.max_parents,
                                 single=True, metrics=core.metrics)[0]
        return enqueue_one(core.store, c, job, core.metrics, on_conflict)


def enqueue_many(core: Core, jobs: Iterable[Any], *, any_task: bool = False, on_conflict: str = "return",
                 conn: psycopg.Connection | None = None) -> list[int]:
    """:meth:`pgworker.App.enqueue_many`: every item checked first, then one transaction;
    ids in input order."""
    require_sync(conn, "aenqueue_many")
    specs = specs_from(jobs)
    prepared = core.prepared.many(specs, any_task)
    check_on_conflict(on_conflict)
    with core.connection(conn) as c:
        if any(has_dependencies(s) or s.on_parent_failure is not None for s in specs):
            return enqueue_graph(core.store, c, specs, prepared, max_parents=core.settings.max_parents,
                                 metrics=core.metrics)
        return enqueue_batch(core.store, c, prepared, core.metrics, on_conflict)


def enqueue_one(store: Store, conn: psycopg.Connection, job: PreparedJob,
                metrics: "WorkerMetrics | None" = None, on_conflict: str = "return") -> int:
    """Insert one prepared job; returns its id. On a dedupe conflict nothing is inserted
    and the holder's id is returned, or :class:`AlreadyEnqueued` raised (``on_conflict``
    'raise')."""
    return run(conn, enqueue_one_plan(store, job, metrics, on_conflict))


def enqueue_one_plan(store: Store, job: PreparedJob, metrics: "WorkerMetrics | None" = None,
                     on_conflict: str = "return") -> Plan[int]:
    """:func:`enqueue_one` as a plan (:mod:`pgworker.store.plan`), for either kind of connection."""
    if job.dedupe_key is None and job.ordering_key is None and not tracing.enabled():
        # the common case, untraced: one statement and nothing around it
        job_id = yield from store.insert_job_plan(
            queue=job.queue, task=job.task, payload_json=job.payload_json, priority=job.priority,
            run_at=job.run_at, delay_seconds=job.delay_seconds, max_attempts=job.max_attempts, dedupe_key=None,
            ordering_key=None, trace_context=None)
        if metrics:
            metrics.enqueued(job.queue, 1)
        return job_id  # type: ignore[return-value]
    with tracing.send_span(job.queue, task=job.task) as span:
        ctx = tracing.carrier(span)
        ctx_json = json.dumps(ctx) if ctx else None
        for _ in range(10):
            job_id = yield from store.insert_job_plan(
                queue=job.queue, task=job.task, payload_json=job.payload_json,
                priority=job.priority, run_at=job.run_at, delay_seconds=job.delay_seconds,
                max_attempts=job.max_attempts, dedupe_key=job.dedupe_key,
                ordering_key=job.ordering_key, trace_context=ctx_json,
                dedupe_window_seconds=job.dedupe_window_seconds, dead_blocks_key=job.dead_blocks_key)
            if job_id is not None:
                if metrics:
                    metrics.enqueued(job.queue, 1)
                result = job_id
                break
            # The key is held: return the holder's id. The holder can finish between the
            # insert and this lookup, or its hold have expired (released by the lookup);
            # then the insert is tried again, and the unique index decides once more.
            holders = yield from store.dedupe_holders_plan([job.dedupe_key])  # type: ignore[list-item]
            holder = holders.get(job.dedupe_key)  # type: ignore[arg-type]
            if holder is not None:
                if span.is_recording():
                    span.set_attribute("pgworker.dedupe.duplicate", True)
                if on_conflict == "raise":
                    raise AlreadyEnqueued(job.dedupe_key, holder)  # type: ignore[arg-type]
                result = holder
                break
        else:  # pragma: no cover - needs a job finishing and reappearing 10 times in a row
            raise InvalidJob(f"dedupe key {job.dedupe_key!r} kept changing hands; try again")
        if span.is_recording():
            span.set_attribute("messaging.message.id", str(result))
        return result


# From this many jobs without keys, a bulk enqueue uses COPY (five round trips, then the
# fastest way to load rows); below it, one INSERT ... SELECT FROM unnest() statement.
COPY_MIN_JOBS = 1000


def enqueue_batch(store: Store, conn: psycopg.Connection, jobs: Sequence[PreparedJob],
                  metrics: "WorkerMetrics | None" = None, on_conflict: str = "return") -> list[int]:
    """Insert many prepared jobs: without dedupe or ordering keys, one statement for up to
    ``COPY_MIN_JOBS`` jobs, else COPY; with keys, a multi-row insert after the key locks;
    one NOTIFY per queue with a job due now.

    Returns ids in input order; a job refused by its dedupe key gets the id of the job
    holding the key, or with ``on_conflict='raise'`` the batch raises :class:`AlreadyEnqueued`
    (``held_by``: {position: holder id}) and inserts nothing (a savepoint in the caller's
    transaction, which stays usable). Runs in one transaction (inside the caller's, if any).
    """
    return run(conn, enqueue_batch_plan(store, jobs, metrics, on_conflict))


def enqueue_batch_plan(store: Store, jobs: Sequence[PreparedJob], metrics: "WorkerMetrics | None" = None,
                       on_conflict: str = "return") -> Plan[list[int]]:
    """:func:`enqueue_batch` as a plan (:mod:`pgworker.store.plan`), for either kind of connection."""
    if not jobs:
        return []
    queues = sorted({j.queue for j in jobs})
    with tracing.send_span(queues[0] if len(queues) == 1 else "multiple", batch=len(jobs)) as span:
        ctx = tracing.carrier(span)
        ctx_json = json.dumps(ctx) if ctx else None
        keyed = any(j.dedupe_key is not None or j.ordering_key is not None for j in jobs)
        if not keyed and len(jobs) < COPY_MIN_JOBS:
            # the common case: one statement (one round trip; on an autocommit connection,
            # one transaction), ids in input order
            ids, counts = yield from store.insert_jobs_batch_plan(jobs, ctx_json)
            if metrics:
                for q, n in counts.items():
                    metrics.enqueued(q, n)
            return ids
        if not keyed:  # a large batch: COPY (its fixed round trips amortised over the rows)
            ids, counts = yield Atomic(_copy_plan(store, jobs, ctx_json), savepoint=on_conflict == "raise")
            if metrics:
                for q, n in counts.items():
                    metrics.enqueued(q, n)
            return ids  # type: ignore[no-any-return]
        ids, inserted, out = yield Atomic(_keyed_plan(store, jobs, ctx_json, on_conflict),
                                          savepoint=on_conflict == "raise")
        if metrics:
            counts = defaultdict(int)
            for i, j in zip(ids, jobs):
                if i in inserted:
                    counts[j.queue] += 1
            for q, n in counts.items():
                metrics.enqueued(q, n)
        return out  # type: ignore[no-any-return]


def _copy_plan(store: Store, jobs: Sequence[PreparedJob], ctx_json: str | None
               ) -> Plan[tuple[list[int], dict[str, int]]]:
    """The transaction of a COPY batch: (the ids in input order, {queue: jobs})."""
    ids, db_now = yield from store.allocate_ids_plan(len(jobs), (j.queue for j in jobs))
    counts, due = yield from store.copy_jobs_plan(ids, jobs, db_now, ctx_json)
    yield from store.claim_backdate_plan(j.queue for j in jobs if j.run_at is not None and j.run_at < db_now)
    yield from store.notify_queues_plan(due)
    return ids, counts


def _keyed_plan(store: Store, jobs: Sequence[PreparedJob], ctx_json: str | None,
                on_conflict: str) -> Plan[tuple[list[int], dict[int, bool], list[int]]]:
    """The transaction of a keyed batch: (reserved ids, {inserted id: due now}, result)."""
    ids, db_now = yield from store.allocate_ids_plan(len(jobs), (j.queue for j in jobs))
    # run_at from the database clock, as single enqueues do
    run_ats = [j.run_at or (db_now + timedelta(seconds=j.delay_seconds) if j.delay_seconds else db_now)
               for j in jobs]
    yield from store.claim_backdate_plan(j.queue for j, at in zip(jobs, run_ats) if at < db_now)
    # a job refused by its dedupe key gets the holder's id
    inserted, holders = yield from store.insert_jobs_many_plan({
        "ids": ids, "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs],
        "payloads": [j.payload_json for j in jobs],
        "priorities": [j.priority for j in jobs], "run_ats": run_ats,
        "max_attempts": [j.max_attempts for j in jobs],
        "dedupe_keys": [j.dedupe_key for j in jobs],
        "dedupe_windows": [j.dedupe_window_seconds for j in jobs],
        "ordering_keys": [j.ordering_key for j in jobs],
        "dead_blocks_keys": [j.dead_blocks_key for j in jobs],
        "trace_contexts": [ctx_json] * len(jobs)})
    if holders and on_conflict == "raise":  # undone by the enclosing Atomic's savepoint
        raise AlreadyEnqueued(jobs[min(holders)].dedupe_key, holders[min(holders)],  # type: ignore[arg-type]
                              held_by=holders)
    yield from store.notify_queues_plan({j.queue for i, j in zip(ids, jobs) if inserted.get(i)})
    out = [holders.get(pos, i) for pos, i in enumerate(ids)]
    return ids, inserted, out
