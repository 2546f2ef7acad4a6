"""Queue policies enforced by the claim: pause, a global concurrency limit, a token-bucket
rate limit, priority aging; and the plans of every form of the claim on a large table."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from psycopg import sql

from pgworker import ConfigError, QueuePaused
from pgworker.store.lifecycle import NO_FLOORS
from worker import q

pytestmark = pytest.mark.integration


def test_pause_stops_claims_not_enqueues_and_is_audited(app, pg_dsn):
    app.enqueue_many([("t", i) for i in range(3)])
    row = app.pause_queue("default", actor="ops@example")
    assert row["paused_by"] == "ops@example"
    later = app.enqueue("t", "while paused")  # enqueues go on
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        result = app.store.claim_batch(c, queue="default", limit=10, owner="x", lease_seconds=60)
    assert result.paused and result.jobs == []
    assert app.pause_queue("default", actor="someone else")["paused_by"] == "ops@example"  # first pause kept
    listener = psycopg.connect(pg_dsn, autocommit=True)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(app.store.channel)))
    assert app.resume_queue("default", actor="ops@example") is True
    assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["default"]  # wakes claimers
    listener.close()
    assert app.resume_queue("default") is False
    assert later in {j.id for j in app.claim(limit=10)}
    kinds = [(e["kind"], e["actor"]) for e in app.queue_events("default")]
    assert kinds == [("resumed", "ops@example"), ("paused", "someone else"), ("paused", "ops@example")]


def test_concurrency_limit_counts_running_jobs(app):
    app.configure_queue("default", concurrency_limit=3)
    app.enqueue_many([("t", i) for i in range(10)])
    first = app.claim(limit=10)
    assert len(first) == 3
    assert app.claim(limit=10) == []
    app.complete(first[0])
    assert len(app.claim(limit=10)) == 1
    app.configure_queue("default", concurrency_limit=None)
    assert len(app.claim(limit=10)) == 6


def test_concurrency_limit_holds_under_concurrent_claimers(app, pg_dsn):
    """12 threads claim batches on a queue limited to 4 running jobs while a sampler
    counts the running rows: the count never passes the limit, and reaches it."""
    schema = app.settings.schema
    app.configure_queue("default", concurrency_limit=4)
    app.enqueue_many([("t", i) for i in range(400)])
    samples: list[int] = []
    done = threading.Event()

    def sampler():
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            while not done.is_set():
                samples.append(q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'running'")[0][0])

    def claimer(n):
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            empty = 0
            while empty < 30:
                jobs = app.store.claim(c, queue="default", limit=3, owner=f"c{n}", lease_seconds=60)
                if not jobs:
                    empty += 1
                    time.sleep(0.005)
                    continue
                empty = 0
                time.sleep(0.002)
                assert app.store.complete(c, [j.lease for j in jobs]).ok

    s = threading.Thread(target=sampler)
    s.start()
    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(12)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    done.set()
    s.join()
    assert q(psycopg.connect(pg_dsn), schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'") == [(400,)]
    assert max(samples) <= 4 and 4 in samples


@pytest.mark.parametrize("limits", [
    {"rate_limit": 5, "burst": float("nan")}, {"rate_limit": 5, "burst": 1e12}, {"rate_limit": float("inf")},
    {"rate_limit": 1e308}, {"rate_limit": float("nan")}, {"concurrency_limit": 2**40}, {"aging": float("nan")},
    {"aging": float("inf")}])
def test_queue_limits_that_would_break_every_claim_are_refused(app, limits):
    """NaN, infinity or a burst past an integer once made every claim of the queue fail
    (integer out of range in job_claim), stopping the queue until an operator fixed the row."""
    with pytest.raises(ConfigError, match=r"(--rate|--burst|--concurrency|--aging)"):
        app.configure_queue("default", **limits)
    app.enqueue("t", 1)
    with psycopg.connect(app.settings.dsn, autocommit=True) as c:  # the queue still claims
        assert len(app.store.claim_batch(c, queue="default", limit=10, owner="x", lease_seconds=60).jobs) == 1


def test_a_burst_alone_says_the_rate_goes_with_it_even_when_the_queue_has_one(app):
    """It said "burst without a rate limit" of a queue that had a rate."""
    app.configure_queue("default", rate_limit=20, burst=40)
    with pytest.raises(ConfigError, match=r"give rate_limit \(CLI: --rate\) too, even if the queue already has one"):
        app.configure_queue("default", burst=5)
    assert app.configure_queue("default", rate_limit=20, burst=5)["rate_burst"] == 5


def test_rate_limit_is_a_token_bucket(app, conn):
    schema = app.settings.schema
    app.configure_queue("default", rate_limit=20, burst=5)
    app.enqueue_many([("t", i) for i in range(200)])
    with psycopg.connect(app.settings.dsn, autocommit=True) as c:
        first = app.store.claim_batch(c, queue="default", limit=100, owner="x", lease_seconds=60)
        assert len(first.jobs) == 5  # the burst
        assert first.retry_after_seconds is not None and 0 < first.retry_after_seconds <= 0.05 + 1e-9
        claimed = list(first.jobs)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            claimed += app.store.claim_batch(c, queue="default", limit=100, owner="x", lease_seconds=60).jobs
            time.sleep(0.01)
    # the bucket's invariant, on the database clock the bucket itself uses: in any window
    # [t_i, t_j] at most burst + rate * (t_j - t_i) claims
    times = sorted(r[0] for r in q(conn, schema, "SELECT extract(epoch FROM started_at)::float8 FROM {s}.jobs "
                                                 "WHERE started_at IS NOT NULL"))
    assert len(times) == len(claimed)
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= 5 + 20 * (times[j] - times[i]) + 1e-6
    assert len(claimed) > 5  # the bucket refilled


def test_limited_claim_called_unlocked_goes_through_the_lock(app, pg_dsn):
    app.configure_queue("default", concurrency_limit=2)
    app.enqueue_many([("t", i) for i in range(5)])
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        unlocked = app.store._claim_result(c.execute(app.store.queries["job_claim"], {
            "queue": "default", "limit": 5, "owner": "x", "lease_seconds": 60, "aging_seconds": None,
            "locked": False, **NO_FLOORS}).fetchall())
        assert unlocked.limited and unlocked.allowance == 0 and unlocked.jobs == []  # refused without the lock
        result = app.store.claim_batch(c, queue="default", limit=5, owner="x", lease_seconds=60)
        assert result.limited and len(result.jobs) == 2


def test_configure_queue_validates_and_audits(app):
    with pytest.raises(ConfigError):
        app.configure_queue("default", concurrency_limit=0)
    with pytest.raises(ConfigError):
        app.configure_queue("default", rate_limit=-1)
    with pytest.raises(ConfigError):
        app.configure_queue("default", burst=3)
    row = app.configure_queue("default", rate_limit=2.5, aging=30, actor="ops")
    assert (row["rate_per_second"], row["rate_burst"], row["aging_seconds"]) == (2.5, 2.5, 30.0)
    row = app.configure_queue("default", concurrency_limit=7)
    assert (row["concurrency_limit"], row["rate_per_second"]) == (7, 2.5)  # the rest is kept
    [listed] = app.queue_settings()
    assert listed["name"] == "default" and listed["concurrency_limit"] == 7
    assert app.queue_events("default")[-1]["actor"] == "ops"


def test_delete_queue_removes_its_settings_unless_paused_and_is_audited(app):
    app.configure_queue("typo", concurrency_limit=3, rate_limit=2.0, actor="ops")
    app.pause_queue("typo", actor="ops")
    with pytest.raises(QueuePaused, match=r"queue 'typo' is paused .* by ops\): resume it first"):
        app.delete_queue("typo", actor="ops")
    assert [q["concurrency_limit"] for q in app.queue_settings()] == [3]  # nothing was changed
    app.resume_queue("typo", actor="ops")
    job = app.enqueue("t", queue="typo")
    assert app.delete_queue("typo", actor="ops") == {
        "concurrency_limit": 3, "rate_per_second": 2.0, "rate_burst": 2.0, "aging_seconds": None}
    assert app.queue_settings() == [] and app.delete_queue("typo") is None
    assert app.get_job(job)["state"] == "pending"  # jobs are untouched
    assert app.queue_events("typo")[0]["kind"] == "deleted"
    assert app.queue_usage("typo") == {"has_jobs": True, "scheduled": False, "configured": False,
                                       "has_events": True, "recently_finished": False, "in_app": False}
    assert app.queue_usage("default")["in_app"] and not app.queue_usage("nothing")["has_jobs"]


def test_a_queue_whose_jobs_just_finished_or_that_has_a_history_is_in_use(app):
    """`queue pause emails` called a real queue a typo when its jobs had just finished:
    the last finished jobs and the queue's audit trail count as use."""
    assert not any(app.queue_usage("emails").values())
    app.enqueue("t", queue="emails")
    [job] = app.claim("emails")
    assert not app.queue_usage("emails")["recently_finished"]  # running: has_jobs says it
    app.complete(job)
    usage = app.queue_usage("emails")
    assert usage["recently_finished"] and not usage["has_jobs"]
    app.cancel(app.enqueue("t", queue="reports"))
    assert app.queue_usage("reports")["recently_finished"]
    app.configure_queue("limits", concurrency_limit=1)
    app.delete_queue("limits")  # no row left, but its history says it was real
    assert app.queue_usage("limits")["has_events"] and not app.queue_usage("limits")["configured"]
    assert not any(app.queue_usage("emials").values())


def test_aging_claims_an_overdue_job_before_newer_high_priority_work(app, conn):
    schema = app.settings.schema
    low = app.enqueue("t", "low", priority=0)
    highs = app.enqueue_many([{"task": "t", "payload": i, "priority": 100} for i in range(50)])
    assert low not in {j.id for j in app.claim(limit=5)}  # within the bound, priority rules
    q(conn, schema, "UPDATE {s}.jobs SET run_at = now() - interval '10 seconds' WHERE id = %s RETURNING id", low)
    app.configure_queue("default", aging=5)
    [first, *rest] = app.claim(limit=5)
    assert first.id == low  # overdue: claimed first, ahead of the flood
    assert all(j.id in highs for j in rest)


def test_aging_from_the_worker_setting_and_the_queue_row(app, conn):
    schema = app.settings.schema
    low = app.enqueue("t", "low", priority=-5)
    app.enqueue_many([{"task": "t", "payload": i, "priority": 5} for i in range(20)])
    q(conn, schema, "UPDATE {s}.jobs SET run_at = now() - interval '1 minute' WHERE id = %s RETURNING id", low)
    with psycopg.connect(app.settings.dsn, autocommit=True) as c:
        assert app.store.claim(c, queue="default", limit=1, owner="x", lease_seconds=60)[0].id != low
        assert app.store.claim(c, queue="default", limit=1, owner="x", lease_seconds=60,
                               aging_seconds=30)[0].id == low


def _plan(conn, text, params):
    return json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + text, params).fetchone()[0])


@pytest.fixture
def big(app, conn):
    """100,000 finished jobs, 50,000 pending ones (some keyed, some blocked), analysed."""
    schema = app.settings.schema
    ident = sql.Identifier(schema)
    conn.execute(sql.SQL(
        "INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
        "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 100000)").format(ident))
    conn.execute(sql.SQL(
        "INSERT INTO {}.jobs (queue, task, payload, priority, run_at, ordering_key, blocked, dedupe_key) "
        "SELECT 'default', 't', '{{}}', i % 7, now() - (i % 500) * interval '1 second', "
        "CASE WHEN i % 10 = 0 THEN 'key' || (i % 1000) END, i % 10 = 0 AND i > 1000, 'd' || i "
        "FROM generate_series(1, 50000) AS i").format(ident))
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(ident))
    return app


CLAIM = {"queue": "default", "limit": 10, "owner": "x", "lease_seconds": 60, **NO_FLOORS}


@pytest.mark.parametrize("form", ["plain", "aging", "locked", "generic"])
def test_every_form_of_the_claim_uses_its_indexes(big, conn, form):
    app = big
    app.configure_queue("default", concurrency_limit=50 if form == "locked" else None,
                        aging=5 if form == "aging" else None)
    params = dict(CLAIM, aging_seconds=None, locked=form == "locked")
    if form == "generic":  # the plan a prepared statement settles on after five executions
        conn.execute("SET plan_cache_mode = force_generic_plan")
        params = dict(params, aging_seconds=5)
    plan = _plan(conn, app.store.queries["job_claim"], params)
    print(plan)
    assert '"Index Name": "jobs_claim_idx"' in plan
    assert '"Index Name": "jobs_due_idx"' in plan
    assert "Seq Scan" not in plan
    if form == "locked":
        assert "jobs_running_idx" in plan
    # and the real thing claims
    with psycopg.connect(app.settings.dsn, autocommit=True) as c:
        assert len(app.store.claim(c, queue="default", limit=10, owner="x", lease_seconds=60,
                                   aging_seconds=5 if form == "aging" else None)) == 10


@pytest.mark.parametrize("aging", [None, 5])
def test_the_claim_updates_by_primary_key_on_a_small_table_too(app, conn, aging):
    """On 10,000 pending rows the planner, guessing a tenth of the table from the arms'
    computed LIMIT, once chose a hash join over a sequential scan of jobs for the UPDATE:
    12 ms a claim instead of 0.3. The UPDATE must probe the primary key."""
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(10_000)])
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
    plan = _plan(conn, app.store.queries["job_claim"], dict(CLAIM, aging_seconds=aging, locked=False))
    assert "Seq Scan" not in plan
    assert '"Index Name": "jobs_pkey"' in plan


def test_head_probes_descend_the_ordering_index_past_finished_jobs_of_few_keys(app, conn):
    """Few keys, most of their jobs finished (lower ids): "ordering_key = k ORDER BY id
    LIMIT 1" made the planner walk the primary key through every finished job (a claim
    rate that fell with the history). The probes must descend jobs_ordering_key_idx."""
    schema = app.settings.schema
    ident = sql.Identifier(schema)
    app.enqueue_many([{"task": "t", "payload": i, "ordering_key": f"k{i % 8}"} for i in range(20_000)])
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(ident))  # statistics from when all were pending
    conn.execute(sql.SQL("UPDATE {}.jobs SET state = 'succeeded', blocked = false, finished_at = now() "
                         "WHERE id <= (SELECT max(id) - 800 FROM {}.jobs)").format(ident, ident))
    conn.execute(sql.SQL("UPDATE {}.jobs SET blocked = false WHERE id IN (SELECT min(id) FROM {}.jobs "
                         "WHERE state = 'pending' GROUP BY ordering_key)").format(ident, ident))
    promote = _plan(conn, app.store.queries["ordering_keys_promote"], {"keys": ["k1", "k2"], "channel": "c"})
    insert = _plan(conn, app.store.queries["job_insert"], {
        "queue": "default", "task": "t", "payload": "{}", "priority": 0, "run_at": None, "delay": 0,
        "max_attempts": 5, "dedupe_key": None, "dedupe_window": None, "ordering_key": "k1",
        "dead_blocks_key": True, "trace_context": None, "channel": "c", "notify_payload": "default"})
    for plan in (promote, insert):
        assert '"Index Name": "jobs_ordering_key_idx"' in plan
        assert "Seq Scan" not in plan
    assert '"Filter": "((ordering_key' not in promote  # no scan that filters rows by key


def test_ordering_and_dedupe_statements_use_their_indexes(big, conn):
    app = big
    promote = _plan(conn, app.store.queries["ordering_keys_promote"], {"keys": ["key10", "key20"], "channel": "c"})
    assert "jobs_ordering_key_idx" in promote and "jobs_ordering_active_idx" in promote
    assert not _seq_scans_of_jobs(promote), promote
    insert = _plan(conn, app.store.queries["job_insert"], {
        "queue": "default", "task": "t", "payload": "{}", "priority": 0, "run_at": None, "delay": 0,
        "max_attempts": 5, "dedupe_key": "d1", "dedupe_window": None, "ordering_key": "key10",
        "dead_blocks_key": True, "trace_context": None, "channel": "c", "notify_payload": "default"})
    assert "jobs_ordering_key_idx" in insert and not _seq_scans_of_jobs(insert), insert
    holders = _plan(conn, app.store.queries["dedupe_holders"], {"keys": ["d1", "d2"]})
    assert "jobs_dedupe_key_idx" in holders and "Seq Scan" not in holders
    stats = _plan(conn, app.store.queries["queue_stats"], {"queues": ["default"]})
    assert "Seq Scan" not in stats
    usage = json.loads(_plan(conn, app.store.queries["queue_usage"], {"queue": "nothing", "recent": 1000}))
    scanned = [n.get("Index Name") or n["Node Type"] for n in _nodes(usage) if n.get("Relation Name") == "jobs"]
    assert len(scanned) == 5 and all(name.endswith("_idx") for name in scanned), scanned  # no Seq Scan of jobs
    # the finished history (100,000 rows here) is read from its newest end, a bounded walk
    walks = [n for n in _nodes(usage) if n.get("Index Name") == "jobs_finished_idx"]
    assert len(walks) == 2 and all(n["Scan Direction"] == "Backward" for n in walks), walks


def _seq_scans_of_jobs(plan_json):
    """The sequential scans of jobs in a plan (a JSON plan has no "Seq Scan on jobs" text:
    the node type and the relation are separate keys)."""
    return [n for n in _nodes(json.loads(plan_json))
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"]


def _nodes(plan):
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for item in plan:
            yield from _nodes(item)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            if isinstance(value, (list, dict)):
                yield from _nodes(value)
