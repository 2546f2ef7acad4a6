"""Concurrent claimers, and the plans the claim and the statistics rely on."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg import sql

from pgworker import App
from pgworker.jobs import Lease
from pgworker.store.lifecycle import NO_FLOORS

pytestmark = pytest.mark.integration


def test_eight_claimers_claim_each_of_10000_jobs_exactly_once(app, pg_dsn):
    n, claimers = 10_000, 8
    app.enqueue_many([("t", i) for i in range(n)])
    seen: list[list[tuple[int, int]]] = [[] for _ in range(claimers)]
    start = threading.Barrier(claimers)

    def claimer(i: int) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            start.wait()
            while True:
                jobs = app.store.claim(conn, queue="default", limit=7, owner=f"c{i}", lease_seconds=60)
                if not jobs:
                    return
                seen[i].extend((j.id, j.lease_token) for j in jobs)
                report = app.store.complete(conn, [j.lease for j in jobs])
                assert report.ok

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    pairs = [p for s in seen for p in s]
    assert len(pairs) == n
    assert len(set(pairs)) == n  # no (job, lease token) pair handed out twice
    assert len({job for job, _ in pairs}) == n  # every job claimed once
    assert sum(1 for s in seen if s) > 1  # the work really was shared
    with psycopg.connect(pg_dsn) as conn:
        states = dict(conn.execute(sql.SQL("SELECT state::text, count(*) FROM {}.jobs GROUP BY 1")
                                   .format(sql.Identifier(app.settings.schema))).fetchall())
    assert states == {"succeeded": n}


def _plan(conn, app, name, params):
    rows = conn.execute("EXPLAIN (FORMAT JSON) " + app.store.queries[name], params).fetchone()[0]
    return json.dumps(rows)


def test_claim_uses_the_partial_index_with_many_finished_rows(app, conn):
    schema = app.settings.schema
    ident = sql.Identifier(schema)
    conn.execute(sql.SQL(
        "INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
        "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 100000)").format(ident))
    app.enqueue_many([("t", i) for i in range(200)])
    # and some running leases, as in production (the reaper's index then has something to order)
    conn.execute(sql.SQL(
        "INSERT INTO {}.jobs (queue, task, payload, state, lease_owner, lease_expires_at) "
        "SELECT 'default', 't', '{{}}', 'running', 'w', now() + (i % 60) * interval '1 second' "
        "FROM generate_series(1, 2000) AS i").format(ident))
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(ident))
    plan = _plan(conn, app, "job_claim", {"queue": "default", "limit": 10, "owner": "x", "lease_seconds": 60,
                                          "aging_seconds": None, "locked": False, **NO_FLOORS})
    assert '"Index Name": "jobs_claim_idx"' in plan
    assert "Seq Scan" not in plan
    stats = _plan(conn, app, "queue_stats", {"queues": ["default"]})
    assert "Seq Scan" not in stats
    for after in (None, datetime.now(timezone.utc) - timedelta(seconds=30)):  # a pass's first batch, a later one
        # the running set on jobs_running_idx, the expiry read from the rows (no index holds it)
        reap = _plan(conn, app, "jobs_reap_candidates", {"limit": 10, "after_at": after, "after_id": 5})
        assert "jobs_running_idx" in reap and "Seq Scan" not in reap
    # the pod's renewal finds each of its leases by primary key (never a scan of the running set)
    running = [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {}.jobs WHERE state = 'running' LIMIT 100")
                                          .format(ident)).fetchall()]
    renew = _plan(conn, app, "job_renew_skip_locked", {"ids": running, "tokens": [0] * len(running),
                                                        "lease_seconds": 60})
    assert '"Index Name": "jobs_pkey"' in renew and "Seq Scan" not in renew
    assert "jobs_running_idx" not in renew


def test_one_long_held_job_does_not_block_the_others(app, pg_dsn):
    """Seed test 7: a row locked for a long time is skipped, everything else flows."""
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(50)])
    with psycopg.connect(pg_dsn) as holder:  # a transaction that keeps one row locked
        held = holder.execute(sql.SQL("SELECT id FROM {}.jobs ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE")
                              .format(sql.Identifier(schema))).fetchone()[0]
        jobs = app.claim(limit=100)
        assert len(jobs) == 49 and held not in {j.id for j in jobs}
        holder.rollback()
    assert [j.id for j in app.claim(limit=100)] == [held]


def test_priority_then_due_time_then_id(app):
    low = app.enqueue("t", "low")
    high = app.enqueue("t", "high", priority=10)
    later = app.enqueue("t", "later", priority=10, delay=3600)
    assert [j.id for j in app.claim(limit=10)] == [high, low]
    assert later not in {j.id for j in app.claim(limit=10)}


def test_priorities_are_taken_highest_first_across_many_priorities(app):
    """The claim walks the queue's priorities one at a time (claim.sql, ranked): the
    batch still comes out in (priority DESC, run_at, id) order, across gaps, negative
    priorities and priorities whose only jobs are scheduled later."""
    later = app.enqueue("t", "later", priority=7, delay=3600)
    p5 = app.enqueue("t", "p5", priority=5)
    p3 = app.enqueue("t", "p3", priority=3)
    p3_old = app.enqueue("t", "p3 old", priority=3, run_at=datetime.now(timezone.utc) - timedelta(minutes=1))
    p0 = app.enqueue("t", "p0")
    neg = app.enqueue("t", "neg", priority=-4)
    neg_later = app.enqueue("t", "neg later", priority=-4, delay=3600)
    assert [j.id for j in app.claim(limit=3)] == [p5, p3_old, p3]
    assert [j.id for j in app.claim(limit=10)] == [p0, neg]
    assert app.claim(limit=10) == []
    assert {later, neg_later}.isdisjoint({p5, p3_old, p3, p0, neg})


def test_priority_order_holds_past_the_priorities_walked_one_at_a_time(app):
    """The claim walks 8 priorities one at a time, then scans the lower ones in order
    (claim.sql, ranked_rest): 12 priorities with only later jobs above due jobs at 3
    priorities, the batch crossing that boundary in (priority DESC, run_at, id) order."""
    for p in range(100, 112):
        app.enqueue("t", f"later {p}", priority=p, delay=3600)
    due = [app.enqueue("t", f"p{p}.{i}", priority=p) for p in (99, 50, -7) for i in range(3)]
    assert [j.id for j in app.claim(limit=4)] == due[:4]
    assert [j.id for j in app.claim(limit=10)] == due[4:]


def _claim_scan_buffers(conn, app) -> int:
    """Shared buffers (hit + read) a claim of 10 jobs touched in its scans of the jobs
    table (every scan node, whichever index the planner picked), measured by EXPLAIN
    (ANALYZE, BUFFERS) in a transaction rolled back: pages, not seconds."""
    params = {"queue": "default", "limit": 10, "owner": "x", "lease_seconds": 60,
              "aging_seconds": None, "locked": False, **NO_FLOORS}
    with conn.transaction(force_rollback=True):
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + app.store.queries["job_claim"],
                                params).fetchall()

    def nodes(node):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)
    # The scans that choose the candidates (every index but the primary key, which the
    # UPDATE's own row lookups use).
    scans = [n for n in nodes(plan[0]["Plan"]) if "Scan" in n["Node Type"] and n.get("Relation Name") == "jobs"
             and n.get("Index Name") != "jobs_pkey"]
    assert scans, plan
    return sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in scans)


def _claim_buffers_without_and_beside(app, conn, *, due: str, later: str) -> tuple[int, int]:
    """The claim's scan buffers with the due jobs alone, then beside jobs scheduled
    later. ``due`` and ``later``: the rest of an INSERT ... SELECT after the queue, task
    and payload: "<priority>, <run_at> FROM generate_series(...)"."""
    ident = sql.Identifier(app.settings.schema)
    measured = []
    for rows in (due, later):
        conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, priority, run_at) "
                             "SELECT 'default', 't', '{{}}', " + rows).format(ident))
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(ident))
        measured.append(_claim_scan_buffers(conn, app))
    return measured[0], measured[1]


def test_jobs_scheduled_later_at_a_higher_priority_are_not_read_by_the_claim(app, conn):
    """The scheduled-later trap: 30,000 jobs due in an hour at priority 10, and 3,000 due
    jobs at priority 0 (a share at which the planner prefers jobs_claim_idx's order to a
    sort, as at production sizes). A claim ordered by priority first read every one of the
    30,000 index entries (over 100 pages) before the first due job; it now reads about the
    same few pages as without them (a deeper index adds a page per descent)."""
    without, beside = _claim_buffers_without_and_beside(
        app, conn, due="0, now() FROM generate_series(1, 3000)",
        later="10, now() + interval '1 hour' FROM generate_series(1, 30000)")
    assert beside <= without + 20, (without, beside)  # before: 3 pages, then 329
    assert [j.priority for j in app.claim(limit=10)] == [0] * 10


def test_thousands_of_distinct_priorities_cost_the_claim_a_bounded_walk(app, conn):
    """5,000 distinct priorities, each with one job scheduled later, above 20 due jobs:
    walking every priority one at a time read about 20,000 pages; the walk stops after 8
    and the ordered scan takes the rest, a few dozen pages more than the due jobs alone."""
    without, beside = _claim_buffers_without_and_beside(
        app, conn, due="-100, now() FROM generate_series(1, 20)",
        later="g, now() + interval '1 hour' FROM generate_series(1, 5000) AS g")
    assert beside <= without + 150, (without, beside)  # uncapped walk: 29 pages, then 20,060
    assert [j.priority for j in app.claim(limit=10)] == [-100] * 10


def test_claim_is_per_queue(app):
    a = app.enqueue("t", queue="a")
    b = app.enqueue("t", queue="b")
    assert [j.id for j in app.claim("b", limit=5)] == [b]
    assert [j.id for j in app.claim("a", limit=5)] == [a]


def test_fenced_batch_with_unknown_ids(app, conn):
    report = app.store.complete(conn, [Lease(424242, 1)])
    assert report.refused == (424242,)


def test_enqueue_with_a_schema_that_needs_quoting(pg_dsn):
    schema = 'Weird "schema"; DROP TABLE x; --'
    app = App(settings=App(pg_dsn).settings.replace(schema=schema, metrics_port=0))
    try:
        app.migrate()
        job_id = app.enqueue("t", {"a": 1})
        [job] = app.claim()
        assert job.id == job_id
        app.complete(job)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        app.close()
