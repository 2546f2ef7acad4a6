"""The index entries each transition of a job inserts into the jobs table's indexes, pinned.

The server's cost per job (CPU, WAL) is the one figure that does not scale out (issue 23,
docs/architecture.md "Indexes"): every index entry a transition inserts is a B-tree
descent, a page write and WAL, and later work for VACUUM. An UPDATE that is not HOT
inserts one entry into every index whose predicate the new row version satisfies, the
primary key included, even when that index's key did not change; a HOT update inserts
none (PostgreSQL docs, "Heap-Only Tuples"). So the primary key's column below is the
number of non-HOT row versions a transition writes, and a new index, a wider predicate or
an update that stops being HOT changes a pinned number here. Change them on purpose only,
with the reason in the commit.

How: on a fresh schema (a handful of rows: no page ever fills, so no B-tree page splits,
deduplicates or deletes; autovacuum off for the table), each transition runs on its own
job (its own queue, so a claim takes exactly that job), and every index's leaf items are
counted before and after with pageinspect (``bt_page_items``; a posting list counts each
heap TID, the high key of a non-rightmost page is not an entry). Dead items count:
an insert is an insert. Exact and fast; nothing here measures time.

CREATE EXTENSION pageinspect needs a superuser (the tests' server on this machine and in
CI has one): the test skips, naming the fix, where it cannot (fails under PGWORKER_STRICT=1).
"""

from __future__ import annotations

from typing import Any, Callable

import psycopg
import pytest
from psycopg import sql

from pg import wait_until
from pgcluster import require

from pgworker import App, Permanent

pytestmark = pytest.mark.integration

# Every index of the jobs table. A new one must be added here with the entries it costs.
INDEXES = ("jobs_pkey", "jobs_claim_idx", "jobs_due_idx", "jobs_dead_idx",
           "jobs_dedupe_key_idx", "jobs_ordering_key_idx", "jobs_ordering_active_idx", "jobs_running_idx",
           "jobs_finished_idx", "jobs_schedule_slot_idx",
           # dependencies (issue 21): partial, so a job outside a graph with no parents has no entries
           "jobs_graph_idx", "jobs_waiting_idx")

# transition -> {index: entries inserted for one job}; indexes not named get none.
# "pkey" = a new row version that is not HOT (an insert, or an update that changed an
# indexed column or a column a partial index's predicate names: state, blocked,
# finished_at, run_at, ...). An empty entry: a HOT update (no index holds what it wrote).
PINNED: dict[str, dict[str, int]] = {
    # a new row: the primary key and the two claim indexes (pending, not blocked)
    "enqueue plain": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
    # the head of its ordering key: also the key's two indexes
    "enqueue keyed head": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1,
                           "jobs_ordering_key_idx": 1, "jobs_ordering_active_idx": 1},
    # behind the head: blocked, so only the key's queue of unfinished jobs
    "enqueue keyed behind": {"jobs_pkey": 1, "jobs_ordering_key_idx": 1},
    "enqueue dedupe": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1, "jobs_dedupe_key_idx": 1},
    # pending -> running: not HOT (state is in every partial predicate); the one running
    # index (queue), which does not hold the lease (until migration 0010 two running
    # indexes held lease_expires_at: three entries per claim)
    "claim": {"jobs_pkey": 1, "jobs_running_idx": 1},
    "claim keyed": {"jobs_pkey": 1, "jobs_running_idx": 1, "jobs_ordering_key_idx": 1,
                    "jobs_ordering_active_idx": 1},
    # a renewal writes lease_expires_at and heartbeat_at, which no index holds or names:
    # HOT, no entry at all (until migration 0010: three, one per index holding the lease)
    "renew": {},
    # a progress report (progress, progress_message, progress_at, heartbeat_at): HOT too
    "progress": {},
    # running -> succeeded: not HOT; the retention index
    "complete": {"jobs_pkey": 1, "jobs_finished_idx": 1},
    # the keyed head succeeds, and its successor (blocked -> claimable) is a second
    # non-HOT row version with the claim and key indexes
    "complete keyed, next promoted": {"jobs_pkey": 2, "jobs_finished_idx": 1, "jobs_claim_idx": 1,
                                      "jobs_due_idx": 1, "jobs_ordering_key_idx": 1,
                                      "jobs_ordering_active_idx": 1},
    # running -> pending (a retry later): the claim indexes again
    "fail, retried": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
    "fail, dead": {"jobs_pkey": 1, "jobs_dead_idx": 1, "jobs_finished_idx": 1},
    "release": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
    "snooze": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
    # an expired lease back to pending
    "reap": {"jobs_pkey": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
    # dependencies (issue 21). A child waiting for its parent: blocked, so out of the claim
    # indexes, in the waiting index; its parent's has_children flag (no index holds it)
    # is a HOT update
    "enqueue dependent": {"jobs_pkey": 1, "jobs_waiting_idx": 1},
    # the parent succeeds (as a plain completion) and the trigger unblocks the child: a
    # second non-HOT row version, back in the claim indexes
    "complete, child unblocked": {"jobs_pkey": 2, "jobs_finished_idx": 1, "jobs_claim_idx": 1, "jobs_due_idx": 1},
}


def _pageinspect(conn: psycopg.Connection) -> str:
    """The schema pageinspect's functions live in, creating the extension if needed;
    skips (fails under PGWORKER_STRICT=1) when it cannot be created."""
    def installed() -> str | None:
        row = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension "
                           "WHERE extname = 'pageinspect'").fetchone()
        return row[0] if row else None

    if installed() is None:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        except psycopg.errors.UniqueViolation:  # a concurrent test run created it meanwhile
            pass
        except psycopg.Error as exc:
            require(f"the index-entry count needs the pageinspect extension (CREATE EXTENSION pageinspect "
                    f"as a superuser in the tests' database, or connect the tests as one): "
                    f"{type(exc).__name__}: {str(exc).strip()}")
    found = installed()
    if found is None:
        require("pageinspect is not installed in the tests' database")
    return found


def _entries(conn: psycopg.Connection, schema: str, ext: str) -> dict[str, int]:
    """{index name: heap TIDs in its leaf pages} for every index of ``schema``.jobs."""
    rows = conn.execute(sql.SQL("""
        SELECT c.relname,
               (SELECT coalesce(sum(coalesce(cardinality(i.tids), 1)), 0)
                FROM generate_series(1, pg_relation_size(c.oid) / current_setting('block_size')::int - 1) AS b,
                     LATERAL {ext}.bt_page_stats(c.oid::regclass::text, b::int) AS s,
                     LATERAL {ext}.bt_page_items(c.oid::regclass::text, b::int) AS i
                WHERE s.type = 'l' AND NOT (s.btpo_next <> 0 AND i.itemoffset = 1))::int
        FROM pg_index AS x JOIN pg_class AS c ON c.oid = x.indexrelid
        WHERE x.indrelid = {jobs}::regclass
    """).format(ext=sql.Identifier(ext), jobs=sql.Literal(f'"{schema}".jobs'))).fetchall()
    return {name: n for name, n in rows}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def test_each_transition_inserts_the_pinned_index_entries(app: App, conn: psycopg.Connection):
    ext = _pageinspect(conn)
    schema = app.settings.schema
    jobs = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(jobs))
    assert set(_entries(conn, schema, ext)) == set(INDEXES), "a new index on jobs: pin what each transition costs"

    measured: dict[str, dict[str, int]] = {}

    def measure(name: str, action: Callable[[], Any]) -> Any:
        before = _entries(conn, schema, ext)
        result = action()
        measured[name] = _delta(before, _entries(conn, schema, ext))
        return result

    def claim(queue: str, **kw: Any):
        [job] = app.claim(queue, limit=10, **kw)
        return job

    measure("enqueue plain", lambda: app.enqueue("t", {}, queue="plain"))
    measure("enqueue keyed head", lambda: app.enqueue("t", {}, queue="keyed", ordering_key="k"))
    measure("enqueue keyed behind", lambda: app.enqueue("t", {}, queue="keyed", ordering_key="k"))
    measure("enqueue dedupe", lambda: app.enqueue("t", {}, queue="dedupe", dedupe_key="d"))

    job = measure("claim", lambda: claim("plain"))
    measure("renew", lambda: app.renew(job))
    assert measure("progress", lambda: app.store.record_progress(conn, job.lease, 0.5, "half"))
    measure("complete", lambda: app.complete(job))

    head = measure("claim keyed", lambda: claim("keyed"))
    measure("complete keyed, next promoted", lambda: app.complete(head))

    for queue in ("retry", "dead", "release", "snooze", "reap"):
        app.enqueue("t", {}, queue=queue)
    retried, died, released, snoozed = (claim(q) for q in ("retry", "dead", "release", "snooze"))
    assert measure("fail, retried", lambda: app.fail(retried, RuntimeError("again"))) == "pending"
    assert measure("fail, dead", lambda: app.fail(died, Permanent("no"))) == "dead"
    measure("release", lambda: app.release(released))
    assert measure("snooze", lambda: app.store.snooze(conn, [snoozed.lease], [60.0])).ok

    claim("reap", lease_seconds=0.2)
    wait_until(lambda: conn.execute(sql.SQL("SELECT bool_and(lease_expires_at < now()) FROM {} "
                                            "WHERE queue = 'reap'").format(jobs)).fetchone()[0],
               timeout=30, message="the reap case's lease to expire")
    assert len(measure("reap", app.reap).requeued) == 1

    parent_id = app.enqueue("t", {}, queue="parent")
    measure("enqueue dependent", lambda: app.enqueue("t", {}, queue="child", depends_on=[parent_id]))
    parent = claim("parent")
    measure("complete, child unblocked", lambda: app.complete(parent))

    assert measured == PINNED
